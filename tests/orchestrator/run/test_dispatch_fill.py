"""An operator's batch waits to fill while the source has more to send at once, for at
most LINGER_S; a full batch's worth, a source with nothing more to send now, and the
sink's merges go at once. On the real ZooKeeper, Redis and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from balancer.units import MB
from orchestrator.ledger.segments import NodeFlow
from orchestrator.models import Instance
from orchestrator.pipeline.graph import graph_of
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.dispatch import LINGER_S, BatchDispatch, BatchRequest
from orchestrator.run.route_store import RouteStore
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BATCH = int(settings.BPCONSOLE_BATCH_MB * MB)


class Queued:
    """A batch task's handle while it waits in its queue."""

    id = "queued"

    def ready(self) -> bool:
        return False

    def failed(self) -> bool:
        return False


def waiting(size: int) -> NodeFlow:
    return NodeFlow(size, size, 0, 1, 0, size)


@pytest.fixture
def sent(services: Any) -> Iterator[tuple[Any, Any, list[str]]]:
    """A dispatch for the reference run (task1, task2 and task3 one stage before the
    sink), the run's graph, and the nodes it sent batches for. No Spark worker is known
    to it: a stage has one batch in flight at a time (test_dispatch_slots.py)."""
    run = pending_run("reference")
    nodes: list[str] = []
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:
        routes = RouteStore(control, str(run.pk))

        def send(_run: int, request: BatchRequest) -> Queued:
            nodes.append(request.node)
            return Queued()

        dispatch = BatchDispatch(run.pk, send, routes)
        yield dispatch, graph_of(run.topology), nodes


def test_a_batch_waits_while_the_source_sends_then_goes_after_the_linger(
    sent: tuple[Any, Any, list[str]],
) -> None:
    dispatch, graph, nodes = sent
    flows = {"task1": waiting(BATCH // 4), "task2": waiting(BATCH // 4), "output": waiting(1)}
    dispatch.dispatch_ready(10.0, flows, graph, None, source_sending=True)
    assert nodes == ["output"]  # the sink's merge never waits
    dispatch.dispatch_ready(10.0 + LINGER_S / 2, flows, graph, None, source_sending=True)
    assert nodes == ["output"]
    dispatch.dispatch_ready(10.0 + LINGER_S, flows, graph, None, source_sending=True)
    assert nodes == ["output", "task1"]


def test_a_stage_with_a_full_batch_waiting_between_its_members_goes_at_once(
    sent: tuple[Any, Any, list[str]],
) -> None:
    dispatch, graph, nodes = sent
    flows = {"task1": waiting(BATCH // 2), "task3": waiting(BATCH - BATCH // 2)}
    dispatch.dispatch_ready(0.0, flows, graph, None, source_sending=True)
    assert nodes == ["task1"]


def test_nothing_waits_once_the_source_has_nothing_more_to_send_at_once(
    sent: tuple[Any, Any, list[str]],
) -> None:
    dispatch, graph, nodes = sent
    flows = {"task1": waiting(1), "task3": waiting(1)}
    dispatch.dispatch_ready(0.0, flows, graph, None, source_sending=True)
    assert nodes == []
    dispatch.dispatch_ready(0.1, flows, graph, None, source_sending=False)
    assert nodes == ["task1"]


def test_a_batch_the_balancer_bounds_is_sent_with_its_bound_and_others_with_none(
    services: Any,
) -> None:
    # The balancer bounded task1's batches (balancer/queued.py, batch_bounds): its task
    # claims at most that; the sink's merge takes all it has.
    run = pending_run("reference")
    bounds = {"task1": 3.5 * MB}
    requests: list[BatchRequest] = []
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:

        def send(_run: int, request: BatchRequest) -> Queued:
            requests.append(request)
            return Queued()

        dispatch = BatchDispatch(run.pk, send, RouteStore(control, str(run.pk)), bounds)
        flows = {"task1": waiting(BATCH), "output": waiting(1)}
        dispatch.dispatch_ready(0.0, flows, graph_of(run.topology), None, source_sending=False)

    assert [(r.node, r.max_bytes) for r in requests] == [
        ("task1", int(3.5 * MB)),
        ("output", None),
    ]


def test_a_placed_instance_claims_at_most_half_its_pool(services: Any) -> None:
    # Claimed data stays in the pool's level until its batch commits: a batch of the
    # whole pool would leave the source no room to send the next one meanwhile
    # (balancer/runtime.py, PLACED_BATCH_POOL_SHARE). A lower bound of the balancer's
    # still holds; an instance on the shared queue is bounded by BPCONSOLE_BATCH_MB only.
    run = pending_run("reference")
    Instance.objects.filter(run=run, name__in=["task2", "task3"]).update(worker="w-own")
    graph = graph_of(run.topology)
    pool = graph.topology.node("task3").capacity_bytes
    requests: list[BatchRequest] = []
    with ControlPlane.connect(services.zk_hosts, f"/test-{uuid.uuid4().hex[:8]}") as control:
        control.register_worker("w-own", {"name": "celery@w-own", "queues": ["spark"]})
        rescale = RescaleControl(run.pk, control, epoch=1, source="source", timeout_s=60)
        rescale.tick()

        def send(_run: int, request: BatchRequest) -> Queued:
            requests.append(request)
            return Queued()

        bounds = {"task2": pool / 8}
        dispatch = BatchDispatch(run.pk, send, RouteStore(control, str(run.pk)), bounds)
        flows = dict.fromkeys(("task1", "task2", "task3"), waiting(BATCH))
        dispatch.dispatch_ready(0.0, flows, graph, rescale, source_sending=False)
        rescale.close()

    assert sorted((r.node, r.max_bytes) for r in requests) == [
        ("task1", None),
        ("task2", int(pool / 8)),
        ("task3", int(pool / 2)),
    ]
