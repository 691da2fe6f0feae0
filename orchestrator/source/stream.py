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

An entry's record is its ``record`` field (one JSON object, as ``manage.py produce``
writes); an entry without one is read as the JSON object of its fields. Anything that
is not a JSON object is counted and quarantined as a malformed record by the operators.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
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
        self.segment_bytes = max(1, int(float(params.get("segment_mb", 1.0)) * MB))
        self.route_by = str(params.get("route_by", "key"))
        self.client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        try:
            self._ensure_group()
        except redis.RedisError as exc:
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc
        self.mark = str(position.get("mark") or self._previous_mark())
        self.committed_entries = int(position.get("offset", 0))
        self.read_entries = self.committed_entries
        self.read_index = int(position.get("chunk", 0))
        self.pending_from: str | None = "0"  # our own unacknowledged entries come first
        self.buffer: list[tuple[str, bytes]] = []
        self.buffer_bytes = 0
        self.buffer_since = 0.0
        self.ids: dict[int, list[str]] = {}  # chunk index -> its entries, until acknowledged
        self.entry_bytes = 0.0  # running mean, to put bytes on the backlog
        self.stopped = False

    def _ensure_group(self) -> None:
        start = "0" if self.spec.start == "earliest" else "$"
        try:
            self.client.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _previous_mark(self) -> str:
        """A named group's earlier run may have left entries it had in its ledger
        unacknowledged (killed between the two): they are not new data."""
        if not self.spec.group:
            return ""
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
        return str((earlier or {}).get("mark") or "")

    # -- reading ----------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        if self.stopped:
            return None
        try:
            while self.buffer_bytes < self.segment_bytes and self._read():
                pass
        except redis.RedisError as exc:
            # What was read stays pending in the group, so reading again later loses
            # nothing; the buffer is kept as it is.
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc
        if not self.buffer:
            return None
        full = self.buffer_bytes >= self.segment_bytes
        if not full and time.monotonic() - self.buffer_since < self.spec.linger_s:
            return None
        return self._cut()

    def _read(self) -> bool:
        """Read one slice into the buffer; False when nothing more is there now."""
        start = self.pending_from or ">"
        answer: Any = self.client.xreadgroup(
            self.group, CONSUMER, {self.stream: start}, count=READ_COUNT
        )
        entries: Entries = cast("Entries", answer[0][1] if answer else [])
        if self.pending_from is not None:
            if not entries:
                self.pending_from = None  # caught up with our own pending entries
                return True
            self.pending_from = _text(entries[-1][0])
        if not entries:
            return False
        done = entry_id(self.mark) if self.mark else None
        ingested = []
        for raw_id, fields in entries:
            ident = _text(raw_id)
            if fields is None or (done is not None and entry_id(ident) <= done):
                # In the ledger already, or deleted from the stream since it was
                # delivered: only acknowledge it.
                ingested.append(ident)
                continue
            line = line_of(fields)
            if not self.buffer:
                self.buffer_since = time.monotonic()
            self.buffer.append((ident, line))
            self.buffer_bytes += len(line)
            self.entry_bytes = (
                0.99 * self.entry_bytes + 0.01 * len(line) if self.entry_bytes else len(line)
            )
        if ingested:
            self.client.xack(self.stream, self.group, *ingested)
        return True

    def _cut(self) -> Chunk:
        count, size = 0, 0
        for _, line in self.buffer:
            count += 1
            size += len(line)
            if size >= self.segment_bytes:
                break
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        self.buffer_bytes -= size
        if self.buffer:
            self.buffer_since = time.monotonic()
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
        )
        self.ids[chunk.index] = [ident for ident, _ in taken]
        self.read_index += 1
        self.read_entries += len(taken)
        return chunk

    @property
    def exhausted(self) -> bool:
        return self.stopped

    def committed(self, chunk: Chunk) -> None:
        """In the ledger: now the entries may be acknowledged."""
        self.mark = chunk.mark
        self.committed_entries = chunk.offset + chunk.length
        ids = self.ids.pop(chunk.index, [])
        if ids:
            # Unacknowledged, they stay pending: a restart finds them at or before the
            # position's mark and only acknowledges them then.
            with contextlib.suppress(redis.RedisError):
                self.client.xack(self.stream, self.group, *ids)

    def stop(self, ahead: Sequence[Chunk]) -> list[Chunk]:
        """Read nothing more; what was read and not sent stays pending in the group,
        so it is not lost: it is simply not this run's (a named group's next run reads
        it first)."""
        self.stopped = True
        self.buffer, self.buffer_bytes = [], 0
        return []

    def lag(self) -> SourceLag:
        """Entries after the last one in the ledger, and the oldest one's age."""
        try:
            return self._lag()
        except redis.RedisError as exc:
            raise SourceUnavailable(f"the stream {self.stream} cannot be read: {exc}") from exc

    def _lag(self) -> SourceLag:
        groups = self.client.xinfo_groups(self.stream)
        info = next((g for g in groups if _text(g["name"]) == self.group), None)
        if info is None:
            return SourceLag()
        pending = int(info.get("pending") or 0)
        undelivered = info.get("lag")
        if undelivered is None:  # Redis before 7 keeps no count: count them, bounded
            last = _text(info.get("last-delivered-id") or "0-0")
            undelivered = len(
                cast("Entries", self.client.xrange(self.stream, min=f"({last}", count=LAG_COUNT))
            )
        entries = int(undelivered) + pending
        oldest = self._oldest(pending, _text(info.get("last-delivered-id") or "0-0"))
        age = max(0.0, time.time() - oldest / 1000) if oldest else 0.0
        return SourceLag(entries=entries, bytes=int(entries * self.entry_bytes), age_s=age)

    def _oldest(self, pending: int, last_delivered: str) -> int:
        if pending:
            summary: Any = self.client.xpending(self.stream, self.group)
            low = summary.get("min")
            if low:
                return entry_id(_text(low))[0]
        first = cast("Entries", self.client.xrange(self.stream, min=f"({last_delivered}", count=1))
        return entry_id(_text(first[0][0]))[0] if first else 0

    def housekeeping(self, *, now: bool = False) -> None:
        """The stream is the producer's to trim: nothing of it is deleted by a run."""

    def close(self) -> None:
        self.client.close()


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
