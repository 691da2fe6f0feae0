"""A worker stops a batch's Spark jobs the moment its run stops or fails.

Without it a stopped run's batch ran to the end (17 s, measured), and a failed run's
other batches went on writing. The batch's jobs run in a Spark job group named for
the run; a thread polls the run's status and cancels the group as soon as the run is
no longer active. Spark interrupts the group's tasks and the batch's call raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DatabaseError

from orchestrator.models import Run
from orchestrator.worker.beside_batch import BesideBatch

log = logging.getLogger(__name__)

POLL_S = 0.25


def job_group(run_id: int) -> str:
    return f"bpconsole-run-{run_id}"


class StopWatch(BesideBatch):
    def __init__(self, run_id: int, cancel: Callable[[], None], *, poll_s: float = POLL_S) -> None:
        super().__init__(poll_s, "stop-watch")
        self.run_id = run_id
        self.cancel = cancel

    def tick(self) -> bool:
        try:
            status = Run.objects.filter(pk=self.run_id).values_list("status", flat=True).first()
        except DatabaseError:
            return True  # the batch's own writes will say whether the database is gone
        if status in Run.ACTIVE:
            return True
        log.info("run %s is %s: cancelling its Spark jobs", self.run_id, status)
        self.cancel()
        return False
