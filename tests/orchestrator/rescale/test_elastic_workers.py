"""A placed run's scale-out adds a real Spark worker, and the run gives it back by itself
once underloaded (orchestrator/rescale/elastic.py, orchestrator/services/spark_pool.py),
on the real stack: the elastic pool starts a Celery Spark worker process that registers
in ZooKeeper, the new instance runs on it, a worker killed in the middle of the
adjustment loses nothing, and a scale-out past the maximum is refused with an event;
once its base worker's measured rate takes what arrives with room to spare for the
policy's ``scale_in_after_s``, the run scales in by itself (the base worker killed in
the middle of that adjustment), asks for one worker fewer, and the pool stops the
worker's processes; more lands after it, and the result equals the plain Spark job over
what the run took in.

The run reads a landing folder, so it goes on after its backlog: the underload that
gives the worker back is watched while the run still runs, and the run is stopped at
the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from orchestrator.ledger.results import summary
from orchestrator.models import Adjustment, Event, Instance, Segment, SourceFile
from orchestrator.run.lifecycle import live_workers, request_adjustment, set_status
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.rescale.elastic_pool import elastic_pool, kill_tree, tree
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    plain_rows_over_intake,
    policy,
    start,
    unemulated_reference,
    wait_until_done,
)
from tests.waiting import alive, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

# Landed before the run starts: data in flight while the run scales out.
BACKLOG_MB = 3
# The run is underloaded from its ask for a worker on: the backlog is soon done, and the
# base worker's measured rate alone takes what arrives (nothing) with room to spare. So
# the scale-in begins this long after the ask, once the scale-out (its worker's start,
# about 6 s on a quiet machine and 17 s on a loaded one, the kill, the refusal) is over.
SCALE_IN_AFTER_S = 30.0


def _story(run: Any, ended: Adjustment) -> str:
    """What the run did since the scale-in ended, for a failure's message."""
    adjustments = [
        f"{a.kind} {a.status} {a.reason[:120]}"
        for a in Adjustment.objects.filter(run=run).order_by("version")
    ]
    events = Event.objects.filter(run=run, time__gte=ended.started_at).order_by("time")
    told = [f"{e.time:%H:%M:%S} {e.kind} {e.node} {e.reason[:140]}" for e in events][-25:]
    return "\n  ".join(["adjustments:", *adjustments, "events since the scale-in:", *told])


@contextlib.contextmanager
def base_worker_restored(workers) -> Iterator[None]:
    """The session's Spark worker running and registered again at the end, whatever the
    test did to it: the tests after this one need it."""
    try:
        yield
    finally:
        if workers.processes["spark1"].poll() is not None:
            workers.start("spark1")
        workers.wait_ready(["spark1"])
        # A worker started again registers once ZooKeeper expired its killed process's
        # session, which held its name.
        wait_for(
            "the base worker registered again",
            lambda: any(
                info.get("pid") == workers.processes["spark1"].pid
                for info in live_workers().values()
            ),
            timeout_s=60,
        )


def test_a_scale_out_starts_a_worker_a_killed_one_loses_nothing_and_the_run_scales_in_by_itself(
    workers, tmp_path
) -> None:
    base = sorted(live_workers())
    assert base, "the test stack runs a Spark worker"
    folder = tmp_path / "landing"
    source = landed_at_once(folder, mb=BACKLOG_MB, seed=11, file_kb=512)
    with (
        ControlPlane.connect(settings.ZK_HOSTS) as control,
        elastic_pool(workers, control, len(base)) as running,
        base_worker_restored(workers),
    ):
        # Given a placed run on the base workers over a landing folder, and an elastic
        # pool one worker wide
        doc = unemulated_reference()
        values = policy(
            placement="placed",
            migration="off",
            routing="static",
            scale_out="measured",  # and scale-in by the measured rates (DS2)
            scale_in_after_s=SCALE_IN_AFTER_S,
        )
        run = start(doc, values, source=source)
        wait_for(
            "the driver placed the tasks", lambda: Event.objects.filter(run=run, kind="placed")
        )
        wait_for("a task batch", lambda: Segment.objects.filter(run=run, state="done").exists())
        # When one more instance of the stage is asked for while every worker runs one
        request_adjustment(run.pk, "add_instance", stage="agg")
        asked = wait_for(
            "the run asked the pool for a worker",
            lambda: Event.objects.filter(run=run, kind="worker_asked").first(),
        )
        assert asked.data["extra"] == 1
        # Then the pool starts a real worker process, which registers in ZooKeeper
        new = wait_for(
            "the new worker registered",
            lambda: sorted(set(live_workers()) - set(base)),
        )
        (worker,) = new
        assert running.pool.extras and running.pool.extras[0].poll() is None
        # and the new instance is added on it by hot rescale
        adjustment = wait_for(
            "a scale-out adjustment began",
            lambda: Adjustment.objects.filter(run=run, kind="scale_out").first(),
        )
        (added,) = adjustment.plan["added"]
        assert Instance.objects.get(run=run, name=added).worker == worker
        # When the worker is killed in the middle of it
        victim = running.pool.extras[0].process
        assert victim is not None
        kill_tree(victim.pid)
        # Then the pool starts it again
        wait_for(
            "the pool started its killed worker again",
            lambda: (
                running.pool.extras[0].process is not victim
                and running.pool.extras[0].poll() is None
            ),
        )
        # and one more instance is asked for: the pool is at its maximum
        wait_for(
            "the adjustment ended",
            lambda: not Adjustment.objects.filter(run=run, status="running").exists(),
            timeout_s=180,
        )
        request_adjustment(run.pk, "add_instance", stage="agg")
        refused = wait_for(
            "the second scale-out was refused",
            lambda: Event.objects.filter(
                run=run, kind="adjust_refused", reason__startswith="scale out of agg refused"
            ).first(),
        )
        assert "maximum" in refused.reason and "nothing was started" in refused.reason
        assert len(running.pool.extras) == 1

        # When the run stays underloaded, it scales in by itself
        scale_in = wait_for(
            "the balancer began a scale-in",
            lambda: Adjustment.objects.filter(run=run, kind="scale_in").first(),
            timeout_s=SCALE_IN_AFTER_S + 120,
            every_s=0.01,
        )
        assert scale_in.status == "running", (
            f"the scale-in was {scale_in.status} before the test could kill a worker in its middle"
        )
        # and the base worker is killed in the middle of it (and started again)
        kill_tree(workers.processes["spark1"].pid)
        workers.start("spark1")
        extra = running.pool.extras[0].process
        assert extra is not None
        # (its processes that run: a child it has not reaped yet is gone already)
        processes = [p for p in tree(extra.pid) if alive(p)]
        assert processes and processes[0].pid == extra.pid, "the pool's worker runs"
        (removed,) = scale_in.plan["removed"]
        assert Event.objects.filter(
            run=run, kind="adjust_planned", actor="balancer", data__removed=[removed]
        ).exists()
        # by the measured rates once the base worker's is measured (else its busy share)
        assert (
            f"without {removed}'s resource" in scale_in.reason
            or "every instance under 25% busy" in scale_in.reason
        ), scale_in.reason
        # Then the scale-in completes or rolls back
        ended = wait_for(
            "the scale-in ended",
            lambda: Adjustment.objects.filter(pk=scale_in.pk).exclude(status="running").first(),
            timeout_s=180,
        )
        assert ended.status in ("complete", "rolled_back"), ended.status
        # When more lands after it, while the base worker comes back
        landed_at_once(folder, mb=0.25, seed=13, file_kb=256)
        files = len(list(folder.glob("*.jsonl")))
        # Then the run asks for one worker fewer (a scale-in rolled back is tried again
        # after the next underload)
        wait_for(
            "the run asked for one worker fewer",
            lambda: str(run.pk) not in control.spark_workers_asked(),
            timeout_s=180,
            detail=lambda: _story(run, ended),
        )
        # and the pool stops the worker: its processes are gone, and so is it from
        # ZooKeeper
        wait_for("the pool stopped its worker", lambda: not running.pool.extras)
        wait_for(
            "the worker's processes exited",
            lambda: not [p for p in processes if alive(p)],
            timeout_s=60,
        )
        wait_for(
            "the stopped worker left ZooKeeper",
            lambda: not (set(live_workers()) - set(base)),
            timeout_s=90,
        )
        # When the run is stopped once it has read every landed file
        wait_for(
            "the run read every landed file",
            lambda: SourceFile.objects.filter(run=run, state="read").count() == files,
        )
        set_status(run.pk, "stopping", reason="test: every landed file read")
        run = wait_until_done(run, timeout_s=300)
    # Then the run equals the plain Spark job over what it took in
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact", result["error"]
    assert result["rows"] == plain_rows_over_intake(run, doc, tmp_path)
