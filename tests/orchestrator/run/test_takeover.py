"""A batch whose process or engine died runs again within seconds, not after its lease,
and a dead Spark JVM is the engine's failure, never counted against the operator."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from django.utils import timezone

from orchestrator.models import Run, Segment
from orchestrator.worker.batch import NEW_JVM_BATCH_SEGMENTS
from tests.orchestrator.run.scenarios import (
    completes_like_the_batch_job,
    policy,
    skewed_reference,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

GENERATOR = "seed=21,volume_mb=4,dominance=0.85,skew_mean_s=1000"


def _operator_batch(run: Run) -> Segment:
    """A batch of an operator (not the sink, whose merges run on the control workers)
    while it runs."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        held = Segment.objects.filter(run=run, state="claimed").exclude(node="sink").first()
        if held is not None:
            return held
        time.sleep(0.02)
    raise AssertionError("no operator batch was ever claimed")


def _claimed_with(held: Segment) -> tuple[int, int]:
    """The segments of ``held``'s batch (one claim, made in one statement), and those
    its node still had queued."""
    claimed = Segment.objects.filter(run=held.run_id, lease_owner=held.lease_owner).count()
    queued = Segment.objects.filter(run=held.run_id, node=held.node, state="queued").count()
    return claimed, queued


def _pool_child(workers) -> psutil.Process:
    children = [p for p in _worker(workers).children() if p.name() != "java"]
    assert len(children) == 1, children
    return children[0]


def _worker(workers) -> psutil.Process:
    return psutil.Process(workers.processes["spark1"].pid)


def _jvm(workers) -> psutil.Process:
    """The Spark worker's JVM: its main process's, shared by its pool (ADR 0007)."""
    jvms = [p for p in _worker(workers).children() if p.name() == "java"]
    assert len(jvms) == 1, jvms
    return jvms[0]


def test_a_batch_whose_process_or_jvm_died_runs_again_at_once_and_uncounted(workers) -> None:
    # One failed attempt would fail this run
    run = start(skewed_reference(), policy(max_batch_attempts=1), generator=GENERATOR)
    held = _operator_batch(run)
    owner, lease_end = held.lease_owner, held.lease_expires
    assert ":task=" in owner, owner
    jvm = _jvm(workers)
    # When the process running a batch is killed
    _pool_child(workers).send_signal(signal.SIGKILL)
    # Then its segments are free for another attempt before its lease would have run out
    # (the driver sees the task fail and frees what it held)
    while Segment.objects.filter(pk=held.pk, lease_owner=owner).exists():
        assert timezone.now() < lease_end, "the batch waited for its lease to run out"
        time.sleep(0.05)
    # And the new process runs it on the same JVM, which lived on; its first batch is a
    # small one (it may be the killed one's re-run)
    assert _jvm(workers).pid == jvm.pid
    claimed, queued = _claimed_with(_operator_batch(run))
    assert claimed <= NEW_JVM_BATCH_SEGMENTS < claimed + queued, (claimed, queued)
    # When the Spark JVM under a later batch is killed (the worker's processes live on)
    _operator_batch(run)
    jvm.send_signal(signal.SIGKILL)
    # Then the batch goes back to its pool uncounted, the worker starts a new JVM, its
    # process a new session on it, and the run completes, equal to the batch job
    completes_like_the_batch_job(run)
    assert not Segment.objects.filter(run=run, failures__gt=0).exists()
    assert _jvm(workers).pid != jvm.pid
