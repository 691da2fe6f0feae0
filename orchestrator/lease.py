"""A worker keeps the lease of the batch it is running alive.

A lease that only had to outlive the batch made the batch size a function of the lease:
a batch running longer was reclaimed and run a second time (its completion refused),
and a short lease, which finds a dead worker sooner, capped batches. The keeper renews
the lease every third of it while the batch runs, so the lease only has to outlive a
worker's silence. A worker that dies stops renewing with it; one that hangs stops after
``max_hold_s`` and its batch goes back to the pool like a dead worker's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from django.db import DatabaseError, connection

from orchestrator import ledger

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self, segment_ids: Sequence[str], owner: str, *, lease_s: float, max_hold_s: float
    ) -> None:
        self.segment_ids = list(segment_ids)
        self.owner = owner
        self.lease_s = lease_s
        self.max_hold_s = max_hold_s
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
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
        deadline = time.monotonic() + self.max_hold_s
        try:
            while not self._stop.wait(self.lease_s / 3):
                if time.monotonic() >= deadline:
                    log.warning("%s: batch held %.0f s; its lease is left to expire",
                                self.owner, self.max_hold_s)  # fmt: skip
                    return
                try:
                    held = ledger.renew_lease(self.segment_ids, self.owner, self.lease_s)
                except DatabaseError:
                    # The lease has two more thirds to go: try again next time.
                    log.warning("%s: could not renew the lease", self.owner, exc_info=True)
                    continue
                if held < len(self.segment_ids):
                    # Reclaimed (the completion will be refused and say so) or just
                    # completed: nothing left to keep.
                    log.info("%s: %d of %d segments no longer held", self.owner,
                             len(self.segment_ids) - held, len(self.segment_ids))  # fmt: skip
                    return
                self.renewals += 1
        finally:
            # Django opened a connection for this thread; nobody else will close it.
            connection.close()
