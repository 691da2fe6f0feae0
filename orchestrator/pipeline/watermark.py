"""The source's watermark over its partitions: how far event time has surely moved.

Each partition of a source (a stream of a partitioned Redis source; a bounded input or
a landing folder is one partition) keeps the largest event time read from it. The
watermark is the smallest of those, so a partition that lags in event time (a producer
behind the others, a backlog being caught up) holds it back instead of seeing its
records judged late against another partition's clock: Flink's per-partition
watermark. It never moves back: the watermark after a chunk is the larger of the one
before it and that minimum.

A partition with no record yet holds the watermark where it is, unless it is *idle*:
the source found nothing in it for the run's idle time (a partition nobody writes to
would otherwise stop every window from closing, as Flink's ``withIdleness``). Records
that arrive in a partition after it was left out may then be late; they are
quarantined, never dropped. With one partition the watermark is the largest event
time read so far, as it was before sources had partitions.

The stamps this computes go into the ledger with each chunk (ADR 0006), so lateness is
decided by what the source read and in which order, never by who processed a segment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Watermark:
    """The watermark of a source of ``partitions`` partitions, chunk by chunk."""

    partitions: int = 1
    high_us: int | None = None  # the watermark: the largest stamp given so far
    highs: list[int | None] = field(default_factory=list)  # per partition

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError("a source has at least one partition")
        if not self.highs:
            self.highs = [None] * self.partitions
        if len(self.highs) != self.partitions:
            raise ValueError(f"{len(self.highs)} partition marks for {self.partitions} partitions")

    @classmethod
    def resumed(cls, partitions: int, position: Mapping[str, Any]) -> Watermark:
        """The watermark where a run's position left it (its last chunk in the ledger)."""
        high = position.get("high_us")
        kept = position.get("highs")
        highs: list[int | None] = []
        if isinstance(kept, list) and len(kept) == partitions:
            highs = [None if h is None else int(h) for h in kept]
        elif partitions == 1 and high is not None:
            highs = [int(high)]
        return cls(partitions, None if high is None else int(high), highs)

    def copy(self) -> Watermark:
        return Watermark(self.partitions, self.high_us, list(self.highs))

    def advance(
        self, partition: int, found_us: int | None, idle: Sequence[int] = ()
    ) -> tuple[int | None, int | None]:
        """A chunk of ``partition`` whose largest event time is ``found_us`` (None: it
        has none) was read while the partitions ``idle`` had nothing to give; returns
        its stamps: the watermark before it and after it."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} of a source of {self.partitions}")
        before = self.high_us
        mine = self.highs[partition]
        if found_us is not None:
            self.highs[partition] = found_us if mine is None else max(mine, found_us)
        idle_set = set(idle) - {partition}
        counted = [h for p, h in enumerate(self.highs) if p not in idle_set]
        if counted and all(h is not None for h in counted):
            lowest = min(h for h in counted if h is not None)
            self.high_us = lowest if before is None else max(before, lowest)
        return before, self.high_us

    def to_position(self) -> dict[str, Any]:
        """What the run's position keeps of it (nothing before any event time)."""
        out: dict[str, Any] = {}
        if self.high_us is not None:
            out["high_us"] = self.high_us
        if self.partitions > 1 and any(h is not None for h in self.highs):
            out["highs"] = list(self.highs)
        return out
