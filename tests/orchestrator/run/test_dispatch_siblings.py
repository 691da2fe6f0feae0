"""What a batch task is told of its siblings: the stage members any Spark worker may
run, each with its routing table, so its batch may take their data with its own; not an
instance a hot rescale placed on a worker of its own, nor anything for a sink. On the
real ZooKeeper, Redis and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from orchestrator.ledger.segments import NodeFlow
from orchestrator.models import Instance
from orchestrator.pipeline.graph import graph_of
from orchestrator.pipeline.routes import Routes
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.dispatch import BatchDispatch, BatchRequest
from orchestrator.run.route_store import RouteStore
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_batch_is_told_of_the_siblings_on_the_shared_queue_only(services: Any) -> None:
    run = pending_run("reference")
    # task3 was hot-migrated to a worker of its own.
    Instance.objects.filter(run=run, name="task3").update(worker="w-own")
    sent: list[tuple[int, BatchRequest]] = []
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:
        control.register_worker("w-own", {"name": "celery@w-own", "queues": ["spark"]})
        # A Spark worker that runs two batches at once: task1's and task2's both go.
        control.register_worker(
            "w-shared", {"name": "celery@w-shared", "queues": ["spark"], "concurrency": 2}
        )
        rescale = RescaleControl(run.pk, control, epoch=1, source="source", timeout_s=60)
        rescale.tick()
        routes = RouteStore(control, str(run.pk))
        shifted = Routes(shares={"output": 1.0})
        routes.set("task2", shifted)
        dispatch = BatchDispatch(run.pk, lambda *call: sent.append(call), routes)
        waiting = NodeFlow(1, 1, 0, 1, 0, 1)
        flows = dict.fromkeys(("task1", "task2", "task3", "output"), waiting)

        dispatch.dispatch_ready(0.0, flows, graph_of(run.topology), rescale, source_sending=False)
        rescale.close()

    told = {r.node: (r.queue, r.siblings) for _, r in sent}
    assert told["task1"] == (None, {"task2": shifted.to_json()})
    assert told["task2"] == (None, {"task1": Routes().to_json()})
    placed, none = told["task3"]
    assert (placed.name, none) == ("celery@w-own.dq2", {})
    assert told["output"] == ("control", {})
