"""What a live run's keyed stages weigh, for the balancer's key-group moves.

A slot's weight is the records of its keys per byte of input its owner took, over the
interval between two reads: every instance of a keyed stage reads every segment (each
keeps the records of its own key group), so the bytes an instance processed say how far
it got through the input, and its keys' records over them say how heavy they are
whether the instance keeps up or lags (records counted from state alone would make a
lagging hot instance look light). Both come from one snapshot of the ledger
(``keystate.progress``), so they count the same batches.

Reads are for keyed stages of two instances or more with a member under pressure
(flagged, or its pool past ``bp_threshold``), at most every :data:`READ_EVERY_S`, never
while an adjustment runs; a read after the key groups changed, or across a window
close or a retention sweep (state or done segments dropped), only starts the next
interval.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from balancer.model import KeyLoad
from orchestrator.ledger import keystate
from orchestrator.pipeline.graph import RunGraph
from sparkjobs.keygroups import KEY_SLOTS

READ_EVERY_S = 2.0


@dataclass(frozen=True)
class _Read:
    groups: Mapping[str, tuple[int, int]]
    progress: keystate.Progress


class KeyLoads:
    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.read_at = -math.inf
        self.last: dict[str, _Read] = {}

    def read(
        self, graph: RunGraph, pressed: Collection[str], *, adjusting: bool, now: float
    ) -> dict[str, KeyLoad]:
        """Each keyed stage's load over the interval since its last read, when due."""
        if adjusting or now - self.read_at < READ_EVERY_S:
            return {}
        loads: dict[str, KeyLoad] = {}
        for stage, members in graph.stages.items():
            if len(members) < 2 or not graph.is_keyed(members[0]):
                continue
            if not set(members) & set(pressed):
                continue
            self.read_at = now
            groups = {m: (g.low, g.high) for m, g in graph.key_groups(stage).items()}
            last = self.last.get(stage)
            current = _Read(groups, keystate.progress(self.run_id, stage, list(members)))
            self.last[stage] = current
            if last is not None and last.groups == groups:
                load = _between(last.progress, current.progress, groups)
                if load is not None:
                    loads[stage] = load
        return loads


def _between(
    last: keystate.Progress, current: keystate.Progress, groups: Mapping[str, tuple[int, int]]
) -> KeyLoad | None:
    """Each slot's records per input byte of its owner between two reads, in records
    at the members' mean progress; None when a member took no input meanwhile or state
    was dropped."""
    took = {m: current.done_bytes.get(m, 0) - last.done_bytes.get(m, 0) for m in groups}
    if min(took.values()) <= 0:
        return None
    by_slot = [0.0] * KEY_SLOTS
    for (holder, slot), count in current.records.items():
        by_slot[slot] += count - last.records.get((holder, slot), 0)
    for (holder, slot), count in last.records.items():
        if (holder, slot) not in current.records:
            by_slot[slot] -= count
    if min(by_slot) < 0:
        return None
    mean = sum(took.values()) / len(took)
    weights = list(by_slot)
    for member, (low, high) in groups.items():
        for slot in range(low, high):
            weights[slot] = by_slot[slot] / took[member] * mean
    return KeyLoad(dict(groups), tuple(weights))
