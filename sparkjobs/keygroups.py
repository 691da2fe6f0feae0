"""Key groups of a keyed (stateful) stage: a key's slot, and the slots a part owns.

A key's slot is ``crc32(utf-8 key) mod KEY_SLOTS`` — the same number in Python (the
state table) and in Spark (the filter a part applies), so an instance keeps exactly the
keys its key group owns; a group's is its values' (:func:`group_slot`). Parts own
contiguous slot ranges in their stage's declaration order: even ones
(``balancer.rescale.even_key_groups``), unless a key-group move gave each member its own
range (``key_slots`` on the node in a run's graph, :func:`stage_key_groups`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from balancer.rescale import key_group

KEY_SLOTS = 128


# A group of several fields is keyed by its values joined by this character (a null
# as the empty text): one field's group has the slot of its value, as a key has.
GROUP_SEPARATOR = "\x1f"


def slot_of(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) % KEY_SLOTS


def group_slot(group: Sequence[str | None]) -> int:
    """The slot of a group of grouped measures (its values, in ``group_by``'s order)."""
    return slot_of(GROUP_SEPARATOR.join("" if v is None else v for v in group))


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


def stage_key_groups(
    members: Sequence[str], declared: Mapping[str, Sequence[int]]
) -> dict[str, KeyGroup]:
    """Each member's key group: its declared ``[low, high)`` when the members' declared
    ranges, in order, split the whole slot space into non-empty contiguous parts; even
    ranges otherwise (a stage whose members changed since its last key-group move)."""
    groups: dict[str, KeyGroup] = {}
    low = 0
    for member in members:
        slots = declared.get(member)
        if slots is None or len(slots) != 2 or slots[0] != low or not low < slots[1]:
            break
        groups[member] = KeyGroup(low, slots[1])
        low = slots[1]
    if len(groups) == len(members) and low == KEY_SLOTS:
        return groups
    return {m: KeyGroup.even(i, len(members)) for i, m in enumerate(members)}
