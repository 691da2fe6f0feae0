"""An adjustment's effect on its stage's measured capacity goes on the run's timeline
(orchestrator/run/capacity_log.py): before, and once measured, after."""

from __future__ import annotations

import math

import pytest

from balancer.model import Observation
from balancer.units import MB
from orchestrator.models import Adjustment, Event
from orchestrator.run.capacity_log import WAIT_S, CapacityLog
from tests.balancer.builders import layered, node, observe
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db


def seen(rates: dict[str, float]) -> Observation:
    """A source, stage ``op`` of the given instances and rates (each on a worker of its
    own), a sink."""
    topology = layered(("src", 1), ("op", len(rates)), ("sink", 1))
    names = [f"op{i}" for i in range(1, len(rates) + 1)]
    nodes = {
        name: node(name, capacity_bps=rate, resource=f"w-{name}")
        for name, rate in zip(names, rates.values(), strict=True)
    }
    return observe(topology, nodes=nodes)


def adjustment(run_id: int, version: int, kind: str = "scale_out") -> Adjustment:
    return Adjustment.objects.create(
        run_id=run_id,
        version=version,
        kind=kind,
        reason="test",
        before={},
        after={},
        plan={"changed_stages": ["op"]},
    )


def test_a_scale_out_says_its_stage_s_capacity_before_and_once_measured_after() -> None:
    run = pending_run("reference")
    log = CapacityLog(run.pk)
    two = {"a": 6 * MB, "b": 3 * MB}
    log.update(seen(two), None, 0.0)
    grown = adjustment(run.pk, 1)
    log.update(seen(two), grown, 1.0)  # begins
    Adjustment.objects.filter(pk=grown.pk).update(status=Adjustment.Status.COMPLETE)
    log.update(seen(two), None, 2.0)  # ends: this tick's observation predates it
    log.update(seen({**two, "c": math.inf}), None, 3.0)  # the new instance not measured yet
    assert not Event.objects.filter(run=run, kind="capacity_measured").exists()

    log.update(seen({**two, "c": 4.5 * MB}), None, 4.0)

    event = Event.objects.get(run=run, kind="capacity_measured")
    assert event.reason == (
        "scale_out (adjustment 1): stage op: 9.00 MB/s on 2 resource(s) before, "
        "13.50 MB/s on 3 resource(s) after"
    )
    assert event.data["stages"]["op"] == {
        "before_bps": 9 * MB,
        "before_resources": 2,
        "after_bps": 13.5 * MB,
        "after_resources": 3,
    }
    log.update(seen({**two, "c": 4.5 * MB}), None, 5.0)
    assert Event.objects.filter(run=run, kind="capacity_measured").count() == 1


def test_a_rolled_back_adjustment_says_nothing_and_an_unmeasured_one_says_so() -> None:
    run = pending_run("reference")
    log = CapacityLog(run.pk)
    two = {"a": 6 * MB, "b": 3 * MB}
    log.update(seen(two), None, 0.0)
    undone = adjustment(run.pk, 1)
    log.update(seen(two), undone, 1.0)
    Adjustment.objects.filter(pk=undone.pk).update(status=Adjustment.Status.ROLLED_BACK)
    log.update(seen(two), None, 2.0)
    assert log.pending == {}

    grown = adjustment(run.pk, 2)
    log.update(seen(two), grown, 3.0)
    Adjustment.objects.filter(pk=grown.pk).update(status=Adjustment.Status.COMPLETE)
    log.update(seen(two), None, 4.0)
    never = seen({**two, "c": math.inf})
    log.update(never, None, 4.0 + WAIT_S)
    assert not Event.objects.filter(run=run, kind="capacity_measured").exists()
    log.update(never, None, 5.0 + WAIT_S)

    event = Event.objects.get(run=run, kind="capacity_measured")
    assert event.reason.endswith(f"not measured {WAIT_S:.0f} s after")
    assert event.data["stages"]["op"]["after_bps"] is None
