"""What each node sent on over the driver's last interval: the bytes its completed
batches inserted downstream, from which the driver measures its reduction."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from orchestrator.ledger import segments
from orchestrator.models import Run, Segment
from tests.orchestrator.runs import pending_run, segment_row

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def output(run: Run, seg_id: str, upstream: str, size: int, *, marker: bool = False) -> None:
    segment_row(run, seg_id, node="output", upstream=upstream, size=size, marker=marker)


def test_each_node_s_outputs_since_the_window_began_are_summed() -> None:
    run = pending_run("reference")
    before = timezone.now()
    output(run, "a", "task1", 100)
    output(run, "b", "task1", 20)
    output(run, "c", "task3", 7)

    assert segments.sent_bytes(run.pk, before) == {"task1": 120, "task3": 7}


def test_older_outputs_markers_and_other_runs_are_left_out() -> None:
    run, other = pending_run("reference"), pending_run("reference")
    output(run, "old", "task1", 100)
    Segment.objects.filter(pk="old").update(created_at=timezone.now() - dt.timedelta(minutes=1))
    since = timezone.now() - dt.timedelta(seconds=1)
    output(run, "marker", "task1", 5, marker=True)
    output(other, "elsewhere", "task1", 9)

    assert segments.sent_bytes(run.pk, since) == {}
