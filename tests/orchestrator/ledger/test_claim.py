"""A batch's claim: arrived segments in order, up to a count, until they hold the
batch's bytes; the segment that crosses the bound is taken too (ADR 11). On the real
PostgreSQL."""

from __future__ import annotations

import pytest

from orchestrator.ledger.segments import claim_batch
from orchestrator.models import Segment
from tests.orchestrator.runs import pending_run, segment_row

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _claimed(sizes: list[int], *, max_segments: int = 64, max_bytes: int) -> list[int]:
    run = pending_run("reference")
    for n, size in enumerate(sizes):
        segment_row(run, f"r{run.pk}.s{n}", node="task1", upstream="source", size=size, chunk=n)
    claim = claim_batch(
        run.pk, "task1", "w", max_segments=max_segments, max_bytes=max_bytes, lease_s=60
    )
    assert Segment.objects.filter(run=run, state=Segment.State.CLAIMED).count() == len(claim)
    return [s.bytes for s in claim.segments]


def test_a_batch_takes_segments_until_it_holds_its_bytes_the_crossing_one_included() -> None:
    # 64 files of a little over 8 MB against 512 MB: one batch, not 63 and a straggler.
    assert _claimed([3, 3, 3, 3], max_bytes=7) == [3, 3, 3]
    assert _claimed([3, 3, 3, 3], max_bytes=6) == [3, 3]
    assert _claimed([8 * 2**20 + 100] * 64, max_bytes=512 * 2**20) == [8 * 2**20 + 100] * 64


def test_a_segment_larger_than_the_bound_moves_alone() -> None:
    assert _claimed([10, 1], max_bytes=4) == [10]


def test_the_count_bounds_a_batch_whatever_its_bytes() -> None:
    assert _claimed([1] * 10, max_segments=4, max_bytes=1 << 30) == [1, 1, 1, 1]
