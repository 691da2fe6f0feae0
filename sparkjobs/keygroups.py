"""Key groups of a keyed (stateful) stage: a key's slot, and the slots a part owns.

A key's slot is ``crc32(utf-8 key) mod KEY_SLOTS`` — the same number in Python (the
state table) and in Spark (the filter a part applies), so an instance keeps exactly the
keys its key group owns. Parts own even contiguous slot ranges, as the planner assigns
them (``balancer.rescale.even_key_groups``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from balancer.rescale import key_group

KEY_SLOTS = 128


def slot_of(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) % KEY_SLOTS


@dataclass(frozen=True)
class KeyGroup:
    """Key slots ``[low, high)``. Only the group holding slot 0 counts malformed
    records, so a record broadcast to every group is counted once."""

    low: int = 0
    high: int = KEY_SLOTS

    @classmethod
    def even(cls, part: int, parts: int) -> KeyGroup:
        slots = key_group(part, parts, KEY_SLOTS)
        return cls(slots.start, slots.stop)

    @property
    def slots(self) -> range:
        return range(self.low, self.high)

    @property
    def whole(self) -> bool:
        return self.low == 0 and self.high == KEY_SLOTS

    @property
    def counts_malformed(self) -> bool:
        return self.low == 0

    def intersect(self, other: KeyGroup) -> KeyGroup | None:
        low, high = max(self.low, other.low), min(self.high, other.high)
        return KeyGroup(low, high) if low < high else None
