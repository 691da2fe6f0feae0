"""A Redis stream, read with a consumer group: acknowledged only once in the ledger.

Entries are read with ``XREADGROUP`` as one consumer of the run's group and gathered
into chunks of the source's segment size (or whatever arrived within ``linger_s``, so a
slow stream is still fresh). A chunk's origin is the run's own numbering of the entries
it read (file 0, offset = entries before it, length = entries in it), and the last
entry id goes into the run's position with it. Only after the ledger holds a chunk are
its entries acknowledged (``XACK``).

A restarted driver first reads the group's pending entries (delivered, never
acknowledged): those up to the position's last id are in the ledger already and are
only acknowledged; the rest are read again, as if new. Nothing in the stream is ever
trimmed by the run: the backlog stays in Redis, and the run's memory holds no more than
the read-ahead.

On the console's Redis a stream named ``orders`` is the key ``bpconsole:stream:orders``
(:mod:`orchestrator.pipeline.streams`), whatever the run stored: a run never reads,
creates or joins a group on a key of the broker's. On a server an administrator listed,
the key is the name.

A partitioned source (``partitions`` above 1) reads the streams ``<stream>:0`` and on
side by side, each with its own pending entries and last id; each chunk is one
partition's entries, the partitions taking turns, and says which partitions were idle
when it was cut: what the watermark needs (``orchestrator.pipeline.watermark``). The
run's numbering of entries runs across all of them.

An entry's record is its ``record`` field (one JSON object, as ``manage.py produce``
writes); an entry without one is read as the JSON object of its fields. Anything that
is not a JSON object is counted and quarantined as a malformed record by the operators.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from balancer.units import MB
from orchestrator.models import Run
from orchestrator.pipeline.inputs import Chunk, record_tag
from orchestrator.source.base import SourceLag, SourceUnavailable
from orchestrator.source.spec import StreamSpec

CONSUMER = "bpconsole-driver"
READ_COUNT = 2000  # entries per XREADGROUP call
MAX_ENTRY_BYTES = 1 * MB  # a longer entry is cut short and so counted as malformed
# Redis before 7 keeps no count of a group's undelivered entries: they are counted by
# reading them, up to this many (the backlog shows "at least" that).
LAG_COUNT = 10_000

# (id, fields) of each entry; the fields are None for a pending entry deleted since.
Entries = list[tuple[bytes, dict[bytes, bytes] | None]]


def entry_id(text: str) -> tuple[int, int]:
    millis, _, seq = text.partition("-")
    return int(millis), int(seq or 0)


def group_name(run_id: int, spec: StreamSpec) -> str:
    return spec.group or f"bpconsole.run.{run_id}"


def answers(url: str, timeout_s: float = 2.0) -> str:
    """ "" when the Redis at ``url`` answers a ping, else why not."""
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc)
    finally:
        client.close()
    return ""


@dataclass
class Partition:
    """One stream of the source: what was read of it and not yet cut into a chunk."""

    index: int
    stream: str
    mark: str  # its last entry id in the ledger
    cut_mark: str  # its last entry id in a chunk cut (in the ledger or on its way there)
    cut_entries: int  # its entries in those chunks, all this run's
    pending_from: str | None = "0"  # our own unacknowledged entries come first
    buffer: list[tuple[str, bytes]] = field(default_factory=list)
    buffer_bytes: int = 0
    buffer_since: float = 0.0
    empty_since: float | None = None  # when a read last found nothing, while nothing waits


class RedisStreamSource:
    unbounded = True

    def __init__(
        self,
        run_id: int,
        spec: StreamSpec,
        params: Mapping[str, Any],
        position: Mapping[str, Any],
        *,
        url: str,
    ) -> None:
        self.run_id, self.spec = run_id, spec
        self.stream, self.group = spec.stream, group_name(run_id, spec)
        self.partitions = spec.partitions
        self.segment_bytes = max(1, int(float(params.get("segment_mb", 1.0)) * MB))
        self.route_by = str(params.get("route_by", "key"))
        self.client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        try:
            for stream in spec.streams:
                self._ensure_group(stream)
        except redis.RedisError as exc:
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc
        marks, earlier = taken_marks(spec, position), self._previous_marks()
        self.parts: list[Partition] = []
        for index, stream in enumerate(spec.streams):
            mark, entries = marks.get(stream, ("", 0))
            mark = mark or earlier.get(stream, ("", 0))[0]
            self.parts.append(Partition(index, stream, mark, mark, entries))
        self.read_entries = int(position.get("offset", 0))  # the run's numbering of entries
        self.read_index = int(position.get("chunk", 0))
        self.last_cut = -1  # the partition last cut from: the next cut starts after it
        self.ids: dict[int, tuple[Partition, list[str]]] = {}  # chunk -> its entries, until acked
        self.entry_bytes = 0.0  # running mean, to put bytes on the backlog
        self.stopped = False

    def _ensure_group(self, stream: str) -> None:
        start = "0" if self.spec.start == "earliest" else "$"
        try:
            self.client.xgroup_create(stream, self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _previous_marks(self) -> dict[str, tuple[str, int]]:
        """A named group's earlier run may have left entries it had in its ledger
        unacknowledged (killed between the two): they are not new data."""
        if not self.spec.group:
            return {}
        earlier = (
            Run.objects.filter(
                input_spec__kind="stream",
                input_spec__stream=self.stream,
                input_spec__group=self.spec.group,
                pk__lt=self.run_id,
            )
            .order_by("-pk")
            .values_list("source_position", flat=True)
            .first()
        )
        return taken_marks(self.spec, earlier or {})

    # -- reading ----------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        if self.stopped:
            return None
        try:
            # One read at least, even with a segment waiting: a partition is judged idle
            # on what its stream holds now, not when it was last read.
            more = self._read()
            while more and not any(p.buffer_bytes >= self.segment_bytes for p in self.parts):
                more = self._read()
        except redis.RedisError as exc:
            # What was read stays pending in the group, so reading again later loses
            # nothing; the buffers are kept as they are.
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc
        now = time.monotonic()
        ready = [
            p
            for p in self._round_robin()
            if p.buffer_bytes >= self.segment_bytes
            or (p.buffer and now - p.buffer_since >= self.spec.linger_s)
        ]
        if not ready:
            return None
        full = [p for p in ready if p.buffer_bytes >= self.segment_bytes]
        return self._cut((full or ready)[0], now)

    def _round_robin(self) -> list[Partition]:
        after = self.last_cut + 1
        return self.parts[after:] + self.parts[:after]

    def _read(self) -> bool:
        """Read one slice of each partition not yet holding a segment into its buffer;
        False when nothing more is there now."""
        wanted = {
            p.stream: p.pending_from or ">"
            for p in self.parts
            if p.buffer_bytes < self.segment_bytes
        }
        if not wanted:
            return False
        answer: Any = self.client.xreadgroup(self.group, CONSUMER, wanted, count=READ_COUNT)  # type: ignore[arg-type]
        got = {_text(name): cast("Entries", entries) for name, entries in answer or []}
        now, progress = time.monotonic(), False
        for part in self.parts:
            if part.stream not in wanted:
                continue
            entries = got.get(part.stream, [])
            if part.pending_from is not None:
                progress = True
                if not entries:
                    part.pending_from = None  # caught up with our own pending entries
                    continue
                part.pending_from = _text(entries[-1][0])
            if not entries:
                if not part.buffer and part.empty_since is None:
                    part.empty_since = now
                continue
            progress = True
            part.empty_since = None
            self._take(part, entries, now)
        return progress

    def _take(self, part: Partition, entries: Entries, now: float) -> None:
        done = entry_id(part.mark) if part.mark else None
        ingested = []
        for raw_id, fields in entries:
            ident = _text(raw_id)
            if fields is None or (done is not None and entry_id(ident) <= done):
                # In the ledger already, or deleted from the stream since it was
                # delivered: only acknowledge it.
                ingested.append(ident)
                continue
            line = line_of(fields)
            if not part.buffer:
                part.buffer_since = now
            part.buffer.append((ident, line))
            part.buffer_bytes += len(line)
            self.entry_bytes = (
                0.99 * self.entry_bytes + 0.01 * len(line) if self.entry_bytes else len(line)
            )
        if ingested:
            self.client.xack(part.stream, self.group, *ingested)

    def _idle(self, now: float) -> tuple[int, ...]:
        """The partitions with nothing to give for the idle time (none when it is 0)."""
        if self.partitions == 1 or self.spec.idle_s <= 0:
            return ()
        return tuple(
            p.index
            for p in self.parts
            if not p.buffer
            and p.empty_since is not None
            and now - p.empty_since >= self.spec.idle_s
        )

    def _cut(self, part: Partition, now: float) -> Chunk:
        count, size = 0, 0
        for _, line in part.buffer:
            count += 1
            size += len(line)
            if size >= self.segment_bytes:
                break
        taken, part.buffer = part.buffer[:count], part.buffer[count:]
        part.buffer_bytes -= size
        if part.buffer:
            part.buffer_since = now
        part.cut_mark, part.cut_entries = taken[-1][0], part.cut_entries + len(taken)
        self.last_cut = part.index
        body = b"".join(line for _, line in taken)
        chunk = Chunk(
            index=self.read_index,
            file_index=0,
            offset=self.read_entries,
            length=len(taken),
            tag=record_tag(body, self.route_by),
            size=len(body),
            body=body,
            path="",
            mark=taken[-1][0],
            partition=part.index,
            idle=self._idle(now),
            marks=(
                tuple((p.stream, p.cut_mark, p.cut_entries) for p in self.parts)
                if self.partitions > 1
                else ()
            ),
        )
        self.ids[chunk.index] = (part, [ident for ident, _ in taken])
        self.read_index += 1
        self.read_entries += len(taken)
        return chunk

    @property
    def exhausted(self) -> bool:
        return self.stopped

    def committed(self, chunk: Chunk) -> None:
        """In the ledger: now the entries may be acknowledged."""
        part, ids = self.ids.pop(chunk.index, (self.parts[chunk.partition], []))
        part.mark = chunk.mark
        if ids:
            # Unacknowledged, they stay pending: a restart finds them at or before the
            # position's mark and only acknowledges them then.
            with contextlib.suppress(redis.RedisError):
                self.client.xack(part.stream, self.group, *ids)

    def stop(self, ahead: Sequence[Chunk]) -> list[Chunk]:
        """Read nothing more; what was read and not sent stays pending in the group,
        so it is not lost: it is simply not this run's (a named group's next run reads
        it first)."""
        self.stopped = True
        for part in self.parts:
            part.buffer, part.buffer_bytes = [], 0
        return []

    def lag(self) -> SourceLag:
        """Entries after the last one in the ledger, and the oldest one's age."""
        try:
            lags = [self._lag(p.stream) for p in self.parts]
        except redis.RedisError as exc:
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc
        entries = sum(entries for entries, _ in lags)
        oldest = min((o for _, o in lags if o), default=0)
        age = max(0.0, time.time() - oldest / 1000) if oldest else 0.0
        return SourceLag(entries=entries, bytes=int(entries * self.entry_bytes), age_s=age)

    def _lag(self, stream: str) -> tuple[int, int]:
        """(entries waiting in ``stream``, the oldest one's time in ms or 0)."""
        groups = self.client.xinfo_groups(stream)
        info = next((g for g in groups if _text(g["name"]) == self.group), None)
        if info is None:
            return 0, 0
        pending = int(info.get("pending") or 0)
        undelivered = info.get("lag")
        last = _text(info.get("last-delivered-id") or "0-0")
        if undelivered is None:  # Redis before 7 keeps no count: count them, bounded
            undelivered = len(
                cast("Entries", self.client.xrange(stream, min=f"({last}", count=LAG_COUNT))
            )
        return int(undelivered) + pending, self._oldest(stream, pending, last)

    def _oldest(self, stream: str, pending: int, last_delivered: str) -> int:
        if pending:
            summary: Any = self.client.xpending(stream, self.group)
            low = summary.get("min")
            if low:
                return entry_id(_text(low))[0]
        first = cast("Entries", self.client.xrange(stream, min=f"({last_delivered}", count=1))
        return entry_id(_text(first[0][0]))[0] if first else 0

    def housekeeping(self, *, now: bool = False) -> None:
        """The stream is the producer's to trim: nothing of it is deleted by a run."""

    def close(self) -> None:
        self.client.close()


def taken_marks(spec: StreamSpec, position: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Each partition's (last entry id, entries) in a run's position, by stream name."""
    kept = position.get("partitions")
    if isinstance(kept, Mapping):
        return {
            str(name): (str(mark.get("mark") or ""), int(mark.get("entries") or 0))
            for name, mark in kept.items()
            if isinstance(mark, Mapping)
        }
    if spec.partitions == 1:
        return {spec.streams[0]: (str(position.get("mark") or ""), int(position.get("offset", 0)))}
    return {}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def line_of(fields: Mapping[bytes, bytes]) -> bytes:
    record = fields.get(b"record")
    if record is None:
        record = json.dumps(
            {_text(k): _text(v) for k, v in fields.items()}, separators=(",", ":")
        ).encode()
    record = record[:MAX_ENTRY_BYTES].replace(b"\n", b" ")
    return record + b"\n"
