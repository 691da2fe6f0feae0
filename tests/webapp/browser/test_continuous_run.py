"""A continuous run's page in real Chromium: the source node shows what waits outside the
run and the header how far the results are exact. The run's driver is stood in for by
the snapshot it would keep for late viewers (no workers needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import service
from orchestrator.run.publisher import forget_snapshot, keep_snapshot
from tests.webapp.browser.test_console import login, shoot
from tests.webapp.console.factories import make_user, reference
from webapp.console.topology_io import export_document

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
]


def test_the_source_node_shows_the_lag_and_the_header_where_results_are_exact(
    asgi_server, chromium, artifacts, tmp_path: Path
) -> None:
    # Given a landing-folder run whose driver measured 12 files (3.1 MB) waiting
    pipeline = reference()
    run = service.create_run(
        topology=export_document(pipeline),
        policy=pipeline.effective_policy_values(),
        pipeline_id=pipeline.pk,
        source=service.LandingSpec(folder=str(tmp_path)),
    )
    snap = service.snapshot(run.pk)
    lag = {"entries": 12, "bytes": 3_250_586, "age_s": 2.4}
    keep_snapshot(run.pk, {**snap, "source": {**snap["source"], "lag": lag}})
    make_user("vera", "viewer")
    page = login(chromium, asgi_server, "vera")
    try:
        # When a viewer opens its page
        page.goto(f"{asgi_server.url}/runs/{run.pk}/")
        # Then the source node and the header say what waits, and the header what it
        # reads and how far its results are exact
        waiting = "waiting: 12 files, 3.10 MB, oldest 2.4 s"
        page.wait_for_selector(f'[data-node="source"][data-lag="{waiting}"]')
        assert waiting in (page.text_content('[data-node="source"]') or "")
        assert page.text_content("#run-lag") == waiting
        assert page.text_content("#run-exact") == "exact up to nothing merged yet"
        assert page.text_content("#run-source") == f"{tmp_path}/*.jsonl"
        assert page.text_content("#btn-stop") == "Stop: finish what was taken in"
        shoot(page, artifacts, "run-continuous-source")
        assert page.js_errors == []
    finally:
        forget_snapshot(run.pk)
        page.context.close()
