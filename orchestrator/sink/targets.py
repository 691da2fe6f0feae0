"""A windowed run's sink target: checked before the run starts, written as windows close.

Each target takes the rows of the windows that close in one step of the sink's
watermark (``orchestrator/ledger/windows.py``), and is exactly once:

- ``results``: the run's own table; closing is marking its rows, in the ledger's
  transaction.
- ``postgres`` on the console's database: rows upserted in that same transaction, with
  a commit log row per window; a crash before the commit leaves neither.
- ``postgres`` elsewhere (a database the admin named): rows and commit log upserted in
  the target's own transaction, committed before the ledger's; a crash between the two
  writes the same rows again, and an upsert of equal rows changes nothing.
- ``parquet``: one file per window, written aside and renamed, then the manifest
  listing the committed windows, rewritten aside and renamed: a reader of the manifest
  never sees a half file or a window twice, and a rewrite after a crash is the same file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from orchestrator.pipeline.beneath import Folder, LeavesRoot, open_root
from sparkjobs.event_time import iso

MANIFEST = "_manifest.json"
AVG = Decimal("1.0000000000")  # the average's scale, as the other money columns


class SinkError(RuntimeError):
    """The sink cannot be written as the pipeline asks; the message says why."""


@dataclass(frozen=True)
class ClosedRow:
    start_us: int
    end_us: int
    key: str
    count: int
    sum: Decimal
    min: Decimal
    max: Decimal
    distinct: int

    @property
    def avg(self) -> Decimal:
        return (self.sum / self.count).quantize(AVG) if self.count else Decimal(0)


class Sink(Protocol):
    @property
    def in_ledger_transaction(self) -> bool:
        """Is it written inside the ledger's transaction?"""

    def check(self) -> None:
        """Refuse, before the run starts, a target that cannot be written."""

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        """Write the rows of the windows closing now, idempotently."""


class ResultTable:
    @property
    def in_ledger_transaction(self) -> bool:
        return True

    def check(self) -> None:
        return None

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        return None  # closing the ledger's rows is the write


# The columns a table sink needs, with the types PostgreSQL reports for them.
COLUMNS: Mapping[str, tuple[str, ...]] = {
    "window_start": ("timestamp with time zone",),
    "window_end": ("timestamp with time zone",),
    "key": ("text", "character varying"),
    "count": ("bigint",),
    "sum": ("numeric",),
    "min": ("numeric",),
    "max": ("numeric",),
    "avg": ("numeric",),
    "distinct_users": ("bigint",),
    "run_id": ("bigint",),
}
CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
  window_start timestamptz NOT NULL,
  window_end timestamptz NOT NULL,
  key text NOT NULL,
  count bigint NOT NULL,
  sum numeric(38, 10) NOT NULL,
  min numeric(38, 10) NOT NULL,
  max numeric(38, 10) NOT NULL,
  avg numeric(38, 10) NOT NULL,
  distinct_users bigint NOT NULL,
  run_id bigint NOT NULL,
  PRIMARY KEY (window_start, key)
);
CREATE TABLE IF NOT EXISTS {log} (
  run_id bigint NOT NULL,
  window_start timestamptz NOT NULL,
  window_end timestamptz NOT NULL,
  rows integer NOT NULL,
  committed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, window_start)
)
"""
UPSERT = """
INSERT INTO {table} AS t (window_start, window_end, key, count, sum, min, max, avg,
                          distinct_users, run_id)
SELECT to_timestamp(d.s / 1e6), to_timestamp(d.e / 1e6), d.key, d.count, d.sum, d.min,
       d.max, d.avg, d.distinct_users, %s
FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::bigint[], %s::numeric[],
            %s::numeric[], %s::numeric[], %s::numeric[], %s::bigint[])
  AS d(s, e, key, count, sum, min, max, avg, distinct_users)
ON CONFLICT (window_start, key) DO UPDATE SET
  window_end = EXCLUDED.window_end, count = EXCLUDED.count, sum = EXCLUDED.sum,
  min = EXCLUDED.min, max = EXCLUDED.max, avg = EXCLUDED.avg,
  distinct_users = EXCLUDED.distinct_users, run_id = EXCLUDED.run_id
"""
LOG = """
INSERT INTO {log} (run_id, window_start, window_end, rows)
SELECT %s, to_timestamp(d.s / 1e6), to_timestamp(d.e / 1e6), d.n
FROM unnest(%s::bigint[], %s::bigint[], %s::int[]) AS d(s, e, n)
ON CONFLICT (run_id, window_start) DO UPDATE SET rows = EXCLUDED.rows
"""


@dataclass(frozen=True)
class PostgresTable:
    """A table (created if absent) in a database the admin named."""

    table: str
    database: str

    @property
    def in_ledger_transaction(self) -> bool:
        return self.database == "console"

    def _url(self) -> str:
        named: Mapping[str, str] = settings.BPCONSOLE_SINK_DATABASES
        if self.database not in named:
            known = ", ".join(sorted(named))
            raise SinkError(f"database {self.database!r} is not configured (known: {known})")
        return named[self.database]

    def _names(self) -> tuple[sql.Identifier, sql.Identifier]:
        return sql.Identifier(self.table), sql.Identifier(f"{self.table}_commits")

    def check(self) -> None:
        if self.in_ledger_transaction:
            # The console's own database, as Django reaches it (a test's database too).
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    self._create(cursor)
            except DatabaseError as exc:
                raise SinkError(f"table {self.table}: {exc}") from exc
            return
        try:
            with psycopg.connect(self._url(), connect_timeout=5) as conn:
                self._create(conn.cursor())
        except psycopg.Error as exc:
            raise SinkError(f"table {self.table} in database {self.database}: {exc}") from exc

    def _create(self, cursor: Any) -> None:
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s",
            [self.table],
        )
        found = dict(cursor.fetchall())
        if found:
            wrong = [
                f"{name} ({found.get(name, 'missing')}; needs {types[0]})"
                for name, types in COLUMNS.items()
                if found.get(name) not in types
            ]
            if wrong:
                raise SinkError(
                    f"table {self.table} exists and its columns do not fit: {', '.join(wrong)}"
                )
        table, log = self._names()
        cursor.execute(sql.SQL(CREATE).format(table=table, log=log))
        cursor.execute(
            "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace"
            " AND i.indisunique AND i.indnkeyatts = 2"
            " AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a"
            "      WHERE a.attrelid = c.oid AND a.attnum = ANY(i.indkey))"
            "     = ARRAY['key', 'window_start']",
            [self.table],
        )
        if cursor.fetchone() is None:
            raise SinkError(f"table {self.table} needs a unique key on (window_start, key)")

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        if not rows:
            return
        if self.in_ledger_transaction:
            with connection.cursor() as cursor:
                self._upsert(cursor, run_id, rows)
            return
        try:
            with psycopg.connect(self._url(), connect_timeout=5) as conn:
                self._upsert(conn.cursor(), run_id, rows)
        except psycopg.Error as exc:
            raise SinkError(f"table {self.table} in database {self.database}: {exc}") from exc

    def _upsert(self, cursor: Any, run_id: int, rows: Sequence[ClosedRow]) -> None:
        table, log = self._names()
        cursor.execute(
            sql.SQL(UPSERT).format(table=table),
            [
                run_id,
                [r.start_us for r in rows],
                [r.end_us for r in rows],
                [r.key for r in rows],
                [r.count for r in rows],
                [r.sum for r in rows],
                [r.min for r in rows],
                [r.max for r in rows],
                [r.avg for r in rows],
                [r.distinct for r in rows],
            ],
        )
        windows = _windows(rows)
        cursor.execute(
            sql.SQL(LOG).format(log=log),
            [run_id, [w[0] for w in windows], [w[1] for w in windows], [w[2] for w in windows]],
        )


def _windows(rows: Sequence[ClosedRow]) -> list[tuple[int, int, int]]:
    """(start, end, rows) of each window among ``rows``."""
    counts: dict[tuple[int, int], int] = {}
    for r in rows:
        counts[(r.start_us, r.end_us)] = counts.get((r.start_us, r.end_us), 0) + 1
    return [(s, e, n) for (s, e), n in sorted(counts.items())]


PARQUET_FIELDS: list[pa.Field[Any]] = [
    pa.field("window_start", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("window_end", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
    pa.field("sum", pa.decimal128(38, 10), nullable=False),
    pa.field("min", pa.decimal128(38, 10), nullable=False),
    pa.field("max", pa.decimal128(38, 10), nullable=False),
    pa.field("avg", pa.decimal128(38, 10), nullable=False),
    pa.field("distinct_users", pa.int64(), nullable=False),
    pa.field("run_id", pa.int64(), nullable=False),
]
PARQUET_SCHEMA = pa.schema(PARQUET_FIELDS)


@dataclass(frozen=True)
class ParquetFolder:
    """One Parquet file per closed window below the sink root, and a manifest."""

    path: str

    @property
    def in_ledger_transaction(self) -> bool:
        return False

    def folder(self) -> Folder:
        """The folder, made where missing, walked from the sink root's descriptor with
        no component followed if it is a symbolic link (a link inside the root pointing
        out of it included); the caller closes it."""
        try:
            with open_root(settings.BPCONSOLE_SINK_ROOT, create=True) as root:
                return root.open_folder(self.path, shown=self.path, create=True)
        except LeavesRoot as exc:
            raise SinkError(f"path {self.path!r} leaves the sink root: {exc}") from None
        except OSError as exc:
            raise SinkError(f"path {self.path!r} cannot be written: {exc.strerror}") from exc

    def check(self) -> None:
        with self.folder() as folder:
            try:
                probe = f".probe-{secrets.token_hex(8)}"
                os.close(folder.create(probe))
                folder.unlink(probe)
            except OSError as exc:
                raise SinkError(f"path {self.path!r} cannot be written: {exc.strerror}") from exc

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        if not rows:
            return
        with self.folder() as folder:
            try:
                by_window: dict[tuple[int, int], list[ClosedRow]] = {}
                for r in rows:
                    by_window.setdefault((r.start_us, r.end_us), []).append(r)
                entries = []
                for (start, end), window_rows in sorted(by_window.items()):
                    name = f"window-{start}.parquet"
                    _write_parquet(folder, name, run_id, window_rows)
                    entries.append(
                        {
                            "start": iso(start),
                            "end": iso(end),
                            "start_us": start,
                            "file": name,
                            "rows": len(window_rows),
                            "run": run_id,
                        }
                    )
                _add_to_manifest(folder, entries)
            except OSError as exc:
                raise SinkError(f"path {self.path!r} cannot be written: {exc.strerror}") from exc


def _write_parquet(folder: Folder, name: str, run_id: int, rows: Sequence[ClosedRow]) -> None:
    rows = sorted(rows, key=lambda r: r.key)
    table = pa.Table.from_pydict(
        {
            "window_start": [r.start_us for r in rows],
            "window_end": [r.end_us for r in rows],
            "key": [r.key for r in rows],
            "count": [r.count for r in rows],
            "sum": [r.sum for r in rows],
            "min": [r.min for r in rows],
            "max": [r.max for r in rows],
            "avg": [r.avg for r in rows],
            "distinct_users": [r.distinct for r in rows],
            "run_id": [run_id] * len(rows),
        },
        schema=PARQUET_SCHEMA,
    )
    _atomically(folder, name, lambda handle: pq.write_table(table, handle))


def _add_to_manifest(folder: Folder, entries: list[dict[str, Any]]) -> None:
    kept: dict[int, dict[str, Any]] = {}
    try:
        fd = folder.open_file(MANIFEST, shown=MANIFEST)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    else:
        with os.fdopen(fd, "rb") as handle:
            for entry in json.load(handle)["windows"]:
                kept[int(entry["start_us"])] = entry
    for entry in entries:
        kept[int(entry["start_us"])] = entry
    body = json.dumps({"windows": [kept[s] for s in sorted(kept)]}, indent=1).encode()
    _atomically(folder, MANIFEST, lambda handle: handle.write(body))


def _atomically(folder: Folder, name: str, write: Any) -> None:
    """Write aside, flush to disk, rename over: readers see the old file or the new.
    Every step is relative to the folder's descriptor, and pyarrow writes to the file
    object of a descriptor opened here (never a path it would resolve itself)."""
    tmp = f".{name}.{secrets.token_hex(8)}"
    try:
        with os.fdopen(folder.create(tmp), "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        folder.rename(tmp, folder, name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            folder.unlink(tmp)
        raise
    folder.sync()


def sink_of(params: Mapping[str, object]) -> Sink:
    """The target a sink node's parameters name."""
    kind = params.get("sink", "results")
    if kind == "postgres":
        return PostgresTable(str(params["table"]), str(params.get("database", "console")))
    if kind == "parquet":
        return ParquetFolder(str(params["path"]))
    return ResultTable()
