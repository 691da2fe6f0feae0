"""A worker stops a batch's Spark jobs the moment its run stops or fails, or the batch
runs past its time limit.

Without it a stopped run's batch ran to the end (17 s, measured), and a failed run's
other batches went on writing. The batch's jobs run in a Spark job group of its own,
named for its run; a thread polls the run's status and cancels the group as soon as
the run is no longer active, or once the batch has run ``max_s``. Spark interrupts the
group's tasks and the batch's call raises.

Spark plans a query (analysis, optimisation, constant folding) in the thread that asks
for its result, before any job exists, and no cancellation reaches it. So the group is
cancelled with its future jobs, and again every poll until the batch ends: a stop or
a time limit that comes while the batch's query is being planned cancels the jobs that
planning ends in as they start. How long planning itself may take is bounded by what
an expression may build (``sparkjobs/expression_budget.py``).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from orchestrator.models import Run
from orchestrator.worker.beside_batch import BesideBatch

log = logging.getLogger(__name__)

POLL_S = 0.25


def job_group(run_id: int) -> str:
    """A new batch's job group: named for its run, and its own, so that cancelling its
    future jobs leaves the run's other batches alone."""
    return f"bpconsole-run-{run_id}-{secrets.token_hex(6)}"


def cancel_group(spark: Any, group: str) -> Callable[[], None]:
    """Cancels the group's running jobs and every job it submits after."""

    def cancel() -> None:
        spark.sparkContext._jsc.sc().cancelJobGroupAndFutureJobs(group, "the batch was stopped")

    return cancel


class BatchTimeLimitError(Exception):
    """A batch that ran past its time limit, its Spark jobs cancelled."""

    def __init__(self, max_s: float) -> None:
        super().__init__(
            f"the batch ran past its time limit of {max_s:.0f} s (BPCONSOLE_BATCH_MAX_S): "
            "its Spark jobs were cancelled"
        )


class StopWatch(BesideBatch):
    def __init__(
        self,
        run_id: int,
        cancel: Callable[[], None],
        *,
        max_s: float = math.inf,
        poll_s: float = POLL_S,
    ) -> None:
        super().__init__(poll_s, "stop-watch")
        self.run_id = run_id
        self.cancel = cancel
        self.max_s = max_s
        self.deadline = math.inf
        self.expired = False
        self.cancelled = False

    def started(self) -> None:
        self.deadline = time.monotonic() + self.max_s

    def tick(self) -> bool:
        # Once cancelled, cancelled again at every tick until the batch ends: Spark
        # cancels a cancelled group's future jobs, but not the stages adaptive execution
        # submits on their own, which a query planned after the stop would start.
        if self.cancelled:
            self.cancel()
            return True
        if time.monotonic() >= self.deadline:
            log.warning(
                "run %s: a batch ran %.0f s: cancelling its Spark jobs", self.run_id, self.max_s
            )
            self.expired = self.cancelled = True
            self.cancel()
            return True
        try:
            status = Run.objects.filter(pk=self.run_id).values_list("status", flat=True).first()
        except DatabaseError:
            return True  # the batch's own writes will say whether the database is gone
        if status in Run.ACTIVE:
            return True
        log.info("run %s is %s: cancelling its Spark jobs", self.run_id, status)
        self.cancelled = True
        self.cancel()
        return True
