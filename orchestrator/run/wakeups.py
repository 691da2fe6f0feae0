"""A run's driver woken the moment one of the run's batches ends, not at its next poll.

The driver loops every ``LOOP_S`` (0.1 s): it reads the ledger, sends the batches that
are ready and settles a run whose last merge is in. Between loops it sleeps, so an
operator batch's outputs waited up to a loop for their sink's batch, and a run's last
merge up to a loop for the run to settle: measured on a bounded run of 512 MB, 0.10 to
0.14 s from the operator batch's commit to the sink's merge starting, 0.05 to 0.06 s
now (docs/benchmarks.md, "2026-11-29 (sixth)").

A batch task that ends, however it ends, sends a PostgreSQL notification on its run's
channel (Celery's ``task_postrun``, after its result is stored, so the driver that
wakes sees the task finished). The driver's sleep listens on that channel on a
connection of its own and ends at the first notification. A notification is only a
hint: the loop still reads everything from the ledger, and a lost one (the listening
connection broke, the database restarted) costs what it always cost, one loop.

Whoever waits for a run to end (``run_pipeline --wait``, the benchmarks) listens on the
same channel (``wait_until_ended``): the run's end is announced too, so a waiter sees it
at once instead of at its next poll, and does not take CPU from the run it waits for by
reading its status many times a second.
"""

from __future__ import annotations

import logging
import time

import psycopg
from django.db import DatabaseError, connection, transaction
from psycopg import sql

log = logging.getLogger(__name__)

# After the database refused a listening connection, how long the driver only polls
# before it tries again: connecting is not retried on every loop.
RETRY_S = 5.0


def channel(run_id: int) -> str:
    return f"bpconsole_run_{int(run_id)}"


def announce(run_id: int) -> None:
    """Tell the run's driver that something of the run has changed in the ledger. Sent
    in the caller's transaction, if any: it is delivered when that commits."""
    try:
        # A savepoint in the caller's transaction: a failure here leaves it usable.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel(run_id)])
    except DatabaseError as err:
        # The driver's next loop reads the ledger anyway.
        log.warning("run %s: could not wake its driver: %s", run_id, err)


def wait_until_ended(run_id: int, timeout_s: float, *, check_s: float = 1.0) -> str:
    """The run's status once it is no longer active, read again whenever the run's
    channel is notified (a batch ended, the status changed, the run settled) and at
    least every ``check_s``, as an end that announced nothing is still seen. Raises
    TimeoutError after ``timeout_s``."""
    from orchestrator.models import Run

    status = Run.objects.filter(pk=run_id).values_list("status", flat=True)
    wakeups = Wakeups(run_id)
    try:
        # Listening before the first read: an end between the two wakes the sleep.
        wakeups.sleep(0)
        deadline = time.monotonic() + timeout_s
        while (now := status.get()) in Run.ACTIVE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run {run_id} is still {now} after {timeout_s:g} s")
            wakeups.sleep(min(check_s, left))
        return str(now)
    finally:
        wakeups.close()


class Wakeups:
    """Sleeps of one run's driver that end when the run's channel is notified."""

    def __init__(self, run_id: int) -> None:
        self.channel = channel(run_id)
        self._listener: psycopg.Connection | None = None
        self._retry_at = 0.0

    def sleep(self, seconds: float) -> bool:
        """Up to ``seconds``; True when a notification ended it (those that came
        meanwhile are taken with it)."""
        listener = self._listening()
        if listener is None:
            time.sleep(seconds)
            return False
        try:
            woken = any(True for _ in listener.notifies(timeout=seconds, stop_after=1))
            if woken:  # several batches ended at once: one loop sees them all
                for _ in listener.notifies(timeout=0):
                    pass
            return woken
        except psycopg.Error as err:
            log.warning("%s: listening failed, the driver polls: %s", self.channel, err)
            self.close()
            return False

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None

    def _listening(self) -> psycopg.Connection | None:
        """A connection of its own, as Django would open it, listening on the channel;
        None while the database cannot be reached (the caller sleeps instead)."""
        if self._listener is not None and not self._listener.closed:
            return self._listener
        if time.monotonic() < self._retry_at:
            return None
        try:
            listener: psycopg.Connection = connection.get_new_connection(
                connection.get_connection_params()
            )
            listener.autocommit = True
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except (psycopg.Error, DatabaseError) as err:
            log.warning("%s: cannot listen, the driver polls: %s", self.channel, err)
            self._retry_at = time.monotonic() + RETRY_S
            return None
        self._listener = listener
        return listener
