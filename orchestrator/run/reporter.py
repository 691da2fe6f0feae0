"""Off the balancer's critical path: events to PostgreSQL, routes and node states to
ZooKeeper, and the live snapshot (published to the run's viewers and kept in Redis for
those who connect later: orchestrator/run/publisher.py).

The tick hands over what it decided and moves on; this thread writes the states and
publishes the snapshot. When it falls behind, only the newest report is kept: viewers
want the present, not a backlog.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import connection

from balancer.model import NodeState
from orchestrator.models import Event, Run
from orchestrator.run.publisher import Publisher
from orchestrator.run.route_store import RouteStore, RouteTables
from orchestrator.run.snapshot import SNAPSHOT_FIELDS, build_snapshot
from orchestrator.source.base import LagJson
from orchestrator.zk.control_plane import ControlPlane

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    node_states: Mapping[str, NodeState]
    routes: RouteTables
    lag: LagJson | None = None  # what waits outside an unbounded source


class Reporter(threading.Thread):
    def __init__(
        self,
        run_id: int,
        control: ControlPlane,
        routes: RouteStore,
        publish: Publisher,
    ) -> None:
        super().__init__(name="run-reporter", daemon=True)
        self.run_id = run_id
        self.control, self.routes, self.publish = control, routes, publish
        self.inbox: queue.Queue[Report | None] = queue.Queue(maxsize=1)
        # Events are never dropped, unlike reports: they wait here until written.
        self.events: list[Event] = []
        self.events_lock = threading.Lock()

    def add_events(self, events: list[Event]) -> None:
        with self.events_lock:
            self.events.extend(events)

    def write_events(self) -> None:
        """Write the waiting events, from whichever thread calls (each has its own
        database connection); the lock keeps their order."""
        with self.events_lock:
            if self.events:
                Event.objects.bulk_create(self.events)
                self.events = []

    def submit(self, report: Report) -> None:
        while True:
            try:
                self.inbox.put_nowait(report)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.inbox.get_nowait()  # drop the stale one

    def stop(self) -> None:
        """Finish the report in hand, then end (a pending one is dropped)."""
        with contextlib.suppress(queue.Empty):
            self.inbox.get_nowait()
        self.inbox.put(None)
        self.join(timeout=30)

    def run(self) -> None:
        try:
            while (report := self.inbox.get()) is not None:
                try:
                    self.write_events()
                    self._store(report)
                    self._publish(report)
                except Exception:
                    log.warning("could not report a tick", exc_info=True)
            self.write_events()
        finally:
            connection.close()  # this thread's own database connection

    def _store(self, report: Report) -> None:
        """Routes (fenced by the epoch) and node states, to ZooKeeper."""
        self.routes.store(report.routes)
        self.control.write_states(str(self.run_id), report.node_states)

    def _publish(self, report: Report) -> None:
        """The snapshot of one tick, to the run's viewers."""
        fields = (*SNAPSHOT_FIELDS, "topology", "policy", "input_spec", "pipeline_name")
        run = Run.objects.only(*fields).get(pk=self.run_id)
        snapshot = build_snapshot(
            run, node_states=report.node_states, routes=report.routes, lag=report.lag
        )
        self.publish(self.run_id, snapshot)
