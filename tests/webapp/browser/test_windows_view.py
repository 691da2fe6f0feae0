"""A windowed run's page in real Chromium: the windows card shows the watermark, the late
records and the open windows with how far the watermark is through them; the results
card each window's rows, the latest first; each node shows how far behind the source it
is in event time. The run's rows are written as its sink would have left them; no
workers needed."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from orchestrator import service
from orchestrator.ledger.groups import digest
from orchestrator.models import ResultGroup, Run, Segment
from orchestrator.run.publisher import forget_snapshot, keep_snapshot
from tests.webapp.browser.test_console import login, shoot
from tests.webapp.console.factories import make_user, reference
from webapp.console.topology_io import export_document

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
]

US = 1_000_000
T0 = 1_790_000_000 * US  # 2026-09-21T14:13:20Z


def windowed_run(tmp_path: Path) -> Run:
    pipeline = reference()
    doc = export_document(pipeline)
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {**(node.get("params") or {}), "window_s": 10, "event_time": "ts"}
    return service.create_run(
        topology=doc,
        policy=pipeline.effective_policy_values(),
        pipeline_id=pipeline.pk,
        source=service.LandingSpec(folder=str(tmp_path)),
    )


def test_the_windows_card_and_each_nodes_event_time_lag(
    asgi_server, chromium, artifacts, tmp_path: Path
) -> None:
    # Given a windowed run whose sink closed two windows and holds a third open, 25 s of
    # event time read by the source, task1 holding data up to 22 s, 7 records late
    run = windowed_run(tmp_path)
    now = timezone.now()
    for start, closed in ((0, True), (10, True), (20, False)):
        for key, count in (("JFK", 40 + start), ("LGA", 3)):
            total = str(Decimal("12.5") * count)
            values = {"count": count, "sum": total, "min": "1", "max": "20"}
            ResultGroup.objects.create(
                run=run,
                digest=digest([key], T0 + start * US),
                group=[key],
                start_us=T0 + start * US,
                end_us=T0 + (start + 10) * US,
                records=count,
                closed_at=now if closed else None,
                # As the sink leaves them: a closed window keeps its measures' values,
                # an open one their states.
                finished={**values, "avg": "12.5", "distinct_users": 1} if closed else None,
                states={}
                if closed
                else {
                    **values,
                    "avg": {"sum": total, "count": count},
                    "distinct_users": ["u1"],
                },
            )
    Run.objects.filter(pk=run.pk).update(
        source_position={"chunk": 9, "high_us": T0 + 25 * US},
        windows_closed={
            "chunk": 8,
            "high_us": T0 + 21 * US,
            "closed_us": T0 + 20 * US,
            "windows": 2,
        },
    )
    Segment.objects.create(
        id=f"r{run.pk}.c0000001",
        run=run,
        chunk=1,
        origin_file=0,
        origin_offset=0,
        origin_length=10,
        node="task1",
        path="-",
        bytes=10,
        state="queued",
        available_at=now,
        high_us=T0 + 22 * US,
        late=7,
    )
    late = Path(settings.DATA_DIR) / "runs" / str(run.pk) / "quarantine" / "late"
    late.mkdir(parents=True)
    (late / f"r{run.pk}.c0000001.jsonl").write_text(
        '{"key":"JFK","value":"3","user":"u1","ts":"<b>1790000001</b>"}\n'
    )
    keep_snapshot(run.pk, service.snapshot(run.pk))
    make_user("vera", "viewer")
    page = login(chromium, asgi_server, "vera")
    try:
        # When a viewer opens its page
        page.goto(f"{asgi_server.url}/runs/{run.pk}/")
        page.wait_for_selector('#windows-card[data-closed="2"]')
        # Then the card says where the watermark is, what closed, what came late
        marks = page.text_content("#windows-marks") or ""
        assert "watermark 2026-09-21T14:13:40Z" in marks
        assert "2 closed · 7 late (quarantined)" in marks
        assert "4.0 s behind the source" in marks
        assert page.text_content("#windows-stamp") == "10 s windows on ts, lateness 0 s"
        # ...lists the late records as text (markup in data stays text)
        page.click("#windows-late summary")
        assert page.locator("#windows-late-list li").all_text_contents() == [
            '{"key":"JFK","value":"3","user":"u1","ts":"<b>1790000001</b>"}'
        ]
        assert page.locator("#windows-late-list b").count() == 0
        # ...the open window, the watermark 10% through it (21 s - 0 lateness, of 20-30)
        open_rows = page.locator("#windows-open tbody tr")
        assert open_rows.count() == 1
        assert open_rows.first.locator("td").all_text_contents() == [
            "2026-09-21 14:13:40\u201314:13:50",
            "2",
            "63",
            "10%",
        ]
        # ...the results, each row with its window, the latest window first, in each the
        # key with the most records first, the measures by their names
        page.wait_for_selector("#results tbody tr")
        head = page.locator("#results thead th").all_text_contents()
        assert head == [
            "window_start",
            "window_end",
            "key",
            "count",
            "sum",
            "min",
            "max",
            "avg",
            "distinct_users",
        ]
        rows = page.locator("#results tbody tr")
        assert rows.count() == 6
        first = rows.first.locator("td").all_text_contents()
        assert first[:4] == ["2026-09-21T14:13:40Z", "2026-09-21T14:13:50Z", "JFK", "60"]
        assert first[-2:] == ["12.50", "1"]
        # ...and task1 is 3 s behind the source in event time, on its bar; task2, with
        # nothing waiting, is caught up
        page.wait_for_selector('[data-node="task1"][data-event-lag="3.0"]')
        assert "3.0 s behind" in (page.text_content('[data-node="task1"] .level-text') or "")
        assert page.get_attribute('[data-node="task2"]', "data-event-lag") == "0.0"
        assert "behind" not in (page.text_content('[data-node="task2"] .level-text') or "")
        shoot(page, artifacts, "run-windows")
        assert page.js_errors == []
    finally:
        forget_snapshot(run.pk)
        page.context.close()
