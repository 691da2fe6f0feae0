"""Exactly what an unbounded run took in, written out as one input for the plain job.

The check an operator (and the tests) make of a continuous run: its results must equal
the plain Spark job over the data it ingested, no more and no less. A landing folder's
files are read from where they are now (the folder, or the archive folder once
cleaned) up to the size the run took, each opened by a walk from its input root that
follows no symbolic link; a stream's entries are read again with XRANGE.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import redis
from django.conf import settings

from orchestrator.ledger.ingested import ingested_extent
from orchestrator.models import Run, SourceFile
from orchestrator.pipeline.beneath import Roots
from orchestrator.source.spec import LandingSpec, StreamSpec, unbounded_spec
from orchestrator.source.stream import Entries, entry_id, line_of, taken_marks

PAGE = 10_000


class ReplayError(ValueError):
    """What the run took in cannot be read again; the message says why."""


@dataclass(frozen=True)
class Replay:
    """What a run took in, written out: the files to read, and for each join whose table
    the run refreshed, the copy each file's records join (join stage -> file name ->
    copy's name; a file not named joins the copy the run started with)."""

    paths: list[str]
    copies: dict[str, dict[str, str]]


def replay_inputs(run: Run, out: Path) -> Replay:
    """Write the run's ingested records to ``out`` (JSON lines), and the files bound to
    a refreshed join's later copy beside it, one file per copy they join (``out``'s
    name with a number added). Raises :class:`ReplayError`."""
    spec = unbounded_spec(run.input_spec or {})
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(spec, LandingSpec):
        _, parts = _files(run, spec, out)
    elif isinstance(spec, StreamSpec):
        _, parts = _entries(run, spec, out)
    else:
        raise ReplayError(f"run {run.pk} read a bounded input: run the plain job over it directly")
    copies: dict[str, dict[str, str]] = {}
    for path, bound in parts:
        for stage, copy in bound.items():
            copies.setdefault(stage, {})[path.name] = copy
    return Replay([str(path) for path, _ in parts], copies)


def write_ingested(run: Run, out: Path) -> int:
    """Write the run's ingested records to ``out`` (JSON lines) alone; returns their
    count of bytes. Raises :class:`ReplayError`, and for a run whose files joined
    refreshed copies of a table (they need :func:`replay_inputs`)."""
    spec = unbounded_spec(run.input_spec or {})
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(spec, LandingSpec):
        written, parts = _files(run, spec, out)
    elif isinstance(spec, StreamSpec):
        written, parts = _entries(run, spec, out)
    else:
        raise ReplayError(f"run {run.pk} read a bounded input: run the plain job over it directly")
    if len(parts) > 1:
        raise ReplayError(
            f"run {run.pk} joined refreshed copies of a table: what it took in is replayed "
            "one part per copy (run_pipeline --batch --of-run)"
        )
    return written


Part = tuple[Path, dict[str, str]]


def _files(run: Run, spec: LandingSpec, out: Path) -> tuple[int, list[Part]]:
    """Each file's bytes the run took, into ``out`` or, for a file bound to refreshed
    copies of a join's table, into the part of the files bound to the same copies."""
    if spec.format != "jsonl":
        raise ReplayError("only a landing folder of JSON lines can be replayed as one file")
    extent = ingested_extent(run)
    rows = list(SourceFile.objects.filter(run=run).order_by("index"))
    forgotten = len(extent) - len(rows)
    if forgotten:
        raise ReplayError(
            f"run {run.pk} forgot {forgotten} of its files, cleaned over "
            f"{settings.BPCONSOLE_SOURCE_FILES_KEEP_S:g} s ago (BPCONSOLE_SOURCE_FILES_KEEP_S): "
            "what it took in can no longer be replayed whole"
        )
    written = 0
    parts: dict[str, Part] = {"{}": (out, {})}
    sinks: dict[str, BinaryIO] = {}
    with Roots(settings.INPUT_ROOTS) as roots, ExitStack() as opened:
        sinks["{}"] = opened.enter_context(out.open("wb"))
        for row in rows:
            start, end = extent[row.index]
            if end <= start:
                continue
            bound = json.dumps(row.references, sort_keys=True)
            if bound not in sinks:
                part = out.with_name(f"{out.stem}.{len(parts)}{out.suffix}")
                parts[bound] = (part, dict(row.references))
                sinks[bound] = opened.enter_context(part.open("wb"))
            sink = sinks[bound]
            if row.state == SourceFile.State.CLEANED and spec.clean == "delete":
                raise ReplayError(f"{row.path} was deleted once merged (clean: delete)")
            try:
                fd = roots.open_file(row.path)
            except OSError as exc:
                raise ReplayError(f"{row.path} cannot be read again: {exc}") from None
            with os.fdopen(fd, "rb") as source:
                source.seek(start)
                body = source.read(end - start)
            if len(body) != end - start:
                raise ReplayError(f"{row.path} no longer holds the {end - start} bytes taken")
            sink.write(body if body.endswith(b"\n") else body + b"\n")
            written += len(body)
        for sink in sinks.values():
            sink.flush()
            os.fsync(sink.fileno())
    return written, list(parts.values())


def _entries(run: Run, spec: StreamSpec, out: Path) -> tuple[int, list[Part]]:
    """Each partition's entries, one partition after another (the plain job's result
    does not depend on the order of its records), into ``out`` or, for the entries
    emitted after a refresh of a join's table, into the part of the entries that join
    the same copies: a copy is recorded with each partition's entries before it
    (orchestrator/run/references.py)."""
    position = run.source_position or {}
    taken = taken_marks(spec, position)
    refreshed = {
        stage: list(copy.get("since") or [])
        for stage, copy in (run.references or {}).items()
        if copy.get("since")
    }
    client = redis.Redis.from_url(spec.url or settings.REDIS_URL, socket_timeout=30)
    written = 0
    parts: dict[str, Part] = {"{}": (out, {})}
    try:
        with ExitStack() as opened:
            sinks = {"{}": opened.enter_context(out.open("wb"))}
            for stream in spec.streams:
                mark, count = taken.get(stream, ("", 0))
                lines = _taken(client, run, stream, mark, count)
                starts = sorted(
                    {0, *(int(s["entries"].get(stream, 0)) for v in refreshed.values() for s in v)}
                )
                for low, high in zip(starts, [*starts[1:], len(lines)], strict=True):
                    if high <= low:
                        continue  # a copy no entry of this stream joined
                    bound = _bound_at(refreshed, stream, low)
                    key = json.dumps(bound, sort_keys=True)
                    if key not in sinks:
                        part = out.with_name(f"{out.stem}.{len(parts)}{out.suffix}")
                        parts[key] = (part, bound)
                        sinks[key] = opened.enter_context(part.open("wb"))
                    body = b"".join(lines[low:high])
                    sinks[key].write(body)
                    written += len(body)
            for sink in sinks.values():
                sink.flush()
                os.fsync(sink.fileno())
    finally:
        client.close()
    return written, list(parts.values())


def _bound_at(
    refreshed: dict[str, list[dict[str, Any]]], stream: str, entry: int
) -> dict[str, str]:
    """The copy each refreshed join's table the ``entry``-th entry the run took of
    ``stream`` joins, for the joins past their first copy there."""
    bound = {}
    for stage, since in refreshed.items():
        later = [str(s["file"]) for s in since if int(s["entries"].get(stream, 0)) <= entry]
        if later:
            bound[stage] = later[-1]
    return bound


def _taken(client: redis.Redis, run: Run, stream: str, mark: str, count: int) -> list[bytes]:
    """The last ``count`` entries of ``stream`` up to ``mark``: what the run took of it."""
    if not count:
        return []
    lines: list[bytes] = []
    high = mark
    while len(lines) < count:
        page = cast("Entries", client.xrevrange(stream, max=high, count=min(PAGE, count)))
        for _ident, fields in page:
            if fields is not None and len(lines) < count:
                lines.append(line_of(cast("Any", fields)))
        if len(page) < min(PAGE, count):
            break
        last = entry_id(page[-1][0].decode())
        high = f"({last[0]}-{last[1]}"
    if len(lines) != count:
        raise ReplayError(
            f"the stream {stream} holds {len(lines)} of the {count} entries run {run.pk} "
            "took in (trimmed since?)"
        )
    return lines[::-1]
