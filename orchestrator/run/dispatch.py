"""Batch tasks for the nodes with data waiting: one batch at a time per node (an
operator instance), on the queue its placement names.

The sink's merge (a fold of small partials into PostgreSQL, no Spark job) goes to the
control workers, so the output never waits behind a Spark job; anything else to any
Spark worker, unless a hot rescale placed the instance on a worker of its own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from kombu import Queue
from kombu.exceptions import OperationalError as BrokerError

from balancer.runtime import placed_batch_bytes
from balancer.units import MB
from orchestrator.ledger import segments
from orchestrator.ledger.segments import NodeFlow
from orchestrator.pipeline.graph import RunGraph
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.broker_watch import BrokerWatch
from orchestrator.run.route_store import RouteStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchRequest:
    """A batch task as the driver sends it (``orchestrator/worker/batch.py``)."""

    node: str
    routes: dict[str, Any]  # the node's routing table
    # Its placed worker's queue, "control" for the sink, None for any Spark worker.
    queue: Queue | str | None
    # The routing tables of the stage siblings whose data the batch may take with its own.
    siblings: dict[str, dict[str, Any]]
    # The most it claims: the balancer's bound and, placed, half its pool; else None.
    max_bytes: int | None


# (run id, the batch) -> a handle on the task sent
Dispatcher = Callable[[int, BatchRequest], Any]

# Redis (the broker and the result backend) restarting: a batch's state is unknown and
# none can be sent until it is back; the run waits, it does not fail.
BROKER_ERRORS = (BrokerError, redis.RedisError, ConnectionError)

# How often the batches in flight are asked whether they failed (one read of the result
# backend each) and Redis whether it restarted.
CHECK_S = 0.5
# The longest an operator's batch waits to fill while its source still has data to send
# at once (``dispatch_ready``).
LINGER_S = 0.5


@dataclass
class Dispatch:
    started: float
    handle: Any

    def may_complete(self, now: float, *, held: bool = False) -> bool:
        """The batch has not reported yet and still can: it was sent less than a lease
        ago (it may be waiting in its queue), or its node's segments are under a live
        lease (its worker renews it while the batch runs). One silent for a lease with
        nothing held cannot: e.g. sent to the queue of a worker that died."""
        return not self.finished() and (
            held or now - self.started < settings.BPCONSOLE_QUEUED_BATCH_S
        )

    def failed_task(self) -> str | None:
        """The task's id once it failed: its process died under it (Celery reports
        ``WorkerLostError``) or it gave up retrying."""
        failed = getattr(self.handle, "failed", None)
        try:
            return str(self.handle.id) if failed is not None and failed() else None
        except BROKER_ERRORS:
            return None

    def finished(self) -> bool:
        ready = getattr(self.handle, "ready", None)
        try:
            return ready is None or bool(ready())
        except BROKER_ERRORS:
            return False


class BatchDispatch:
    def __init__(
        self,
        run_id: int,
        send: Dispatcher,
        routes: RouteStore,
        bounds: Mapping[str, float] | None = None,
    ) -> None:
        self.run_id = run_id
        self.send = send
        self.routes = routes
        # The most each node's next batch claims where the balancer bounds it (bytes).
        self.bounds: Mapping[str, float] = bounds if bounds is not None else {}
        self.in_flight: dict[str, Dispatch] = {}
        # Batches sent again while the first was presumed lost: the first may still run
        # (it was only waiting long in its queue), and may still die under its batch.
        self.replaced: list[Dispatch] = []
        self.next_check = 0.0
        self.broker = BrokerWatch(settings.CELERY_BROKER_URL)
        # Since when a node's next batch has waited to fill, and when its last batch was
        # sent (``dispatch_ready``).
        self.filling_since: dict[str, float] = {}
        self.last_sent: dict[str, float] = {}

    def dispatch_ready(
        self,
        now: float,
        flows: Mapping[str, NodeFlow],
        graph: RunGraph,
        rescale: RescaleControl | None,
        *,
        source_sending: bool,
    ) -> None:
        """A batch task for each node with data waiting and none in flight.

        A batch of an operator any Spark worker may run takes its fusable siblings'
        data with its own (``orchestrator/worker/batch.py``), so no more of a stage's
        fusable members have batches in flight than the Spark workers run at once
        (:meth:`RescaleControl.spark_slots`). One queued behind a running batch would
        start the moment that batch ends and take only what had arrived by then, before
        the source saw the room the batch made: a bounded run of 1 GB ran batches of
        512, 464 and 48 MB, the last one 1 s of its 10 (docs/benchmarks.md, "one batch
        per Spark worker").

        While the source has more to send at once (``source_sending``: its last slice
        ended with data left, not for want of data, rate or room), an operator's batch
        waits for its stage's data to fill one (``BPCONSOLE_BATCH_MB``), up to
        ``LINGER_S``. A batch costs a second or so beside its bytes (the job's planning,
        the sets of every key built, sorted and merged by the sink whatever the batch's
        size), and a bounded run of 1 GB whose first batch took the 432 MB the source's
        first slice had sent ran a third batch of 80 MB at the end, 1.9 s of a 12.5 s
        run (docs/benchmarks.md, "a batch waits to fill"). A source at its own pace, or
        held by a full pool or its rate, sends nothing at once: no batch waits then."""
        if now >= self.next_check:
            self.take_over_failed(now)
            if self.broker.restarted():
                self.forget_unheld(flows)
            self.next_check = now + CHECK_S
        slots = rescale.spark_slots() if rescale is not None else 1
        # The member sent a batch longest ago first: with one slot for a stage, a member
        # whose data no sibling's batch may take (aligning in a hot rescale, at another
        # configuration) still gets its turn while the others always have data waiting.
        for node, flow in sorted(
            flows.items(), key=lambda item: self.last_sent.get(item[0], -math.inf)
        ):
            kind = graph.nodes[node]["kind"] if node in graph.nodes else None
            if flow.arrived_waiting == 0 or kind == "source":
                continue
            # A task that never reports (its worker died before running it) is replaced
            # after a lease.
            if self._busy(node, now, flows):
                continue
            current = self.in_flight.get(node)
            placed = rescale.queue_for(node) if rescale is not None else None
            if placed is None and self._slots_taken(node, now, flows, graph, rescale, slots=slots):
                continue
            if current is None and self._fills(
                node, kind, now, flows, graph, source_sending=source_sending
            ):
                continue
            if current is not None:
                # Freed before the next batch is sent, so that batch can take them
                self._retire(current)
                del self.in_flight[node]
            siblings: dict[str, dict[str, Any]] = {}
            queue: Queue | str | None = None
            if placed is not None:
                queue = placed
            elif kind == "sink":
                queue = "control"
            else:
                siblings = self._unplaced_siblings(node, graph, rescale)
            bound = self.bounds.get(node)
            if placed is not None:
                pool = placed_batch_bytes(graph.topology.node(node).capacity_bytes)
                bound = pool if bound is None else min(bound, pool)
            request = BatchRequest(
                node,
                self.routes.get(node).to_json(),
                queue,
                siblings,
                None if bound is None else max(1, int(bound)),
            )
            try:
                handle = self.send(self.run_id, request)
            except BROKER_ERRORS as err:
                log.warning(
                    "run %s: batch of %s not sent (broker down?): %s", self.run_id, node, err
                )
                return  # tried again next loop
            self.in_flight[node] = Dispatch(now, handle)
            self.last_sent[node] = now
            self.filling_since.pop(node, None)

    def _slots_taken(
        self,
        node: str,
        now: float,
        flows: Mapping[str, NodeFlow],
        graph: RunGraph,
        rescale: RescaleControl | None,
        *,
        slots: int,
    ) -> bool:
        """Whether as many of ``node``'s fusable siblings on the shared queue have a
        batch in flight as the Spark workers run at once (``slots``)."""
        busy = sum(
            1
            for sibling in graph.fusable_with(node)
            # One placed on a worker of its own runs its batches there.
            if (rescale is None or rescale.queue_for(sibling) is None)
            and self._busy(sibling, now, flows)
        )
        return busy >= slots

    def _busy(self, node: str, now: float, flows: Mapping[str, NodeFlow]) -> bool:
        """Whether ``node``'s batch in flight may still complete
        (:meth:`Dispatch.may_complete`: its data held under a lease counts)."""
        current = self.in_flight.get(node)
        held = node in flows and flows[node].held > 0
        return current is not None and current.may_complete(now, held=held)

    def _fills(
        self,
        node: str,
        kind: str | None,
        now: float,
        flows: Mapping[str, NodeFlow],
        graph: RunGraph,
        *,
        source_sending: bool,
    ) -> bool:
        """Whether ``node`` (of ``kind``, None if not in ``graph``) has its next batch
        wait to fill (``dispatch_ready``)."""
        if not source_sending or kind is None:
            self.filling_since.pop(node, None)
            return False
        if kind != "operator":
            return False
        members = graph.stage_members(graph.stage_of[node]) or (node,)
        waiting = sum(flows[m].waiting_bytes for m in members if m in flows)
        if waiting >= settings.BPCONSOLE_BATCH_MB * MB:
            return False
        return now - self.filling_since.setdefault(node, now) < LINGER_S

    def _unplaced_siblings(
        self, node: str, graph: RunGraph, rescale: RescaleControl | None
    ) -> dict[str, dict[str, Any]]:
        """The routing tables of ``node``'s stage members that any Spark worker may
        run: those a batch of ``node`` may take data from (the worker decides which of
        them the graph lets one job run). Not an instance a hot rescale placed on a
        worker of its own: its data stays there."""
        if node not in graph.nodes:
            return {}
        return {
            member: self.routes.get(member).to_json()
            for member in graph.stage_members(graph.stage_of[node])
            if member != node and (rescale is None or rescale.queue_for(member) is None)
        }

    def take_over_failed(self, now: float) -> None:
        """A batch whose task failed goes back to its node's pool at once: a Spark
        worker process killed mid-batch costs a second, not a whole lease."""
        for node, current in list(self.in_flight.items()):
            task = current.failed_task()
            if task is not None:
                segments.release_task(self.run_id, task)
                del self.in_flight[node]
        replaced, self.replaced = self.replaced, []
        for old in replaced:
            if now - old.started < settings.BPCONSOLE_BATCH_MAX_S:
                self._retire(old)  # a lost message never reports: given up after that

    def _retire(self, dispatch: Dispatch) -> None:
        """A dispatch no longer the node's current one: what its task held is freed if
        it failed; one that may still run (it only waited long in its queue) is watched,
        as it may still die under its batch."""
        task = dispatch.failed_task()
        if task is not None:
            segments.release_task(self.run_id, task)
        elif not dispatch.finished():
            self.replaced.append(dispatch)

    def forget_unheld(self, flows: Mapping[str, NodeFlow]) -> None:
        """Redis restarted empty: a batch not running yet (its node holds nothing) was
        lost with its queue, and is sent again now. A running one reports to the new
        server when it ends."""
        for node in list(self.in_flight):
            flow = flows.get(node)
            if flow is None or flow.held == 0:
                del self.in_flight[node]
        log.warning("run %s: Redis restarted; batches that were queued are sent again", self.run_id)

    def running(self, now: float) -> bool:
        return any(d.may_complete(now) for d in self.in_flight.values())
