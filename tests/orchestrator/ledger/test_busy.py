"""A completed batch's busy time, bytes and records, as the ledger gives them to the
capacity meter (orchestrator/ledger/busy.py): one sample per lease owner."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from orchestrator.ledger import busy, segments
from orchestrator.models import Segment
from tests.orchestrator.runs import pending_run, queue_segments

pytestmark = pytest.mark.django_db


def test_a_batch_s_records_are_what_its_operator_counted_in_each_input() -> None:
    # Given three segments queued at task1, claimed by one worker
    run = pending_run("reference")
    ids = queue_segments(run, ["/nowhere/a", "/nowhere/b", "/nowhere/c"])
    batch = segments.claim_batch(
        run.pk, "task1", "w1", max_segments=8, max_bytes=1 << 30, lease_s=60
    ).segments
    assert sorted(s.pk for s in batch) == sorted(ids)
    # When it completes them having counted 10, 0 and 32 records
    counted = dict(zip(ids, (10, 0, 32), strict=True))
    segments.complete_batch(run.pk, "w1", batch, [], {}, records=counted)

    # Then each segment holds its count, and the batch's sample their sum
    assert dict(Segment.objects.filter(pk__in=ids).values_list("pk", "records")) == counted
    (sample,) = busy.completed_since(run.pk, None).batches
    assert sample.nodes == ("task1",) and sample.records == 42.0
    assert sample.bytes == 3.0 and sample.busy_s >= 0


def test_a_lost_lease_completes_nothing_and_counts_nothing() -> None:
    run = pending_run("reference")
    ids = queue_segments(run, ["/nowhere/a", "/nowhere/b"])
    batch = segments.claim_batch(
        run.pk, "task1", "w1", max_segments=8, max_bytes=1 << 30, lease_s=60
    ).segments
    Segment.objects.filter(pk=ids[0]).update(lease_owner="w2")  # taken over meanwhile

    with pytest.raises(segments.LeaseLostError):
        segments.complete_batch(run.pk, "w1", batch, [], {}, records=dict.fromkeys(ids, 5))

    assert set(Segment.objects.filter(pk__in=ids).values_list("state", "records")) == {
        ("claimed", 0)
    }


def test_a_running_batch_is_one_sample_of_the_seconds_it_has_run_so_far() -> None:
    run = pending_run("reference")
    ids = queue_segments(run, ["/nowhere/a", "/nowhere/b"])
    segments.claim_batch(run.pk, "task1", "w1", max_segments=8, max_bytes=1 << 30, lease_s=60)
    Segment.objects.filter(pk__in=ids).update(claimed_at=timezone.now() - dt.timedelta(seconds=30))

    (sample,) = busy.running(run.pk)

    assert sample.nodes == ("task1",) and sample.bytes == 2.0
    assert 29 < sample.busy_s < 120
    # A batch whose lease has lapsed is not running any more (its worker is gone).
    Segment.objects.filter(pk__in=ids).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    assert busy.running(run.pk) == []
