"""The one interface the run's pacer reads every source through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

from orchestrator.pipeline.inputs import Chunk


class SourceUnavailable(RuntimeError):
    """The source cannot be reached now (its server is down); nothing was read, so the
    run waits and tries again. The message says what and why."""


class LagJson(TypedDict):
    entries: int
    bytes: int
    age_s: float


@dataclass(frozen=True)
class SourceLag:
    """What has not entered the run's ledger yet: files or stream entries not read, or
    read ahead by the source and not sent on; their bytes (known for files, estimated
    for a stream) and the age of the oldest of them."""

    entries: int = 0
    bytes: int = 0
    age_s: float = 0.0

    def to_json(self) -> LagJson:
        return LagJson(entries=self.entries, bytes=self.bytes, age_s=round(self.age_s, 2))


class Source(Protocol):
    """A run's input, read chunk by chunk from its resume position.

    ``next_chunk`` never blocks: None means nothing is ready now, and only
    ``exhausted`` says nothing ever will be (a bounded input read to its end, or an
    unbounded one told to ``stop``). The pacer calls ``committed`` once the ledger
    holds a chunk, which is when a stream may acknowledge it.
    """

    unbounded: bool
    partitions: int  # each chunk is one partition's (orchestrator.pipeline.watermark)

    def next_chunk(self) -> Chunk | None: ...

    @property
    def exhausted(self) -> bool: ...

    def committed(self, chunk: Chunk) -> None: ...

    def stop(self, ahead: Sequence[Chunk]) -> list[Chunk]:
        """Read nothing new; returns which of the chunks read ahead (not yet emitted)
        are still to be emitted (a landing folder finishes the file it is in the middle
        of, so a stopped run never leaves a file half taken)."""
        ...

    def lag(self) -> SourceLag: ...

    def housekeeping(self, *, now: bool = False) -> None:
        """Clean up after merged data (``now``: at once, as a run ends)."""
        ...

    def close(self) -> None: ...
