"""A scale-out the balancer sized from measured rates (balancer/sizing.py) is carried out
in one step (orchestrator/rescale/control.py): in placed mode every new instance gets a
worker none of its stage runs on, the free live ones first and the rest asked of the
elastic pool at once, as many as it has room for; then one adjustment adds them all.
On real ZooKeeper and PostgreSQL; no Spark worker runs (the workers are registrations)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from balancer.model import ScaleOutRequest
from orchestrator.models import Adjustment, Event, Instance
from orchestrator.rescale.control import RescaleControl
from orchestrator.services.spark_pool import PoolState
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.runs import pending_run
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TWO_MORE = ScaleOutRequest(reason="overloaded", stage="agg", upstream="source", instances=2)


def register(control: ControlPlane, *names: str) -> None:
    for name in names:
        control.register_worker(
            name,
            {
                "name": f"celery@{name}",
                "queues": ["spark"],
                "concurrency": 1,
                "started": time.time(),
            },
        )


def wait_complete(rescale: RescaleControl, run: Any) -> None:
    """Poll the run's adjustment as its driver does until it completes (nothing flows:
    the driver aligns every idle instance itself)."""
    wait_for(
        "the adjustment complete",
        lambda: rescale.poll() or rescale.current is None,
        timeout_s=30,
        detail=lambda: str(list(Adjustment.objects.filter(run=run).values("kind", "status"))),
    )


@contextmanager
def placed_run(services: Any, pool: PoolState | None) -> Iterator[tuple[RescaleControl, Any]]:
    """The reference run (task1..task3 of stage ``agg``) placed on three live workers,
    with an elastic pool in the given state (None: no pool)."""
    run = pending_run("reference")
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:
        register(control, "w1", "w2", "w3")
        if pool is not None:
            control.write_spark_pool(pool)
        rescale = RescaleControl(
            run.pk, control, epoch=1, source="source", timeout_s=60, placement="placed"
        )
        try:
            assert sorted(rescale.placement.values()) == ["w1", "w2", "w3"]
            yield rescale, run
        finally:
            rescale.close()


def test_two_instances_sized_at_once_ask_the_pool_for_two_workers_and_start_together(
    services: Any,
) -> None:
    with placed_run(services, PoolState(base=3, maximum=6, extra=0)) as (rescale, run):
        assert rescale.scale_out(TWO_MORE, now=100.0)

        asked = Event.objects.get(run=run, kind="worker_asked")
        assert asked.data["asked"] == 2 and asked.data["instances"] == 2
        assert rescale.control.spark_workers_asked() == {str(run.pk): 2}
        assert not Adjustment.objects.filter(run=run).exists()

        register(rescale.control, "w4")
        rescale._workers_changed.set()
        assert not rescale.tick(), "began with one of the two workers it waits for"
        register(rescale.control, "w5")
        rescale._workers_changed.set()
        assert rescale.tick()

        grown = Adjustment.objects.get(run=run)
        assert grown.kind == "scale_out" and len(grown.plan["added"]) == 2
        new = Instance.objects.filter(run=run, name__in=grown.plan["added"])
        assert sorted(new.values_list("worker", flat=True)) == ["w4", "w5"]


def test_a_pool_with_room_for_one_gets_one_ask_and_says_so(services: Any) -> None:
    with placed_run(services, PoolState(base=3, maximum=4, extra=0)) as (rescale, run):
        assert rescale.scale_out(TWO_MORE, now=100.0)

        asked = Event.objects.get(run=run, kind="worker_asked")
        assert asked.data["asked"] == 1 and "the pool had room for 1 only" in asked.reason
        register(rescale.control, "w4")
        rescale._workers_changed.set()
        assert rescale.tick()
        assert len(Adjustment.objects.get(run=run).plan["added"]) == 1


def test_free_workers_are_used_first_and_no_pool_refuses_the_rest(services: Any) -> None:
    with placed_run(services, None) as (rescale, run):
        register(rescale.control, "w4")
        rescale._workers_changed.set()
        rescale.tick()
        assert rescale.scale_out(TWO_MORE, now=100.0)

        grown = Adjustment.objects.get(run=run)
        assert len(grown.plan["added"]) == 1
        assert "1 of 2 on free workers: no elastic Spark pool runs" in grown.reason
        assert not Event.objects.filter(run=run, kind="worker_asked").exists()


def test_no_free_worker_and_no_pool_is_refused_and_starts_nothing(services: Any) -> None:
    with placed_run(services, None) as (rescale, run):
        assert not rescale.scale_out(TWO_MORE, now=100.0)

        refused = Event.objects.get(run=run, kind="adjust_refused")
        assert "no elastic Spark pool runs" in refused.reason
        assert "nothing was started" in refused.reason
        assert not Adjustment.objects.filter(run=run).exists()
        assert rescale.control.spark_workers_asked() == {}


def test_a_request_past_the_stage_s_maximum_is_cut_to_it_and_at_it_refused(
    services: Any,
) -> None:
    with placed_run(services, None) as (rescale, run):
        register(rescale.control, *(f"w{n}" for n in range(4, 12)))
        rescale._workers_changed.set()
        rescale.tick()
        many = ScaleOutRequest(reason="overloaded", stage="agg", upstream="source", instances=9)
        assert rescale.scale_out(many, now=100.0)
        assert len(Adjustment.objects.get(run=run).plan["added"]) == 5  # 3 + 5 = 8

        Adjustment.objects.filter(run=run).update(status=Adjustment.Status.COMPLETE)
        rescale.current = None
        run.refresh_from_db()
        run.topology = Adjustment.objects.get(run=run).after
        run.save(update_fields=["topology"])
        assert not rescale.scale_out(many, now=1000.0)
        refused = Event.objects.get(run=run, kind="adjust_refused")
        assert "already has 8 instances" in refused.reason


def test_a_scale_in_after_underload_gives_its_worker_back_under_a_driver_that_took_over(
    services: Any,
) -> None:
    # The run has one worker of its own from the pool (w4, the newest) and stays idle:
    # the balancer removes the instance there, and once that adjustment completes the
    # run asks for one worker fewer, even when a new driver (a new RescaleControl over
    # the same run, as after a takeover) is the one that completes it.
    with placed_run(services, PoolState(base=3, maximum=4, extra=0)) as (rescale, run):
        assert rescale.scale_out(ScaleOutRequest("overloaded", "agg", "source", 1), now=0.0)
        register(rescale.control, "w4")
        rescale._workers_changed.set()
        assert rescale.tick()
        wait_complete(rescale, run)
        assert rescale.control.spark_workers_asked() == {str(run.pk): 1}
        (added,) = Adjustment.objects.get(run=run, kind="scale_out").plan["added"]

        idle = dict.fromkeys(("task1", "task2", "task3", added), 0.0)
        assert not rescale.consider_scale_in(idle, now=10.0)
        assert rescale.consider_scale_in(idle, now=10.0 + rescale.scale_in_after_s)
        scale_in = Adjustment.objects.get(run=run, kind="scale_in")
        assert scale_in.plan["removed"] == [added] and scale_in.plan["gives_back_worker"]

        successor = RescaleControl(
            run.pk, rescale.control, epoch=1, source="source", timeout_s=60, placement="placed"
        )
        try:
            assert successor.current is not None
            wait_complete(successor, run)
        finally:
            successor.close()
        assert rescale.control.spark_workers_asked() == {}
