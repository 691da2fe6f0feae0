"""The source: input files cut into chunks, each with its offset and length in the input.

JSON lines and CSV are cut at line boundaries by bytes (offsets are byte offsets, CSV's
header excluded); Parquet is cut by rows (offsets are row indexes). A chunk becomes a
segment file in its input's format, which Spark reads natively: a JSON-lines range as it
is, a CSV range after the file's header line, a Parquet row range as a Parquet file. A
chunk's *tag* is the routing field of its first record, which picks the branch it is
meant for.

A line chunk is never read into the source: only the bytes around its cut and its first
line are, and the kernel copies the range into the segment file (write_chunk). Reading,
counting and writing every byte in Python had cost the source about 6 CPU seconds per
GB, taken from the Spark workers on the same machine while a run starts; converting CSV
to JSON lines in Python had made a CSV run four times slower than the same records as
JSON lines. A chunk that is a whole file, where its source allows it (``in_place``), is
not copied at all: the file becomes the segment by a hard link (ADR 11).
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import io
import json
import os
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from orchestrator.pipeline.beneath import FROM_TOP, Opener
from orchestrator.pipeline.layout import console_folder
from sparkjobs.segments import (
    MAX_HEADER_BYTES,
    SourceFileError,
    copy_atomic,
    link_atomic,
    write_atomic,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

FORMATS = ("jsonl", "csv", "parquet")
FORMAT_NAMES = {"jsonl": "JSON lines", "csv": "CSV", "parquet": "Parquet"}
# File name suffixes that say which format a file is in. A file with another suffix (or
# none) is read in the source's format; one whose suffix names another format is
# refused: read as JSON lines, a Parquet file's bytes were quarantined as thousands of
# malformed "lines" and the run produced nothing, without an error.
SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".parq": "parquet",
}


class InputError(ValueError):
    """The input cannot be read as asked; the message says which file and why."""


@dataclass(frozen=True)
class InputFile:
    path: str
    data_start: int  # first offset holding data (after a CSV header)
    size: int  # bytes, or rows for Parquet


class FilesByNumber(Protocol):
    """Input files by their number: a list, or a landing folder's files by number (a
    dict holding only those not yet read)."""

    def __len__(self) -> int: ...

    def __getitem__(self, number: int, /) -> InputFile: ...


@dataclass(frozen=True)
class Chunk:
    index: int
    file_index: int
    offset: int
    length: int
    tag: str
    size: int  # bytes of the segment file it becomes
    body: bytes | None  # the segment file's bytes; None: the input's own bytes (copied or linked)
    path: str  # the input file
    # Where an unbounded source stands after this chunk (a stream's last entry id), kept
    # with the run's position so a restart acknowledges and skips what is in the ledger.
    mark: str = ""
    head: bytes = b""  # written before the copied bytes: a CSV file's header line
    kind: str = "jsonl"  # the segment's format, its file's suffix
    # A partitioned source's chunk holds one partition's records: which one, the
    # partitions that were idle when it was cut (both decide its watermark), and where
    # every partition stands after it: (name, last entry id, entries taken).
    partition: int = 0
    idle: tuple[int, ...] = ()
    marks: tuple[tuple[str, str, int], ...] = ()
    # The segment's bytes are all of the input file's and nothing else, and the source
    # lets the file itself be the segment (a link, not a copy; ADR 11).
    in_place: bool = False
    # How the input file is opened: beneath the folders its source holds (ADR 12).
    opener: Opener = field(default=FROM_TOP, compare=False, repr=False)

    def stream_position(self) -> dict[str, object]:
        """Where a stream stands after this chunk, as the run's position keeps it."""
        if self.marks:
            return {"partitions": {n: {"mark": m, "entries": e} for n, m, e in self.marks}}
        return {"mark": self.mark} if self.mark else {}


def resolve_inputs(pattern_or_paths: str | list[str], fmt: str) -> list[InputFile]:
    """Expand globs, check every file, and measure it. Fails before anything is written."""
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    patterns = [pattern_or_paths] if isinstance(pattern_or_paths, str) else pattern_or_paths
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]  # noqa: PTH207 - absolute or relative patterns alike
        if not matches:
            raise InputError(f"no input file matches {pattern!r}")
        paths.extend(matches)
    files = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"input {path!r} does not exist or is not a file")
        files.append(measure_file(p.resolve(), fmt))
    return files


MAX_INPUT_FILES = 10_000
MAX_PATH_CHARS = 1000
# How many folders one pattern's expansion may look into, and how many of their entries it
# may read: the walk stops at either, so a pattern costs the request a bounded time.
MAX_WALKED_FOLDERS = 1_000
MAX_WALKED_ENTRIES = 10 * MAX_INPUT_FILES


def confined_files(raw: str, roots: Sequence[Path], *, follow_symlinks: bool) -> list[str]:
    """The files a path or glob from the console names, each resolved and inside a root.

    A run started from the console may only read below the input roots. The pattern's
    fixed part (the folders before its first wildcard, ``..`` taken as written) must lie
    inside a root, or it is refused before anything on disk is looked at. The wildcards
    are then expanded by a walk that starts there and never leaves the roots: a folder
    on the way is entered only when its resolved path is inside them and, unless links
    are allowed (``BPCONSOLE_INPUT_FOLLOW_SYMLINKS``), when no link leads to it (a link
    is how a folder someone can write to comes to name ``/etc``). The walk stops as soon
    as the pattern matches more than ``MAX_INPUT_FILES`` or has looked into
    ``MAX_WALKED_FOLDERS`` folders or read ``MAX_WALKED_ENTRIES`` entries. Every match is
    then resolved (``..`` and links followed) and refused when it leaves the roots.
    Globs never recurse (``**`` is ``*``) and ``*`` skips names that start with a dot,
    as :mod:`glob` does. Raises :class:`InputError` naming what the operator typed, or a
    path inside the roots, never a path found outside them.
    """
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    if not real_roots:
        raise InputError("no input folder is configured (BPCONSOLE_INPUT_ROOTS)")
    text = raw.strip() if isinstance(raw, str) else ""
    if not text or "\x00" in text or len(text) > MAX_PATH_CHARS:
        raise InputError(f"an input path is a path or glob of at most {MAX_PATH_CHARS} characters")
    allowed = ", ".join(str(r) for r in real_roots)
    given = Path(text) if Path(text).is_absolute() else real_roots[0] / text
    parts = Path(os.path.normpath(given)).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    prefix = Path(*parts[:fixed])
    written_roots = {Path(os.path.normpath(Path(r).absolute())) for r in roots} | set(real_roots)
    if not any(prefix == r or r in prefix.parents for r in written_roots):
        raise InputError(f"input {raw!r} must lie under an input folder ({allowed})")
    if fixed == len(parts):
        matches = [str(prefix)]
    else:
        matches = _Walk(raw, real_roots, follow_symlinks=follow_symlinks).expand(
            prefix, parts[fixed:]
        )
    if not matches:
        raise InputError(f"no input file matches {raw!r}")
    files = []
    for match in sorted(matches):
        real = Path(os.path.realpath(match))
        root = next((r for r in real_roots if real == r or r in real.parents), None)
        if root is None:
            raise InputError(f"input {match!r} must lie under an input folder ({allowed})")
        owner = console_folder(real)
        if owner:
            raise InputError(f"input {match!r} is in {own_folder(owner)}")
        if not follow_symlinks and through_link(Path(match), real_roots):
            raise _linked(match)
        if not real.is_file():
            raise InputError(f"input {match!r} does not exist or is not a file")
        files.append(str(real))
    return files


def _linked(path: str) -> InputError:
    return InputError(
        f"input {path!r} is reached through a symbolic link; links are not followed "
        "(an administrator can allow links that stay inside the input folders with "
        "BPCONSOLE_INPUT_FOLLOW_SYMLINKS)"
    )


class _Walk:
    """One pattern's expansion below a folder inside the roots, bounded as it goes."""

    def __init__(self, raw: str, real_roots: Sequence[Path], *, follow_symlinks: bool) -> None:
        self.raw = raw
        self.real_roots = real_roots
        self.follow_symlinks = follow_symlinks
        self.folders = 0
        self.entries = 0

    def expand(self, start: Path, parts: Sequence[str]) -> list[str]:
        """The paths below ``start`` that ``parts`` (one pattern per level) match."""
        level = [str(start)]
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            found: list[str] = []
            for folder in level:
                self._enter(folder)
                if glob.has_magic(part):
                    for path in self._matching(folder, part, folders_only=not last):
                        found.append(path)
                        if last and len(found) > MAX_INPUT_FILES:
                            raise InputError(
                                f"{self.raw!r} matches more than {MAX_INPUT_FILES} files"
                            )
                    continue
                path = os.path.join(folder, part)  # noqa: PTH118 - strings, as scandir gives
                if os.path.lexists(path) if last else Path(path).is_dir():
                    found.append(path)
            level = found
        return level

    def _enter(self, folder: str) -> None:
        """Count a folder the walk looks into, and refuse it when it is one too many,
        outside the roots once resolved, or reached through a link when links are not
        followed."""
        self.folders += 1
        if self.folders > MAX_WALKED_FOLDERS:
            raise InputError(
                f"{self.raw!r} looks into more than {MAX_WALKED_FOLDERS} folders; "
                "name fewer (a fixed folder before the wildcards)"
            )
        real = Path(os.path.realpath(folder))
        if not any(real == r or r in real.parents for r in self.real_roots):
            allowed = ", ".join(str(r) for r in self.real_roots)
            raise InputError(f"input {folder!r} must lie under an input folder ({allowed})")
        if not self.follow_symlinks and through_link(Path(folder), self.real_roots):
            raise _linked(folder)

    def _matching(self, folder: str, part: str, *, folders_only: bool) -> Iterator[str]:
        matcher = re.compile(fnmatch.translate(part)).match
        hidden_too = part.startswith(".")
        try:
            listing = os.scandir(folder)
        except OSError:
            return
        with listing:
            for entry in listing:
                self.entries += 1
                if self.entries > MAX_WALKED_ENTRIES:
                    raise InputError(
                        f"{self.raw!r} looks at more than {MAX_WALKED_ENTRIES} names; "
                        "name fewer (a fixed folder before the wildcards)"
                    )
                if entry.name.startswith(".") and not hidden_too:
                    continue
                if not matcher(entry.name):
                    continue
                if folders_only and not entry.is_dir():
                    continue
                yield entry.path


def own_folder(setting: str) -> str:
    """The console's own folder a setting names, for a refusal."""
    what = "data folder" if setting == "BPCONSOLE_DATA_DIR" else "sink folder"
    return (
        f"the console's {what} ({setting}): runs' files and sinks' outputs are never a run's input"
    )


def through_link(path: Path, real_roots: Sequence[Path]) -> bool:
    """Is ``path``, or a folder between it and the input root holding it, a link?"""
    roots = {str(r) for r in real_roots}
    for step in (path, *path.parents):
        if os.path.realpath(step) in roots:
            return False  # the root itself may be a link: an administrator chose it
        if step.is_symlink():
            return True
    return False


class InputRecord(TypedDict):
    """What a run records of its input files when it is created."""

    paths: list[str]  # resolved (and inside the input roots, from the console)
    extents: list[list[int]]  # each file's [data start, size] as measured then
    extent_total: int


def input_record(files: Sequence[InputFile]) -> InputRecord:
    return {
        "paths": [f.path for f in files],
        "extents": [[f.data_start, f.size] for f in files],
        "extent_total": sum(f.size - f.data_start for f in files),
    }


def recorded_inputs(spec: Mapping[str, Any], fmt: str) -> list[InputFile]:
    """A run's input files as it recorded them when it was created: what its source
    reads and its coverage counts, whatever happens to the files since. Never expanded
    or resolved again, so a file swapped for a symbolic link is refused where it is
    read, not followed. A run recorded before extents were is measured again."""
    paths = spec["paths"]
    extents = spec.get("extents")
    if extents is None:
        return [measure_file(Path(path), fmt) for path in paths]
    return [
        InputFile(path, int(start), int(size))
        for path, (start, size) in zip(paths, extents, strict=True)
    ]


def measure_file(path: Path, fmt: str, opener: Opener = FROM_TOP) -> InputFile:
    """The file at ``path`` measured, opened by ``opener`` (no component of its path
    followed if it is a symbolic link: a caller resolves links first where it allows
    them). A file whose suffix names another format than ``fmt`` is refused
    (``check_suffix``)."""
    check_suffix(str(path), fmt)
    with os.fdopen(_opened(opener, str(path)), "rb") as handle:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            try:
                rows = pq.ParquetFile(handle).metadata.num_rows
            except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
                raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
            return InputFile(str(path), 0, rows)
        size = os.fstat(handle.fileno()).st_size
        start = 0
        if fmt == "csv":
            header = handle.readline(MAX_HEADER_BYTES + 1)
            if len(header) > MAX_HEADER_BYTES:
                raise InputError(
                    f"{path}: the CSV header line is longer than {MAX_HEADER_BYTES // 1024} KB"
                )
            start = len(header)
    return InputFile(str(path), start, size)


def check_suffix(name: str, fmt: str) -> None:
    """Refuse a file name or pattern whose suffix names another format than ``fmt``,
    saying which and what to change."""
    named = SUFFIX_FORMATS.get(Path(name).suffix.lower())
    if named is not None and named != fmt:
        raise InputError(
            f"{name}: its name says {FORMAT_NAMES[named]}, but the source reads "
            f"{FORMAT_NAMES[fmt]} (format: {fmt}); set the source's format to {named} "
            "or give it files of its format"
        )


def chunks(
    files: FilesByNumber,
    fmt: str,
    *,
    segment_bytes: int,
    route_by: str,
    start_file: int = 0,
    stop_file: int | None = None,
    start_offset: int | None = None,
    start_index: int = 0,
    in_place: bool = False,
    opener: Opener = FROM_TOP,
) -> Iterator[Chunk]:
    """Chunks from a position on (to resume after a crash), in input order, of the
    files numbered ``start_file`` up to ``stop_file`` (default: all of them), each file
    opened by ``opener``. With ``in_place``, a line file that is one chunk, header and
    last newline included, is marked to become its segment as it is
    (``Chunk.in_place``)."""
    index = start_index
    for file_index in range(start_file, len(files) if stop_file is None else stop_file):
        item = files[file_index]
        offset = (
            item.data_start
            if (start_offset is None or file_index != start_file)
            else (start_offset)
        )
        if fmt == "parquet":
            for chunk_offset, rows, body, tag in _parquet_chunks(
                item, offset, segment_bytes, route_by, opener
            ):
                yield Chunk(
                    index,
                    file_index,
                    chunk_offset,
                    rows,
                    tag,
                    len(body),
                    body,
                    item.path,
                    kind="parquet",
                    opener=opener,
                )
                index += 1
            continue
        head = _header_line(item, opener) if fmt == "csv" else b""
        tag_of = _csv_tagger(head, route_by) if fmt == "csv" else _json_tagger(route_by)
        lines = _line_ranges(item, offset, segment_bytes, tag_of, opener)
        for chunk_offset, length, size, tag in lines:
            # The header (if any) is the file's first line, so the segment's bytes are
            # the file's when the range is all of its data and needs no newline added.
            whole = chunk_offset == item.data_start and chunk_offset + length == item.size
            yield Chunk(
                index,
                file_index,
                chunk_offset,
                length,
                tag,
                len(head) + size,
                None,
                item.path,
                head=head,
                kind=fmt,
                in_place=in_place and whole and size == length,
                opener=opener,
            )
            index += 1


def write_chunk(path: Path, chunk: Chunk) -> int:
    """The chunk's segment file, all or nothing; returns its size. Raises
    :class:`InputError` when its input file is no longer what was measured."""
    if chunk.body is not None:
        return write_atomic(path, chunk.body)
    fd = _opened(chunk.opener, chunk.path)
    try:
        if chunk.in_place and link_atomic(
            path, fd, chunk.size, lambda at: chunk.opener.link_file(chunk.path, at)
        ):
            return chunk.size
        return copy_atomic(
            path,
            fd,
            chunk.offset,
            chunk.length,
            newline=chunk.size > len(chunk.head) + chunk.length,
            head=chunk.head,
        )
    except SourceFileError as exc:
        raise changed_input(chunk.path, exc.strerror) from exc
    finally:
        os.close(fd)


def changed_input(path: str, why: str | None) -> InputError:
    """The error of a run's input file that is no longer what the run measured."""
    return InputError(
        f"input {path} changed since it was measured ({why}): "
        "a run's input files must stay as they are until it ends"
    )


def _opened(opener: Opener, path: str) -> int:
    """A descriptor of the input file at ``path``, no component of it followed if it is
    a symbolic link; :class:`InputError` when it is gone or was swapped since it was
    measured."""
    try:
        return opener.open_file(path)
    except OSError as exc:
        raise changed_input(path, exc.strerror) from exc


CUT_WINDOW = 64 * 1024


def _line_ranges(
    item: InputFile,
    offset: int,
    segment_bytes: int,
    tag_of: Callable[[bytes], str],
    opener: Opener,
) -> Iterator[tuple[int, int, int, str]]:
    """(offset, length, size without a header, tag) of each chunk of a line format: cut
    after the first newline at or past ``segment_bytes``, so records never split."""
    fd = _opened(opener, item.path)
    try:
        while offset < item.size:
            end = _line_end(fd, min(item.size, offset + segment_bytes) - 1, item.size)
            if end <= offset:  # the file ends before its measured size: nothing more
                return
            length = end - offset
            newline = os.pread(fd, 1, end - 1) == b"\n"
            yield offset, length, length + (not newline), tag_of(_first_line(fd, offset, end))
            offset = end
    finally:
        os.close(fd)


def _line_end(fd: int, position: int, size: int) -> int:
    """The offset just past the line holding ``position`` (or the end of the file)."""
    while position < size:
        window = os.pread(fd, CUT_WINDOW, position)
        if not window:  # the file is shorter than measured: it changed under the reader
            return position
        found = window.find(b"\n")
        if found >= 0:
            return position + found + 1
        position += len(window)
    return size


def _first_line(fd: int, start: int, end: int) -> bytes:
    """The range's bytes up to the end of its first non-empty line (read no further)."""
    head = b""
    position = start
    while position < end:
        read = os.pread(fd, min(CUT_WINDOW, end - position), position)
        if not read:  # shorter than measured: changed under the reader
            break
        head += read
        position = start + len(head)
        if head.strip() and b"\n" in head.lstrip():
            break
    return head


def _header_line(item: InputFile, opener: Opener) -> bytes:
    """A CSV file's header line, newline included: the first line of each of its
    segments, so a segment is a CSV file Spark reads with ``header``."""
    with os.fdopen(_opened(opener, item.path), "rb") as handle:
        line = handle.readline(item.data_start)
    return line if line.endswith(b"\n") else line + b"\n"


def _json_tagger(route_by: str) -> Callable[[bytes], str]:
    return lambda head: record_tag(head, route_by)


def _csv_tagger(header: bytes, route_by: str) -> Callable[[bytes], str]:
    """The routing field of a CSV chunk's first record, by its column in the header."""
    names = next(csv.reader([header.decode("utf-8", "replace")]), [])
    column = names.index(route_by) if route_by in names else -1

    def tag(head: bytes) -> str:
        for row in csv.reader(io.StringIO(head.decode("utf-8", "replace"))):
            if row:
                return row[column] if 0 <= column < len(row) else ""
        return ""

    return tag


def _parquet_chunks(
    item: InputFile, offset: int, segment_bytes: int, route_by: str, opener: Opener
) -> Iterator[tuple[int, int, bytes, str]]:
    """(first row, rows, Parquet file, tag) of each chunk: the input's rows cut into
    Parquet files of about ``segment_bytes`` in memory, columns and types kept. Read a
    row group at a time: the source holds at most the groups one chunk spans, never
    the whole file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Closed when the chunks end or the source stops reading them (the generator's
    # close), not whenever the garbage collector gets to it.
    with os.fdopen(_opened(opener, item.path), "rb") as handle:
        groups = _RowGroups(pq.ParquetFile(handle))
        rows_per_chunk = max(1, segment_bytes // groups.row_bytes())
        while offset < item.size:
            part = groups.rows(offset, rows_per_chunk)
            if part.num_rows == 0:  # the file has fewer rows than measured
                return
            sink = pa.BufferOutputStream()
            pq.write_table(part, sink)
            first = part.column(route_by)[0].as_py() if route_by in part.column_names else None
            tag = "" if first is None else str(first)
            yield offset, part.num_rows, sink.getvalue().to_pybytes(), tag
            offset += part.num_rows


class _RowGroups:
    """A Parquet file's rows by index, its row groups read as needed and the last one
    kept (chunks are read in order)."""

    def __init__(self, file: pq.ParquetFile) -> None:
        self.file = file
        meta = file.metadata
        self.starts = [0]
        for index in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(index).num_rows)
        self.cached: tuple[int, pa.Table] | None = None

    def row_bytes(self) -> int:
        """Bytes per row in memory, from the first row group (the same on every resume,
        so chunks are cut at the same rows)."""
        if len(self.starts) < 2 or self.starts[1] == 0:
            return 1
        first = self._group(0)
        return max(1, first.nbytes // first.num_rows)

    def rows(self, start: int, count: int) -> pa.Table:
        import pyarrow as pa

        parts = []
        end = min(start + count, self.starts[-1])
        index = max(0, bisect_right(self.starts, start) - 1)
        while start < end and index < len(self.starts) - 1:
            group = self._group(index)
            low = start - self.starts[index]
            take = min(end, self.starts[index + 1]) - start
            parts.append(group.slice(low, take))
            start += take
            index += 1
        if not parts:
            return self.file.schema_arrow.empty_table()
        return pa.concat_tables(parts)

    def _group(self, index: int) -> pa.Table:
        if self.cached is None or self.cached[0] != index:
            self.cached = (index, self.file.read_row_group(index))
        return self.cached[1]


def record_tag(body: bytes, route_by: str) -> str:
    """The routing field of the chunk's first record (only that line is parsed)."""
    start = 0
    while start < len(body):
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        line = body[start:end]
        start = end + 1
        if not line.strip():
            continue
        try:
            value = json.loads(line).get(route_by)
        except (ValueError, AttributeError):
            return ""
        return "" if value is None else str(value)
    return ""
