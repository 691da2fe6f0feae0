"""A thread that runs beside a batch on a worker, every few seconds, until the batch ends.

The lease keeper (``orchestrator/worker/lease.py``) and the stop watch
(``orchestrator/worker/stopwatch.py``) each need one: started when the batch starts, woken every
``interval_s``, stopped and joined when it ends, and owning the Django connection its
queries opened.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self

from django.db import connection


class BesideBatch:
    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> bool:
        """One round of work; False when there is nothing more to do for this batch."""
        raise NotImplementedError

    def started(self) -> None:
        """Called as the batch starts, before the first tick."""

    def __enter__(self) -> Self:
        self.started()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                if not self.tick():
                    return
        finally:
            # Django opened a connection for this thread; nobody else will close it.
            connection.close()
