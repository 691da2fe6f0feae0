"""Which segment's output holds a good record's partial, when a batch's segments are
aggregated together (``together``: segment id -> the segment whose output holds its
partial): the same rule for every aggregating job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F

from sparkjobs.records import SEGMENT_COL, file_name, segment_of


@dataclass(frozen=True)
class Holders:
    """Where the good records of a batch whose segments are aggregated together go:
    ``of``, a record's holder from its own segment; ``sole``, the one segment that holds
    them all, whose good records are then keyed by null (``of`` is null), so that the
    job hashes and keeps no file name per record."""

    of: Column
    sole: str | None


def holders_of(paths: Mapping[str, str], together: Mapping[str, str]) -> Holders | None:
    """The segment whose output holds a record's partial, from the record's own
    (``SEGMENT_COL``); None when each segment holds its own."""
    names = {
        Path(path).name: Path(paths[together.get(seg, seg)]).name for seg, path in paths.items()
    }
    held = set(names.values())
    if all(own == holds for own, holds in names.items()):
        return None
    if len(held) == 1:
        return Holders(of=F.lit(None).cast("STRING"), sole=segment_of(held.pop()))
    lookup = F.create_map(*[F.lit(name) for pair in sorted(names.items()) for name in pair])
    return Holders(of=F.element_at(lookup, file_name(F.col(SEGMENT_COL))), sole=None)


def held_by(segment: str | None, holders: Holders | None) -> str:
    """The segment a good group's partial goes to: its own, or the sole holder's."""
    if segment is not None:
        return segment_of(segment)
    if holders is None or holders.sole is None:
        raise ValueError("a partial of no segment, though no one segment holds the batch's")
    return holders.sole
