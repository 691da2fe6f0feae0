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

A target's columns are the pipeline's (``orchestrator/sink/layout.py``): an existing
table whose columns do not fit them is refused before the run, naming the columns.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from orchestrator.pipeline.beneath import Folder, LeavesRoot, open_root
from orchestrator.sink.layout import Cell, Kind, Layout
from sparkjobs.event_time import iso

MANIFEST = "_manifest.json"


class SinkError(RuntimeError):
    """The sink cannot be written as the pipeline asks; the message says why."""


@dataclass(frozen=True)
class ClosedRow:
    """A row of a closed window: its bounds, then the layout's cells in order."""

    start_us: int
    end_us: int
    cells: tuple[Cell, ...]


class Sink(Protocol):
    @property
    def layout(self) -> Layout:
        """The columns it writes."""

    @property
    def in_ledger_transaction(self) -> bool:
        """Is it written inside the ledger's transaction?"""

    def check(self) -> None:
        """Refuse, before the run starts, a target that cannot be written."""

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        """Write the rows of the windows closing now, idempotently."""


@dataclass(frozen=True)
class ResultTable:
    layout: Layout

    @property
    def in_ledger_transaction(self) -> bool:
        return True

    def check(self) -> None:
        return None

    def write(self, run_id: int, rows: Sequence[ClosedRow]) -> None:
        return None  # closing the ledger's rows is the write


# Each kind's PostgreSQL type as a column is created, the types PostgreSQL reports
# that fit it, and its Parquet type.
PG_TYPES: Mapping[Kind, tuple[str, tuple[str, ...]]] = {
    "text": ("text", ("text", "character varying")),
    "bigint": ("bigint", ("bigint",)),
    "double": ("double precision", ("double precision",)),
    "numeric": ("numeric(38, 10)", ("numeric",)),
    "boolean": ("boolean", ("boolean",)),
}
ARRAY_TYPES: Mapping[Kind, str] = {
    "text": "text[]",
    "bigint": "bigint[]",
    "double": "float8[]",
    "numeric": "numeric[]",
    "boolean": "boolean[]",
}
TIMESTAMP = "timestamp with time zone"
LOG = """
CREATE TABLE IF NOT EXISTS {log} (
  run_id bigint NOT NULL,
  window_start timestamptz NOT NULL,
  window_end timestamptz NOT NULL,
  rows integer NOT NULL,
  committed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, window_start)
)
"""
COMMIT = """
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
    layout: Layout

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

    def _columns(self) -> list[tuple[str, str, tuple[str, ...], bool]]:
        """(name, type created, types that fit, nullable) of every column."""
        around = [("window_start", "timestamptz", (TIMESTAMP,), False)]
        around.append(("window_end", "timestamptz", (TIMESTAMP,), False))
        own = [(c.name, *PG_TYPES[c.kind], c.nullable) for c in self.layout.columns]
        return [*around, *own, ("run_id", "bigint", ("bigint",), False)]

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
                f"{name} ({found.get(name, 'missing')}; needs {fits[0]})"
                for name, _, fits, _ in self._columns()
                if found.get(name) not in fits
            ]
            if wrong:
                raise SinkError(
                    f"table {self.table} exists and its columns do not fit: {', '.join(wrong)}"
                )
        table, log = self._names()
        key = ["window_start", *self.layout.key]
        nullable = {c.name for c in self.layout.columns if c.nullable}
        # A null group value is a group: the key treats nulls as equal (PostgreSQL 15).
        unique = (
            sql.SQL("UNIQUE NULLS NOT DISTINCT ({})")
            if nullable & set(key)
            else sql.SQL("PRIMARY KEY ({})")
        ).format(sql.SQL(", ").join(map(sql.Identifier, key)))
        columns = [
            sql.SQL("{} {}{}").format(
                sql.Identifier(name), sql.SQL(kind), sql.SQL("" if null else " NOT NULL")
            )
            for name, kind, _, null in self._columns()
        ]
        cursor.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {table} ({columns}, {unique})").format(
                table=table, columns=sql.SQL(", ").join(columns), unique=unique
            )
        )
        cursor.execute(sql.SQL(LOG).format(log=log))
        self._check_key(cursor, key, needs_nulls_equal=bool(nullable & set(key)))

    def _check_key(self, cursor: Any, key: list[str], *, needs_nulls_equal: bool) -> None:
        """The table has a unique index on exactly the row's key (nulls equal where a key
        column may be null), so a window written again replaces its rows."""
        cursor.execute(
            "SELECT (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a"
            "        WHERE a.attrelid = c.oid AND a.attnum = ANY(i.indkey)),"
            "       i.indnullsnotdistinct"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace"
            " AND i.indisunique AND i.indnkeyatts = %s",
            [self.table, len(key)],
        )
        wanted = sorted(key)
        fits = [
            names
            for names, nulls_equal in cursor.fetchall()
            if names == wanted and (nulls_equal or not needs_nulls_equal)
        ]
        if not fits:
            nulls = " NULLS NOT DISTINCT" if needs_nulls_equal else ""
            raise SinkError(f"table {self.table} needs a unique key{nulls} on ({', '.join(key)})")

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
        own = self.layout.columns
        names = ["window_start", "window_end", *(c.name for c in own), "run_id"]
        cells = [sql.Identifier(f"c{i}") for i in range(len(own))]
        key = {"window_start", *self.layout.key}
        statement = sql.SQL(
            "INSERT INTO {table} AS t ({names}) "
            "SELECT to_timestamp(d.s / 1e6), to_timestamp(d.e / 1e6), {cells}, %s "
            "FROM unnest(%s::bigint[], %s::bigint[], {arrays}) AS d(s, e, {aliases}) "
            "ON CONFLICT ({key}) DO UPDATE SET {updates}"
        ).format(
            table=table,
            names=sql.SQL(", ").join(map(sql.Identifier, names)),
            cells=sql.SQL(", ").join(sql.SQL("d.{}").format(c) for c in cells),
            arrays=sql.SQL(", ").join(
                sql.SQL("%s::" + ARRAY_TYPES[c.kind])
                for c in own  # a fixed type name
            ),
            aliases=sql.SQL(", ").join(cells),
            key=sql.SQL(", ").join(map(sql.Identifier, ["window_start", *self.layout.key])),
            updates=sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                for n in names
                if n not in key
            ),
        )
        cursor.execute(
            statement,
            [
                run_id,
                [r.start_us for r in rows],
                [r.end_us for r in rows],
                *([r.cells[i] for r in rows] for i in range(len(own))),
            ],
        )
        windows = _windows(rows)
        cursor.execute(
            sql.SQL(COMMIT).format(log=log),
            [run_id, [w[0] for w in windows], [w[1] for w in windows], [w[2] for w in windows]],
        )


def _windows(rows: Sequence[ClosedRow]) -> list[tuple[int, int, int]]:
    """(start, end, rows) of each window among ``rows``."""
    counts: dict[tuple[int, int], int] = {}
    for r in rows:
        counts[(r.start_us, r.end_us)] = counts.get((r.start_us, r.end_us), 0) + 1
    return [(s, e, n) for (s, e), n in sorted(counts.items())]


ARROW_TYPES: Mapping[Kind, pa.DataType] = {
    "text": pa.string(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "numeric": pa.decimal128(38, 10),
    "boolean": pa.bool_(),
}


def parquet_schema(layout: Layout) -> pa.Schema:
    """A window file's schema: the window's bounds, the layout's columns, the run."""
    stamp = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("window_start", stamp, nullable=False),
            pa.field("window_end", stamp, nullable=False),
            *(pa.field(c.name, ARROW_TYPES[c.kind], nullable=c.nullable) for c in layout.columns),
            pa.field("run_id", pa.int64(), nullable=False),
        ]
    )


@dataclass(frozen=True)
class ParquetFolder:
    """One Parquet file per closed window below the sink root, and a manifest."""

    path: str
    layout: Layout

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
                    _write_parquet(folder, name, run_id, window_rows, self.layout)
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


def _write_parquet(
    folder: Folder, name: str, run_id: int, rows: Sequence[ClosedRow], layout: Layout
) -> None:
    """A window's rows, in key order (a null value first), as one Parquet file."""
    at = [i for i, c in enumerate(layout.columns) if c.name in layout.key]
    rows = sorted(rows, key=lambda r: [(r.cells[i] is not None, str(r.cells[i])) for i in at])
    columns: dict[str, list[Any]] = {
        "window_start": [r.start_us for r in rows],
        "window_end": [r.end_us for r in rows],
    }
    for i, c in enumerate(layout.columns):
        columns[c.name] = [r.cells[i] for r in rows]
    columns["run_id"] = [run_id] * len(rows)
    table = pa.Table.from_pydict(columns, schema=parquet_schema(layout))
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


def sink_of(params: Mapping[str, object], layout: Layout) -> Sink:
    """The target a sink node's parameters name, writing ``layout``'s columns."""
    kind = params.get("sink", "results")
    if kind == "postgres":
        return PostgresTable(str(params["table"]), str(params.get("database", "console")), layout)
    if kind == "parquet":
        return ParquetFolder(str(params["path"]), layout)
    return ResultTable(layout)
