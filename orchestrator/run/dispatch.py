"""Batch tasks for the nodes with data waiting: one batch at a time per node (an
operator instance), on the queue its placement names.

The sink's merge (a fold of small partials into PostgreSQL, no Spark job) goes to the
control workers, so the output never waits behind a Spark job; anything else to any
Spark worker, unless a hot rescale placed the instance on a worker of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from balancer.topology import Topology
from orchestrator.ledger.segments import NodeFlow
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.route_store import RouteStore

# (run id, node, its routing table, the queue or None for any Spark worker) -> a handle
Dispatcher = Callable[[int, str, dict[str, Any], Any], Any]


@dataclass
class Dispatch:
    started: float
    handle: Any

    def may_complete(self, now: float, *, held: bool = False) -> bool:
        """The batch has not reported yet and still can: it was sent less than a lease
        ago (it may be waiting in its queue), or its node's segments are under a live
        lease (its worker renews it while the batch runs). One silent for a lease with
        nothing held cannot: e.g. sent to the queue of a worker that died."""
        ready = getattr(self.handle, "ready", None)
        finished = True if ready is None else bool(ready())
        return not finished and (held or now - self.started < settings.BPCONSOLE_LEASE_S)


class BatchDispatch:
    def __init__(self, run_id: int, send: Dispatcher, routes: RouteStore) -> None:
        self.run_id = run_id
        self.send = send
        self.routes = routes
        self.in_flight: dict[str, Dispatch] = {}

    def dispatch_ready(
        self,
        now: float,
        flows: Mapping[str, NodeFlow],
        topology: Topology,
        rescale: RescaleControl | None,
    ) -> None:
        for node, flow in flows.items():
            if flow.arrived_waiting == 0 or (
                topology.has_node(node) and topology.node(node).kind == "source"
            ):
                continue
            current = self.in_flight.get(node)
            # A task that never reports (its worker died before running it) is replaced
            # after a lease.
            if current is not None and current.may_complete(now, held=flow.held > 0):
                continue
            placed = rescale.queue_for(node) if rescale is not None else None
            if placed is not None:
                queue: Any = placed
            elif topology.has_node(node) and topology.node(node).kind == "sink":
                queue = "control"
            else:
                queue = None
            handle = self.send(self.run_id, node, self.routes.get(node).to_json(), queue)
            self.in_flight[node] = Dispatch(now, handle)

    def running(self, now: float) -> bool:
        return any(d.may_complete(now) for d in self.in_flight.values())
