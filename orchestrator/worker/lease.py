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
import time
from collections.abc import Sequence

from django.db import DatabaseError

from orchestrator.ledger import segments
from orchestrator.worker.beside_batch import BesideBatch

log = logging.getLogger(__name__)


class LeaseKeeper(BesideBatch):
    def __init__(
        self, segment_ids: Sequence[str], owner: str, *, lease_s: float, max_hold_s: float
    ) -> None:
        super().__init__(lease_s / 3, "lease-keeper")
        self.segment_ids = list(segment_ids)
        self.owner = owner
        self.lease_s = lease_s
        self.max_hold_s = max_hold_s
        self.renewals = 0
        self.deadline = 0.0

    def started(self) -> None:
        self.deadline = time.monotonic() + self.max_hold_s

    def tick(self) -> bool:
        if time.monotonic() >= self.deadline:
            log.warning(
                "%s: batch held %.0f s; its lease is left to expire", self.owner, self.max_hold_s
            )
            return False
        try:
            held = segments.renew_lease(self.segment_ids, self.owner, self.lease_s)
        except DatabaseError:
            # The lease has two more thirds to go: try again next time.
            log.warning("%s: could not renew the lease", self.owner, exc_info=True)
            return True
        if held < len(self.segment_ids):
            # Reclaimed (the completion will be refused and say so) or just
            # completed: nothing left to keep.
            log.info(
                "%s: %d of %d segments no longer held",
                self.owner,
                len(self.segment_ids) - held,
                len(self.segment_ids),
            )
            return False
        self.renewals += 1
        return True
