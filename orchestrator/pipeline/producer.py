"""A rate-controlled producer of generated records, for live inputs and benchmarks.

It writes the generator's JSON lines (``{"key", "value", "user"}``, see
:func:`orchestrator.pipeline.generator.record_line`) at a paced rate, either as part files
into a folder (``folder:PATH``) or as entries of a Redis stream (``redis:STREAM``: on the
console's Redis the key ``bpconsole:stream:STREAM``, as a stream source reads it; see
:mod:`orchestrator.pipeline.streams`), until a duration, a volume or a stop request ends
it. ``manage.py produce`` is a thin command over :func:`produce`.

The records are a function of the seed, the pattern and the key/user spaces only, never
of timing: two runs with the same arguments produce the same records in the same order,
however fast the machine is. Bytes are counted as each record's JSON line with its
newline, in both targets, so a rate means the same thing for a folder and a stream.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal, get_args

import numpy as np
import redis

from balancer.units import GB, KB, MB
from orchestrator.pipeline.generator import BOUNDS, VALUE_CENTS, keys_for, record_line
from orchestrator.pipeline.streams import MAX_PARTITIONS, name_problem, stream_keys

Pattern = Literal["steady", "bursty", "skewed", "bursty-skewed"]
PATTERNS: tuple[str, ...] = get_args(Pattern)
BURSTY = ("bursty", "bursty-skewed")  # the rate comes in bursts
SKEWED = ("skewed", "bursty-skewed")  # one key takes SKEW_SHARE of the records

MAX_RATE_BPS = 1 * GB
MAX_DURATION_S = 7 * 86_400
MAX_FILE_BYTES = 256 * MB
SLICE_S = 0.05  # pacing step: small, so any 1 s window holds ~20 steps of the target rate
FRESH_S = 1.0  # a part file is published at least this often, however slow the rate
BURST_FACTOR = 4  # bursty: bursts at 4x the mean rate ...
BURST_S = 1.0  # ... for 1 s, then quiet for (BURST_FACTOR - 1) s, so the mean is the rate
SKEW_SHARE = 0.35  # skewed: the share of records that go to the one hot key
BATCH = 2048  # records drawn from the random generator at a time
DEFAULT_BRANCHES = ("o1", "o2", "o3")
PART_NAME = re.compile(r"\.?part-(\d{8})\.jsonl(?:\.tmp)?")
MAX_SEQ = 99_999_999  # part numbers have 8 digits

_RATE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:(B|KB|MB|GB)(?:/s)?)?", re.IGNORECASE)
_RATE_UNITS = {"": 1, "b": 1, "kb": KB, "mb": MB, "gb": GB}
_DURATION = re.compile(r"(-?(?:\d+(?:\.\d*)?|\.\d+))\s*([smhd]?)", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}


class ProducerError(ValueError):
    pass


@dataclass(frozen=True)
class FolderTarget:
    path: Path

    def text(self) -> str:
        return f"folder:{self.path}"


@dataclass(frozen=True)
class StreamTarget:
    url: str
    stream: str
    # Above 1: the records go to the streams STREAM:0 .. STREAM:<partitions - 1> in
    # turn, record by record (a partitioned stream source reads them side by side).
    partitions: int = 1
    # On the console's Redis (the broker): the stream's key is under the streams'
    # prefix. False only for a server of its own, where the key is the name.
    own: bool = True

    def text(self) -> str:
        return f"redis:{self.stream}" + (
            f" in {self.partitions} partitions" if self.partitions > 1 else ""
        )


Target = FolderTarget | StreamTarget
StopReason = Literal["duration", "max_bytes", "stop"]


@dataclass(frozen=True)
class ProduceReport:
    target: str
    pattern: str
    records: int
    bytes: int
    seconds: float
    rate_bps: float  # achieved: bytes / seconds
    target_rate_bps: float
    files: int  # part files published (folder target)
    entries: int  # stream entries added (stream target)
    stopped_by: StopReason

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _shown_bytes(value: float) -> str:
    for unit, size in (("GB", GB), ("MB", MB), ("KB", KB)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"


def parse_target(
    text: str, *, redis_url: str = "redis://127.0.0.1:6379/0", own: bool = True
) -> Target:
    """``folder:PATH`` or ``redis:STREAM`` (the stream on the server at ``redis_url``,
    the console's own unless ``own`` is False)."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in {"folder", "redis"}:
        raise ProducerError(f"target {text[:80]!r}: use folder:PATH or redis:STREAM")
    if kind == "folder":
        if not rest.strip():
            raise ProducerError("target folder: needs a path, as in folder:/data/in")
        return FolderTarget(Path(rest))
    _check_stream(rest, own=own)
    return StreamTarget(redis_url, rest, own=own)


def _check_stream(name: str, *, own: bool) -> None:
    problem = name_problem(name, own=own)
    if problem:
        raise ProducerError(f"stream name {name[:80]!r} is not allowed: {problem}")


def parse_rate(text: str) -> float:
    """``4MB/s``, ``500KB/s``, ``1GB/s``, ``800B/s`` or a plain number of bytes per second
    (binary units, as in balancer.units), within (0, 1 GB/s]."""
    match = _RATE.fullmatch(text.strip())
    if not match:
        raise ProducerError(
            f"rate {text[:80]!r}: use a number and B, KB, MB or GB per second, as in 4MB/s"
        )
    rate = float(match[1]) * _RATE_UNITS[(match[2] or "").lower()]
    _check_rate(rate)
    return rate


def _check_rate(rate_bps: float) -> None:
    if not 0 < rate_bps <= MAX_RATE_BPS:
        raise ProducerError(
            f"rate {_shown_bytes(rate_bps)}/s is out of range; it must lie in (0, 1 GB/s]"
        )


def parse_duration(text: str) -> float | None:
    """``60s``, ``5m``, ``1h``, ``2d`` or plain seconds, up to 7 days; ``0`` or
    ``forever`` is None: run until stopped."""
    if text.strip().lower() == "forever":
        return None
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ProducerError(
            f"duration {text[:80]!r}: use a number with s, m, h or d (60s, 5m, 1h), or 0/forever"
        )
    seconds = float(match[1]) * _DURATION_UNITS[match[2].lower()]
    if seconds == 0:
        return None
    _check_duration(seconds)
    return seconds


def _check_duration(seconds: float) -> None:
    if not 0 < seconds <= MAX_DURATION_S:
        raise ProducerError(
            f"duration {seconds:g} s is out of range; it must lie in (0, 7 days] "
            "(or 0/forever: until stopped)"
        )


def _check(
    *,
    rate_bps: float,
    pattern: str,
    duration_s: float | None,
    seed: int,
    file_bytes: int,
    max_bytes: int | None,
    keys: int,
    users: int,
    branches: Sequence[str],
) -> None:
    """Refuse every argument out of its range before anything is written."""
    _check_rate(rate_bps)
    if duration_s is not None:
        _check_duration(duration_s)
    if pattern not in PATTERNS:
        raise ProducerError(f"pattern {pattern[:80]!r}: use one of {', '.join(PATTERNS)}")
    if not 0 < file_bytes <= MAX_FILE_BYTES:
        raise ProducerError(
            f"file size {_shown_bytes(file_bytes)} is out of range; it must lie in (0, 256 MB]"
        )
    if max_bytes is not None and max_bytes <= 0:
        raise ProducerError(f"max volume {max_bytes} bytes is not positive")
    if not branches or len(set(branches)) != len(branches) or not all(branches):
        raise ProducerError(f"branches {list(branches)[:10]}: give distinct, non-empty names")
    per_branch = keys // len(branches)
    for name, value in (("seed", seed), ("users", users), ("keys_per_branch", per_branch)):
        bound = BOUNDS[name]
        if not bound.admits(value):
            hint = (
                f" (keys {keys} over {len(branches)} branches)" if name == "keys_per_branch" else ""
            )
            raise ProducerError(
                f"{name} {value}{hint} is out of range; it must lie in {bound.text()}"
            )


class Records:
    """The endless, seeded sequence of record lines."""

    def __init__(self, seed: int, pattern: str, keys: Sequence[str], users: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._keys = list(keys)
        self._users = users
        self._skewed = pattern in SKEWED
        self._hot = int(self._rng.integers(len(self._keys)))
        self._batch: list[str] = []
        self._next = 0

    def peek(self) -> str:
        if self._next == len(self._batch):
            self._batch = self._draw()
            self._next = 0
        return self._batch[self._next]

    def take(self) -> str:
        line = self.peek()
        self._next += 1
        return line

    def _draw(self) -> list[str]:
        rng, count = self._rng, len(self._keys)
        if self._skewed and count > 1:
            # The rest spread over the other keys: shift indexes at or past the hot one.
            others = rng.integers(count - 1, size=BATCH)
            others += others >= self._hot
            key_ix = np.where(rng.random(BATCH) < SKEW_SHARE, self._hot, others)
        else:
            key_ix = rng.integers(count, size=BATCH)
        cents = rng.integers(0, VALUE_CENTS, size=BATCH)
        users = rng.integers(self._users, size=BATCH)
        return [
            record_line(self._keys[k], c, u)
            for k, c, u in zip(key_ix.tolist(), cents.tolist(), users.tolist(), strict=True)
        ]


def planned_bytes(pattern: str, rate_bps: float, elapsed_s: float) -> float:
    """The volume the pattern has asked for by ``elapsed_s`` after the start."""
    if pattern not in BURSTY:
        return rate_bps * elapsed_s
    period = BURST_S * BURST_FACTOR
    cycles, into = divmod(elapsed_s, period)
    return rate_bps * (cycles * period + BURST_FACTOR * min(into, BURST_S))


class FolderSink:
    """Part files ``part-<seq>.jsonl``, each written under a hidden temporary name, fsynced
    and renamed in whole: a reader listing the folder never sees a partial file."""

    def __init__(self, path: Path, file_bytes: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file_bytes = file_bytes
        # Temporary names count too: one left by a killed producer is never reused.
        seqs = [int(m[1]) for p in path.iterdir() if (m := PART_NAME.fullmatch(p.name))]
        self._seq = max(seqs, default=-1) + 1
        self._out: IO[str] | None = None
        self._size = 0
        self._opened = 0.0
        self.published = 0

    def _tmp(self) -> Path:
        return self._path / f".part-{self._seq:08d}.jsonl.tmp"

    def write(self, lines: list[str], now: float) -> None:
        for line in lines:
            if self._out is not None and self._size + len(line) > self._file_bytes:
                self.close()
            if self._out is None:
                if self._seq > MAX_SEQ:
                    raise ProducerError(f"folder {self._path} has run out of part numbers")
                self._out = self._tmp().open("x")
                self._size = 0
                self._opened = now
            self._out.write(line)
            self._size += len(line)

    def tick(self, now: float) -> None:
        if self._out is not None and now - self._opened >= FRESH_S:
            self.close()

    def close(self) -> None:
        if self._out is None:
            return
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        self._out = None
        self._tmp().replace(self._path / f"part-{self._seq:08d}.jsonl")
        self._seq += 1
        self.published += 1

    def abort(self) -> None:
        """After a failure: drop the unfinished file rather than publish part of it."""
        if self._out is not None:
            self._out.close()
            self._out = None
            self._tmp().unlink(missing_ok=True)


class StreamSink:
    """``XADD STREAM * record LINE`` per record, one pipeline per slice; never trimmed.
    With partitions, record n goes to ``STREAM:<n % partitions>``."""

    def __init__(self, url: str, stream: str, partitions: int = 1, *, own: bool = True) -> None:
        _check_stream(stream, own=own)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ProducerError(f"partitions must be from 1 to {MAX_PARTITIONS}, not {partitions}")
        self._client = redis.Redis.from_url(url)
        self._streams = stream_keys(stream, partitions, own=own)
        self._stream = stream
        self.published = 0
        try:
            self._client.ping()
        except redis.RedisError as error:
            raise ProducerError(f"cannot reach Redis for stream {stream}: {error}") from error

    def write(self, lines: list[str], now: float) -> None:
        if not lines:
            return
        pipe = self._client.pipeline(transaction=False)
        for n, line in enumerate(lines, start=self.published):
            pipe.xadd(self._streams[n % len(self._streams)], {"record": line[:-1]})
        pipe.execute()
        self.published += len(lines)

    def tick(self, now: float) -> None:
        """Entries are visible as soon as they are added: nothing to publish late."""

    def close(self) -> None:
        self._client.close()

    def abort(self) -> None:
        self._client.close()


def produce(
    target: Target,
    *,
    rate_bps: float,
    pattern: str,
    duration_s: float | None,
    seed: int,
    file_bytes: int = 1 * MB,
    max_bytes: int | None = None,
    stop: threading.Event | None = None,
    keys: int = 81,
    users: int = 1000,
    branches: Sequence[str] = DEFAULT_BRANCHES,
) -> ProduceReport:
    """Write records to ``target`` at ``rate_bps`` (shaped by ``pattern``) until
    ``duration_s`` (None: no limit), ``max_bytes`` or ``stop`` is set, whichever comes
    first; whatever has been written is complete when it returns."""
    _check(
        rate_bps=rate_bps,
        pattern=pattern,
        duration_s=duration_s,
        seed=seed,
        file_bytes=file_bytes,
        max_bytes=max_bytes,
        keys=keys,
        users=users,
        branches=branches,
    )
    pools = keys_for(list(branches), keys // len(branches))
    records = Records(seed, pattern, [k for b in branches for k in pools[b]], users)
    sink: FolderSink | StreamSink = (
        FolderSink(target.path, file_bytes)
        if isinstance(target, FolderTarget)
        else StreamSink(target.url, target.stream, target.partitions, own=target.own)
    )
    if stop is None:
        stop = threading.Event()
    # The bucket holds at most a quarter second of the peak rate: after a stall the
    # producer catches up that much, not with a burst of everything it missed.
    capacity = rate_bps * (BURST_FACTOR if pattern in BURSTY else 1) / 4
    end = math.inf if duration_s is None else duration_s
    limit = math.inf if max_bytes is None else max_bytes
    count = sent = 0
    tokens = 0.0
    start = time.monotonic()
    planned = 0.0
    stopped_by: StopReason = "stop"
    try:
        while True:
            now = time.monotonic()
            elapsed = min(now - start, end)
            was, planned = planned, planned_bytes(pattern, rate_bps, elapsed)
            tokens = min(tokens + planned - was, capacity)
            lines: list[str] = []
            full = False
            # Whole records while there are tokens: a record may overdraw the bucket,
            # and the debt is paid from the next slice, so the long-run rate is exact.
            while tokens > 0:
                if sent + len(records.peek()) > limit:
                    full = True
                    break
                line = records.take()
                lines.append(line)
                tokens -= len(line)
                sent += len(line)
            count += len(lines)
            sink.write(lines, now)
            sink.tick(now)
            if full:
                stopped_by = "max_bytes"
                break
            if elapsed >= end:
                stopped_by = "duration"
                break
            # Wake on the next slice boundary (never before the end of the duration);
            # a slow slice skips the boundaries it missed instead of racing through them.
            since = time.monotonic() - start
            wake = min((math.floor(since / SLICE_S) + 1) * SLICE_S, end)
            if stop.wait(max(0.0, wake - since)):
                break
        sink.close()
    except BaseException:
        sink.abort()
        raise
    seconds = time.monotonic() - start
    return ProduceReport(
        target=target.text(),
        pattern=pattern,
        records=count,
        bytes=sent,
        seconds=round(seconds, 3),
        rate_bps=round(sent / seconds, 1) if seconds > 0 else 0.0,
        target_rate_bps=rate_bps,
        files=sink.published if isinstance(sink, FolderSink) else 0,
        entries=sink.published if isinstance(sink, StreamSink) else 0,
        stopped_by=stopped_by,
    )
