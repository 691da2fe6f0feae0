"""Grouped measures over event-time windows in the ledger: a (window, group) row merges
every batch's partial until its window closes; closing writes its finished measures to
the sink once, keeps them on the row and drops the states (a distinct count's set
among them), so a closed window shows what it showed open, and refuses more data."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.db import transaction
from django.test import override_settings

from orchestrator.ledger import groups as group_ledger
from orchestrator.ledger import windows as window_ledger
from orchestrator.models import ResultGroup, Run
from orchestrator.sink.layout import grouped_layout
from orchestrator.sink.targets import sink_of
from sparkjobs.event_time import WindowSpec
from sparkjobs.merge import GroupPartial
from tests.orchestrator.ledger.flights import GROUPING
from tests.orchestrator.ledger.flights import partial as carrier_partial
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = 60_000_000
SPEC = WindowSpec(field="t", size_us=MINUTE, slide_us=MINUTE, lateness_us=0)


def fold(run: Run, partials: list[GroupPartial], closed_us: int | None = None) -> None:
    """A sink batch's fold, in the transaction the sink batch holds."""
    with transaction.atomic():
        group_ledger.fold(run.pk, GROUPING, partials, windows=SPEC, closed_us=closed_us)


def partial(window: int, carrier: str, flights: int, total: str, tails: list[str]) -> GroupPartial:
    """A batch's partial of one carrier's flights in ``window``."""
    return carrier_partial(carrier, flights, total, tails, window=window)


def test_a_window_s_groups_merge_until_it_closes_then_are_written_once_and_kept(
    tmp_path: Path,
) -> None:
    run = pending_run("reference")
    # Given batches' partials of two windows, one group's in two batches
    fold(run, [partial(0, "UA", 2, "1.5", ["N1", "N2"])])
    fold(run, [partial(0, "UA", 1, "-0.5", ["N2", "N3"]), partial(MINUTE, "AA", 4, "8", ["N9"])])
    shown_open = group_ledger.group_rows(run, GROUPING, windowed=True)
    assert shown_open == [
        {
            "window_start": "1970-01-01T00:00:00Z",
            "window_end": "1970-01-01T00:01:00Z",
            "carrier": "UA",
            "flights": 3,
            "total": 1.0,
            "tails": 3,
        },
        {
            "window_start": "1970-01-01T00:01:00Z",
            "window_end": "1970-01-01T00:02:00Z",
            "carrier": "AA",
            "flights": 4,
            "total": 8.0,
            "tails": 1,
        },
    ]
    # When the input ends: every window closes into a Parquet sink
    layout = grouped_layout(GROUPING, {})
    with override_settings(BPCONSOLE_SINK_ROOT=tmp_path):
        sink = sink_of({"sink": "parquet", "path": "out"}, layout)
        closed = window_ledger.advance(run.pk, SPEC, sink, grouping=GROUPING, final=True)
    # Then each window's file holds its groups' finished measures
    assert closed == 2
    first = pq.read_table(tmp_path / "out/window-0.parquet").to_pylist()
    assert [(r["carrier"], r["flights"], str(r["total"]), r["tails"]) for r in first] == [
        ("UA", 3, "1.0000000000", 3)
    ]
    assert (tmp_path / f"out/window-{MINUTE}.parquet").exists()
    # ...the rows show what they showed open, their states (the tails' set) dropped
    assert group_ledger.group_rows(run, GROUPING, windowed=True) == shown_open
    rows = ResultGroup.objects.filter(run=run)
    assert all(r.closed_at is not None and r.states == {} for r in rows)
    assert Run.objects.get(pk=run.pk).windows_closed["windows"] == 2


def test_a_partial_for_a_closed_window_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    run = pending_run("reference")
    fold(run, [partial(0, "UA", 2, "1.5", ["N1"])])
    with override_settings(BPCONSOLE_SINK_ROOT=tmp_path):
        sink = sink_of({"sink": "parquet", "path": "out"}, grouped_layout(GROUPING, {}))
        window_ledger.advance(run.pk, SPEC, sink, grouping=GROUPING, final=True)
    before = group_ledger.group_rows(run, GROUPING, windowed=True)
    closed_us = window_ledger.SinkWatermark.of(Run.objects.get(pk=run.pk)).closed_us
    assert closed_us is not None and closed_us >= MINUTE

    with pytest.raises(group_ledger.ClosedWindowError, match="already closed"):
        late = [partial(0, "UA", 1, "9", ["N7"]), partial(5 * MINUTE, "UA", 1, "9", ["N7"])]
        fold(run, late, closed_us=closed_us)
    assert group_ledger.group_rows(run, GROUPING, windowed=True) == before
