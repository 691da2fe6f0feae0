"""Balancing on resources the operating system makes unequal, every emulation knob at 0:
a second Spark worker in a cgroup whose CPU quota is a fraction of a core, beside the
session's uncapped one, the input split evenly between the two branches, routing by
measured capacity. The balancer measures the capped worker's branch as the slower one,
sends most of the input to the fast one (routing what comes, moving what waits), and
the result equals the plain Spark job, although the driver doing it is killed midway.

Cgroups need root (or a writable cpu controller): elsewhere the test is skipped with the
reason the quota could not be made (orchestrator/services/cpu_quota.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.db.models import Sum

from orchestrator.ledger import busy
from orchestrator.ledger.results import summary
from orchestrator.models import Event, Instance, Segment
from orchestrator.services.cpu_quota import CpuQuotas, QuotaError
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import (
    kill_the_driver,
    policy,
    start,
    two_branches,
    wait_for_spark_workers,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

SLOW_CORES = 0.3
INPUT_MB = 10
BRANCHES = ("task1", "task2")


@pytest.fixture(scope="module")
def capped_worker(workers) -> Iterator[str]:
    """spark8, a Spark worker whose Celery process and JVM run in a cgroup allowed
    ``SLOW_CORES`` of a core, beside spark1; the name of its registration."""
    quotas = CpuQuotas({"slow": SLOW_CORES}, prefix=f"bpconsole-test-{os.getpid()}")
    try:
        quotas.__enter__()
    except QuotaError as error:
        pytest.skip(f"no CPU quota can be made here: {error}")
    try:
        slow = workers.start("spark8", wrap=lambda argv: quotas.launch_argv("slow", argv))
        try:
            workers.wait_ready(["spark8"])
            names = wait_for_spark_workers("spark1", "spark8")
            assert quotas.pids("slow"), "the capped worker's processes are not in its cgroup"
            yield next(n for n in names if n.startswith("spark8-"))
        finally:
            if slow.poll() is None:
                slow.terminate()
                slow.wait(30)
            workers.processes.pop("spark8", None)
    finally:
        quotas.remove()


def test_the_branch_on_the_capped_worker_is_measured_slower_and_its_data_moves_to_the_fast_one(
    capped_worker: str, workers, services
) -> None:
    # Given two branches placed on two workers, one capped by the OS at a fraction of a
    # core, no emulation knob anywhere, and input split evenly between the branches
    doc = two_branches()
    run = start(
        doc,
        policy(placement="placed", routing="measured", migration="proportional"),
        generator=f"seed=11,volume_mb={INPUT_MB},dominance=0",
    )
    # When it runs to the end, its driver killed once the balancer has begun to move
    # work between the branches (a new one takes the run over from the ledger)
    wait_for(
        "the balancer routing or moving the stage's data",
        lambda: Event.objects.filter(
            run=run, actor="balancer", kind__in=("set_shares", "move_queued")
        ).exists(),
        timeout_s=180,
    )
    victim = kill_the_driver(run, workers, services)
    try:
        run = wait_until_done(run, timeout_s=300)
    finally:
        workers.start(victim)
        workers.wait_ready([victim])
    assert Event.objects.filter(run=run, kind="driver").count() >= 2, "no driver took over"
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    placement = dict(
        Instance.objects.filter(run=run, name__in=BRANCHES).values_list("name", "worker")
    )
    slow = next(name for name, worker in placement.items() if worker == capped_worker)
    fast = next(name for name in BRANCHES if name != slow)
    told = list(Event.objects.filter(run=run).order_by("-pk").values_list("kind", "reason")[:30])
    # Then the balancer measured the capped worker's branch as the slower one
    measured = busy.measured_capacities(run)
    assert 0 < measured[slow] < 0.7 * measured.get(fast, 0), (measured, told)
    # and moved work off it: routing the stage's input in proportion to the measured
    # rates while the source still sent, and moving what already waited in the capped
    # worker's pool to the fast one (the source reads a bounded input ahead, so most of
    # it may be in the pools before the first batch ends)
    shares = (
        Event.objects.filter(run=run, kind="set_shares", actor="balancer")
        .order_by("-pk")
        .values_list("data", flat=True)
        .first()
    )
    routed = shares is not None and shares["shares"][slow] < shares["shares"][fast]
    moved = Event.objects.filter(run=run, kind="move_queued", node=slow, actor="balancer")
    assert routed or moved.exists(), f"nothing moved off the capped worker: {told}"
    for data in moved.values_list("data", flat=True):
        assert set(data["moves"]) == {fast} and all(v > 0 for v in data["moves"].values()), data
    ran = dict(
        Segment.objects.filter(run=run, node__in=BRANCHES, state="done")
        .values_list("node")
        .annotate(size=Sum("bytes"))
    )
    assert ran[fast] > 1.2 * ran[slow], ran
    # and the result equals the plain Spark job's over the same input
    assert result["coverage"] == "exact"
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    assert result["rows"] == expected["rows"]
