"""Merged ranges coalesced: a continuous run's ledger does not grow with its age.

Every merged chunk (or key-group part of one) is a row, so that coverage can check the
input is tiled exactly once and the unique constraint refuses a second merge. A run that
goes on for days would keep millions of them. But chunks are emitted in input order, each
continuing where the one before ended, so the chunks ``0 .. n-1`` of a run, once every
part of each is merged, tile the input exactly from its start to one position: the
*merged prefix* (chunk count, file, offset), kept on the run. Its rows can go.

A chunk joins the prefix only when, checked again here, its parts tile the key slots
exactly once and its origin continues the prefix (same file and offset, or the start of
a later file with every file between empty), every part was merged at least
``older_than_s`` ago (recent merges stay visible to what reads them: an adjustment's
outcome, the freshness benchmark), and no segment of it is unfinished. A merge of a
chunk below the prefix is refused (``complete_sink_batch``), as the unique constraint
refused it while its row was there.

Bounded runs keep their rows: they end, and their completion curve is drawn from them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from orchestrator.ledger.ingested import ingested_extent
from orchestrator.models import MergedChunk, Run, Segment
from sparkjobs.keygroups import KEY_SLOTS

# Most chunks one call folds in, so the driver's loop never waits long.
MAX_CHUNKS = 20_000


@dataclass(frozen=True)
class Prefix:
    """Chunks below ``chunk`` are merged; they tile the input up to (file, offset)."""

    chunk: int
    file: int
    offset: int
    parts: int  # rows folded in: the merged parts the run's counts still include
    high_us: int | None = None  # the largest event time up to the prefix (windowed)

    @classmethod
    def of(cls, run: Run, extent: list[tuple[int, int]]) -> Prefix:
        kept = run.merged_prefix or {}
        if kept:
            high = kept.get("high_us")
            return cls(
                int(kept["chunk"]),
                int(kept["file"]),
                int(kept["offset"]),
                int(kept["parts"]),
                None if high is None else int(high),
            )
        return cls(0, 0, extent[0][0] if extent else 0, 0)

    def to_json(self) -> dict[str, int]:
        high = {} if self.high_us is None else {"high_us": self.high_us}
        return {
            "chunk": self.chunk,
            "file": self.file,
            "offset": self.offset,
            "parts": self.parts,
            **high,
        }


def coalesce(run_id: int, *, older_than_s: float, limit: int = MAX_CHUNKS) -> int:
    """Fold the merged chunks that extend the run's merged prefix into it; returns how
    many chunks were folded in."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        extent = ingested_extent(run)
        prefix = Prefix.of(run, extent)
        end = first_unfinished(run, prefix.chunk)
        rows = list(
            MergedChunk.objects.filter(
                run_id=run_id, chunk__gte=prefix.chunk, chunk__lt=min(end, prefix.chunk + limit)
            )
            .order_by("chunk", "slots_from")
            .values_list(
                "pk",
                "chunk",
                "origin_file",
                "origin_offset",
                "origin_length",
                "slots_from",
                "slots_to",
                "merged_at",
                "high_us",
            )
        )
        start = prefix.chunk
        folded: list[int] = []
        at = 0
        while at < len(rows) and rows[at][1] == prefix.chunk:
            parts = [r for r in rows[at:] if r[1] == prefix.chunk]
            _, _, file_index, offset, length, _, _, _, high = parts[0]
            if not (
                tiles_the_slots([(r[5], r[6]) for r in parts])
                and all(r[7] <= cutoff for r in parts)
                and all((r[2], r[3], r[4]) == (file_index, offset, length) for r in parts)
                and _continues(prefix, file_index, offset, extent)
            ):
                break
            folded.extend(r[0] for r in parts)
            prefix = Prefix(
                prefix.chunk + 1,
                file_index,
                offset + length,
                prefix.parts + len(parts),
                high if high is not None else prefix.high_us,
            )
            at += len(parts)
        if not folded:
            return 0
        MergedChunk.objects.filter(pk__in=folded).delete()
        Run.objects.filter(pk=run_id).update(merged_prefix=prefix.to_json())
        return prefix.chunk - start


def first_unfinished(run: Run, start: int = 0) -> int:
    """The first chunk (from ``start`` on) not known to be merged: unfinished, or not
    yet emitted. Every chunk before it is merged exactly once."""
    emitted = int((run.source_position or {}).get("chunk", 0))
    first_open = (
        Segment.objects.filter(run=run, chunk__gte=start)
        .exclude(state=Segment.State.DONE)
        .aggregate(first=Min("chunk"))["first"]
    )
    return min(emitted, first_open) if first_open is not None else emitted


def tiles_the_slots(ranges: list[tuple[int, int]]) -> bool:
    position = 0
    for low, high in sorted(ranges):
        if low != position:
            return False
        position = high
    return position == KEY_SLOTS


def _continues(prefix: Prefix, file_index: int, offset: int, extent: list[tuple[int, int]]) -> bool:
    """Does a chunk starting at (file_index, offset) begin where the prefix ends?"""
    if file_index == prefix.file:
        return offset == prefix.offset
    if file_index < prefix.file or file_index >= len(extent):
        return False
    if prefix.offset != extent[prefix.file][1]:
        return False  # the prefix's file is not read to its end
    between = extent[prefix.file + 1 : file_index]
    return all(start == end for start, end in between) and offset == extent[file_index][0]
