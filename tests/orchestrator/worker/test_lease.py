"""Leases of running batches, on the real PostgreSQL and Spark: a worker keeps the lease
of the batch it runs for as long as the batch takes; a silent or hung worker loses it,
and the watchdog gives the batch to someone else."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.ledger import segments
from orchestrator.models import Run, Segment
from orchestrator.run.dispatch import Dispatch
from orchestrator.worker.batch import process_batch
from orchestrator.worker.lease import LeaseKeeper
from tests.orchestrator.runs import pending_run, queue_segments

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _claim(run: Run, owner: str, lease_s: float) -> list[str]:
    claim = segments.claim_batch(
        run.pk, "task1", owner, max_segments=64, max_bytes=1 << 30, lease_s=lease_s
    )
    return [s.pk for s in claim]


def _reclaim_for(seconds: float) -> None:
    """Take back expired leases every 50 ms, as the watchdog does (the test session's
    own watchdog may take them first: tests look at the segments, not at who did)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        segments.reclaim_expired()
        time.sleep(0.05)


def _holders(ids: list[str]) -> set[tuple[str, str]]:
    return set(Segment.objects.filter(pk__in=ids).values_list("state", "lease_owner"))


def test_a_batch_running_longer_than_its_lease_keeps_it() -> None:
    run = pending_run("reference")
    queue_segments(run, ["/dev/null"] * 3)
    ids = _claim(run, "w1", lease_s=0.6)
    with LeaseKeeper(ids, "w1", lease_s=0.6, max_hold_s=60) as keeper:
        _reclaim_for(2.0)
        assert _holders(ids) == {(Segment.State.CLAIMED, "w1")}
    assert keeper.renewals >= 3
    # A worker that stops renewing (it died) loses the batch one lease later.
    _reclaim_for(1.0)
    assert _holders(ids) == {(Segment.State.QUEUED, "")}


def test_a_hung_batch_goes_back_to_the_pool_after_the_longest_hold() -> None:
    run = pending_run("reference")
    queue_segments(run, ["/dev/null"] * 3)
    ids = _claim(run, "w1", lease_s=0.6)
    with LeaseKeeper(ids, "w1", lease_s=0.6, max_hold_s=0.5):
        _reclaim_for(2.0)
        assert _holders(ids) == {(Segment.State.QUEUED, "")}
        assert sorted(_claim(run, "w2", lease_s=60)) == sorted(ids)


def test_the_keeper_stops_once_another_worker_has_the_batch() -> None:
    run = pending_run("reference")
    queue_segments(run, ["/dev/null"] * 2)
    ids = _claim(run, "w1", lease_s=60)
    with LeaseKeeper(ids, "w1", lease_s=0.3, max_hold_s=60) as keeper:
        Segment.objects.filter(pk__in=ids).update(lease_expires="2000-01-01T00:00:00Z")
        segments.reclaim_expired(run.pk)
        assert sorted(_claim(run, "w2", lease_s=60)) == sorted(ids)
        theirs = dict(Segment.objects.filter(pk__in=ids).values_list("pk", "lease_expires"))
        time.sleep(0.5)
        renewals = keeper.renewals
        time.sleep(0.3)
        assert keeper.renewals == renewals  # it stopped
    assert dict(Segment.objects.filter(pk__in=ids).values_list("pk", "lease_expires")) == theirs


@pytest.fixture
def watchdog() -> Iterator[None]:
    """Reclaims expired leases every 50 ms while a test runs, as beat's watchdog would."""
    stop = threading.Event()

    def reclaim() -> None:
        from django.db import connection

        try:
            while not stop.wait(0.05):
                segments.reclaim_expired()
        finally:
            connection.close()

    thread = threading.Thread(target=reclaim, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


def _records(path: Path, count: int, offset: int) -> Path:
    lines = (
        json.dumps({"key": f"k{i % 40}", "value": i, "user": f"u{i % 500}"})
        for i in range(offset, offset + count)
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_operator_batch_longer_than_its_lease_completes_once(
    spark: Any, settings: Any, tmp_path: Path, watchdog: None
) -> None:
    # (a lease short enough that even a fast machine's Spark outlasts it three times)
    settings.BPCONSOLE_LEASE_S = 0.4
    settings.DATA_DIR = tmp_path / "data"
    run = pending_run("reference")
    # 800,000 records: 1.1 s of Spark on the fastest machine seen, too close to 1.2.
    paths = [_records(tmp_path / f"in{n}.jsonl", 200_000, n * 200_000) for n in range(4)]
    ids = queue_segments(run, paths)
    started = time.monotonic()
    report = process_batch(run.pk, "task1", None)
    elapsed = time.monotonic() - started
    # The lease ran out several times over while Spark worked...
    assert elapsed > 3 * settings.BPCONSOLE_LEASE_S, f"batch took only {elapsed:.2f} s"
    # ...and the batch was neither taken away nor run twice.
    assert report.segments == 4
    done = Segment.objects.filter(pk__in=ids)
    assert set(done.values_list("state", "attempts")) == {(Segment.State.DONE, 1)}
    outputs = Segment.objects.filter(run=run, node="output")
    assert outputs.count() == 4


class _Pending:
    """A task handle that has not reported yet."""

    def ready(self) -> bool:
        return False


def test_the_driver_waits_for_a_batch_under_a_live_lease_however_long(settings: Any) -> None:
    settings.BPCONSOLE_LEASE_S = 10
    sent = Dispatch(started=0.0, handle=_Pending())
    assert sent.may_complete(5.0)  # it may still be waiting in its queue
    assert sent.may_complete(500.0, held=True)  # its worker is renewing the lease
    assert not sent.may_complete(500.0)  # silent for a lease with nothing held: lost
