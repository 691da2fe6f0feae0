"""The drivers of one control worker, each in a thread of its own beside the pool.

A driver lives as long as its run, days for a stream, and spends most of that waiting
for data. In the worker's pool each would hold one of its few threads, and a handful of
idle stream runs would leave none for another run's driver, the watchdog or a policy
lab. So the task that starts a driver (``orchestrator.tasks.drive_run``) only hands the
run to this process's :class:`DriverThreads` and returns: the pool stays free for the
short tasks, and a waiting driver costs a sleeping thread.

The worker's drivers are bounded (``BPCONSOLE_DRIVERS_PER_WORKER``): past it a run is
not taken, and the watchdog sends it again (to this or another control worker) as it
does for any run without a driver. A driver thread ends with its run, when a newer
driver supersedes it, or when the worker stops (it sees the stop and gives its run up,
its lock released): :meth:`DriverThreads.join` waits for them as the worker shuts down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connections

log = logging.getLogger(__name__)

# How long a worker that shuts down waits for its drivers to give their runs up.
JOIN_S = 30.0


@dataclass
class DriverThreads:
    """The runs this process drives, each in a thread named after it."""

    limit: int
    threads: dict[int, threading.Thread] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, run_id: int, drive: Callable[[], str]) -> str:
        """Drive ``run_id`` in a thread of its own: ``drive`` runs there until the run
        ends. Returns what became of the request: ``"started"``, or why not (this
        process drives the run already, or as many runs as it may)."""
        with self.lock:
            self._forget_ended()
            if run_id in self.threads:
                return "this worker drives the run already"
            if len(self.threads) >= self.limit:
                return f"this worker drives {self.limit} runs, its most"
            # A daemon: a driver still going when the worker's shutdown has waited
            # JOIN_S for it (one waiting for a database that went away with the
            # machine's services) must not keep the process up; it ends with it, its
            # lock with its ZooKeeper session, as when the worker is killed.
            thread = threading.Thread(
                target=self._run, args=(run_id, drive), name=f"driver-run-{run_id}", daemon=True
            )
            self.threads[run_id] = thread
            thread.start()
        return "started"

    def _run(self, run_id: int, drive: Callable[[], str]) -> None:
        try:
            outcome = drive()
            log.info("run %s: driver finished: %s", run_id, outcome)
        except Exception:
            # The run keeps its status; the watchdog gives it another driver.
            log.exception("run %s: driver failed", run_id)
        finally:
            # This thread's database connections, which no pool task will close.
            connections.close_all()
            with self.lock:
                if self.threads.get(run_id) is threading.current_thread():
                    del self.threads[run_id]

    def _forget_ended(self) -> None:
        for run_id in [r for r, t in self.threads.items() if not t.is_alive()]:
            del self.threads[run_id]

    def running(self) -> list[int]:
        with self.lock:
            self._forget_ended()
            return sorted(self.threads)

    def join(self, timeout_s: float = JOIN_S) -> list[int]:
        """Wait for every driver to end (each sees its worker stopping); the runs of
        those still going after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            threads = list(self.threads.items())
        for _, thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sorted(run_id for run_id, thread in threads if thread.is_alive())
