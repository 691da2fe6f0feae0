"""Waiting data moved between siblings' pools (orchestrator/ledger/requeue.py): only whole
segments that have arrived and that no batch holds move, the newest first, under the
bytes asked for; a moved segment keeps its id and says where it was first queued."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from orchestrator.ledger import segments
from orchestrator.ledger.requeue import move_waiting
from orchestrator.models import Segment
from tests.orchestrator.runs import pending_run, segment_row

pytestmark = pytest.mark.django_db


def at(node: str) -> set[str]:
    return set(Segment.objects.filter(node=node).values_list("pk", flat=True))


def test_the_newest_waiting_segments_move_under_the_bytes_asked_for() -> None:
    run = pending_run("reference")
    now = timezone.now()
    for n in range(5):  # s0 oldest .. s4 newest, 100 bytes each
        segment_row(
            run,
            f"s{n}",
            node="task2",
            upstream="source",
            size=100,
            chunk=n,
            available_at=now - dt.timedelta(seconds=10 - n),
        )

    moved = move_waiting(run.pk, "task2", "task1", 250)

    assert moved == 200  # whole segments only: a third would cross 250
    assert at("task1") == {"s3", "s4"} and at("task2") == {"s0", "s1", "s2"}
    assert set(Segment.objects.filter(node="task1").values_list("migrated_from", flat=True)) == {
        "task2"
    }


def test_a_claimed_segment_a_marker_or_one_still_on_its_link_never_moves() -> None:
    run = pending_run("reference")
    segment_row(run, "held", node="task2", upstream="source", size=10, chunk=0)
    segments.claim_batch(run.pk, "task2", "w2", max_segments=1, max_bytes=1, lease_s=60)
    segment_row(run, "mark", node="task2", upstream="source", size=0, chunk=1, marker=True)
    later = timezone.now() + dt.timedelta(minutes=5)
    segment_row(
        run, "coming", node="task2", upstream="source", size=10, chunk=2, available_at=later
    )

    assert move_waiting(run.pk, "task2", "task1", 10_000) == 0
    assert at("task2") == {"held", "mark", "coming"} and at("task1") == set()


def test_a_segment_moved_twice_still_names_the_node_it_was_first_queued_at() -> None:
    run = pending_run("reference")
    segment_row(run, "s0", node="task2", upstream="source", size=10)

    assert move_waiting(run.pk, "task2", "task1", 10) == 10
    assert move_waiting(run.pk, "task1", "task3", 10) == 10

    assert Segment.objects.get(pk="s0").node == "task3"
    assert Segment.objects.get(pk="s0").migrated_from == "task2"


def test_a_moved_segment_is_claimed_by_its_new_node_only() -> None:
    run = pending_run("reference")
    segment_row(run, "s0", node="task2", upstream="source", size=10)
    move_waiting(run.pk, "task2", "task1", 10)

    old = segments.claim_batch(run.pk, "task2", "w2", max_segments=8, max_bytes=100, lease_s=60)
    new = segments.claim_batch(run.pk, "task1", "w1", max_segments=8, max_bytes=100, lease_s=60)

    assert not old and [s.pk for s in new] == ["s0"]
