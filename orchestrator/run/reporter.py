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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from orchestrator.models import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    node_states: dict[str, dict[str, Any]]
    routes: dict[str, dict[str, Any]]


class Reporter(threading.Thread):
    def __init__(self, store: Callable[[Report], None], publish: Callable[[Report], None]) -> None:
        super().__init__(name="run-reporter", daemon=True)
        self.store = store
        self.publish = publish
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
                    self.store(report)
                    self.publish(report)
                except Exception:
                    log.warning("could not report a tick", exc_info=True)
            self.write_events()
        finally:
            connection.close()  # this thread's own database connection
