"""A stage's members whose batches one Spark job may run together have no more batches
in flight than the live Spark workers run at once: one queued behind a running batch
would start the moment it ends and take only what had arrived by then. Members that
cannot share a job, and instances placed on a worker of their own, are not held back.
On the real ZooKeeper, Redis and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings

from orchestrator.ledger.segments import NodeFlow
from orchestrator.models import Instance
from orchestrator.pipeline.graph import RunGraph, graph_of
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.dispatch import BatchDispatch, BatchRequest
from orchestrator.run.route_store import RouteStore
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import skewed_reference
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Data waiting at each member of the reference run's stage, and none held by a batch.
WAITING = NodeFlow(1, 1, 0, 1, 0, 1)
FLOWS = dict.fromkeys(("task1", "task2", "task3"), WAITING)


@dataclass
class Handle:
    """A batch task's handle: queued or running until ``done``."""

    id: str
    done: bool = False

    def ready(self) -> bool:
        return self.done

    def failed(self) -> bool:
        return False


@dataclass
class Stage:
    """The reference run's dispatch with the Spark workers registered, and what it sent."""

    dispatch: BatchDispatch
    rescale: RescaleControl
    graph: RunGraph
    sent: list[str] = field(default_factory=list)
    handles: dict[str, Handle] = field(default_factory=dict)

    def ready(self, now: float, flows: dict[str, NodeFlow] = FLOWS) -> list[str]:
        """The nodes a dispatch at ``now`` sent batches for."""
        before = len(self.sent)
        self.dispatch.dispatch_ready(now, flows, self.graph, self.rescale, source_sending=False)
        return self.sent[before:]


def stage_with(services: Any, workers: dict[str, Any], placed: dict[str, str]) -> Iterator[Stage]:
    run = pending_run("reference")
    for node, worker in placed.items():
        Instance.objects.filter(run=run, name=node).update(worker=worker)
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:
        for name, concurrency in workers.items():
            control.register_worker(
                name, {"name": f"celery@{name}", "queues": ["spark"], "concurrency": concurrency}
            )
        rescale = RescaleControl(run.pk, control, epoch=1, source="source", timeout_s=60)
        rescale.tick()
        stage: Stage

        def send(_run: int, request: BatchRequest) -> Handle:
            node = request.node
            stage.sent.append(node)
            handle = stage.handles[node] = Handle(f"{node}-{len(stage.sent)}")
            return handle

        dispatch = BatchDispatch(run.pk, send, RouteStore(control, str(run.pk)))
        stage = Stage(dispatch, rescale, graph_of(run.topology))
        try:
            yield stage
        finally:
            rescale.close()


@pytest.fixture
def one_worker(services: Any) -> Iterator[Stage]:
    yield from stage_with(services, {"w1": 1}, {})


def test_with_one_spark_worker_a_stage_has_one_batch_in_flight(one_worker: Stage) -> None:
    assert one_worker.ready(0.0) == ["task1"]
    assert one_worker.ready(0.1) == []  # task2 and task3 wait: task1's batch may take theirs

    # Once it ended, the next batch goes (and again takes its siblings' data with its own)
    one_worker.handles["task1"].done = True
    assert one_worker.ready(0.2) == ["task2"]


def test_the_members_take_the_slot_in_turn(one_worker: Stage) -> None:
    # A member whose data no sibling's batch may take (aligning in a hot rescale) is not
    # starved by one that always has data waiting: the one sent longest ago goes first
    turns = []
    for step in range(6):
        (node,) = one_worker.ready(float(step))
        turns.append(node)
        one_worker.handles[node].done = True
    assert turns == ["task1", "task2", "task3", "task1", "task2", "task3"]


def test_a_batch_that_never_reports_holds_its_slot_only_until_it_is_presumed_lost(
    one_worker: Stage,
) -> None:
    assert one_worker.ready(0.0) == ["task1"]
    # Sent to a worker that died before running it: nothing held, never ready
    later = settings.BPCONSOLE_QUEUED_BATCH_S + 1.0
    assert one_worker.ready(later) == ["task2"]  # the slot is free again
    one_worker.handles["task2"].done = True
    assert one_worker.ready(later + 0.1) == ["task3"]
    one_worker.handles["task3"].done = True
    assert one_worker.ready(later + 0.2) == ["task1"]  # sent again


def test_each_slot_of_the_spark_workers_takes_a_batch(services: Any) -> None:
    for stage in stage_with(services, {"w1": 2, "w2": 1}, {}):
        assert stage.ready(0.0) == ["task1", "task2", "task3"]


def test_an_instance_placed_on_a_worker_of_its_own_is_not_held_back(services: Any) -> None:
    for stage in stage_with(services, {"w1": 1, "w-own": 1}, {"task3": "w-own"}):
        # Two workers, so two of the shared queue's members go; task3 goes to its own
        assert stage.ready(0.0) == ["task1", "task2", "task3"]
        stage.handles["task1"].done = True
        assert stage.ready(0.1) == ["task1"]


def test_members_that_cannot_share_a_job_each_have_their_batch(one_worker: Stage) -> None:
    # task1 and task2 at an emulated rate of their own: each runs its own batches
    one_worker.graph = graph_of(skewed_reference())
    assert one_worker.ready(0.0) == ["task1", "task2", "task3"]


def test_a_worker_registered_without_a_usable_concurrency_counts_as_one(services: Any) -> None:
    workers = {"w1": "many", "w2": -3, "w3": True}
    for stage in stage_with(services, workers, {}):
        assert stage.rescale.spark_slots() == 3
