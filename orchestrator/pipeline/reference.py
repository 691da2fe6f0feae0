"""A join's reference table, snapshotted when a run starts.

A ``join`` node names a file below the input folders (``params.reference``) or a
PostgreSQL table of a database the admin named (``params.table`` and ``database``, never
the console's own). When a run is created, a file is found there as any input is
(``confined_files``: inside a root, no link out unless links are allowed, not a console
folder), opened beneath its root and copied, and a table is read and written as Parquet,
into the snapshot store, ``DATA_DIR/reference/<sha256><suffix>``, bounded by
``BPCONSOLE_REFERENCE_MAX_MB``. Whether a pipeline may read a table another pipeline's
sink writes is the run's creation's to say (orchestrator/run/lifecycle.py). The run's
graph names the copy on the node (``reference_file``), and every batch of the run, every
retry and the run's plain job read that copy: a table changed or removed meanwhile
changes nothing the run computes. The store is content-addressed, so runs over the same
table share one copy, and a snapshot written half-way is never taken for one (written
aside, then renamed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from psycopg import sql

from balancer.document import NodeDocument, PipelineDocument
from orchestrator.pipeline.beneath import Roots, WalkError
from orchestrator.pipeline.inputs import InputError, confined_files
from orchestrator.pipeline.sample import field_type_of, read_sample
from sparkjobs.catalog import CONSOLE_DATABASE, REFERENCE_FORMATS, operator_name
from sparkjobs.reference import REFERENCE_BY_FILE, REFERENCE_PATH
from sparkjobs.schemas import Field, FieldType, Schema, declared_proposal

CHUNK = 1 << 20


def store() -> Path:
    return Path(settings.DATA_DIR) / "reference"


def snapshot(reference: str) -> str:
    """Copy the table ``reference`` names into the store; the copy's file name. Raises
    :class:`InputError` saying what is wrong with it."""
    limit = int(settings.BPCONSOLE_REFERENCE_MAX_MB * 2**20)
    (path,) = _one_file(reference)
    try:
        with Roots(settings.INPUT_ROOTS) as roots:
            fd = roots.open_file(path)
    except WalkError as exc:
        raise InputError(f"the reference table {reference!r} cannot be read ({exc})") from None

    def copy(into: BinaryIO) -> None:
        size = 0
        with os.fdopen(fd, "rb") as source:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise InputError(
                        f"the reference table {reference!r} is over "
                        f"{settings.BPCONSOLE_REFERENCE_MAX_MB:g} MB "
                        "(BPCONSOLE_REFERENCE_MAX_MB)"
                    )
                into.write(chunk)

    return _into_store(copy, Path(path).suffix.lower())


def _into_store(write: Callable[[BinaryIO], None], suffix: str) -> str:
    """A copy made by ``write`` beside the store's files, then renamed to its SHA-256
    and ``suffix``: that file name. Owner-only; nothing half-written is left."""
    folder = store()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    aside = folder / f".{os.getpid()}-{os.urandom(6).hex()}"
    try:
        made = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(made, "wb") as copy:
            write(copy)
            copy.flush()
            os.fsync(copy.fileno())
        digest = hashlib.sha256()
        with aside.open("rb") as kept:
            while chunk := kept.read(CHUNK):
                digest.update(chunk)
        name = digest.hexdigest() + suffix
        aside.replace(folder / name)
        return name
    finally:
        aside.unlink(missing_ok=True)


def snapshot_table(table: str, database: str) -> str:
    """Copy the PostgreSQL ``table`` of the admin-named ``database`` into the store, as
    Parquet with the table's types, its rows in the order of all their columns (the
    same rows give the same copy); the copy's file name. Read in a read-only
    transaction under a statement timeout, and refused past the size bound. Raises
    :class:`InputError` saying what is wrong."""
    limit = int(settings.BPCONSOLE_REFERENCE_MAX_MB * 2**20)
    where = f"the reference table {table!r} in database {database!r}"
    try:
        with _reading(database) as conn:
            probe = conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(sql.Identifier(table)))
            names = [c.name for c in probe.description or []]
            kinds = [_arrow_type(conn, c.type_code) for c in probe.description or []]
            order = sql.SQL(", ").join(sql.Literal(i + 1) for i in range(len(names)))
            query = sql.SQL("SELECT * FROM {} ORDER BY {}").format(sql.Identifier(table), order)
            rows: list[tuple[Any, ...]] = []
            size = 0
            with conn.cursor(name="reference") as cursor:
                cursor.execute(query)
                while batch := cursor.fetchmany(10_000):
                    size += sum(len(str(v)) for row in batch for v in row)
                    if size > limit:
                        raise InputError(
                            f"{where} is over {settings.BPCONSOLE_REFERENCE_MAX_MB:g} MB "
                            "(BPCONSOLE_REFERENCE_MAX_MB)"
                        )
                    rows.extend(batch)
    except psycopg.Error as exc:
        raise InputError(f"{where} cannot be read ({str(exc).strip()})") from None
    try:
        frame = pa.table(
            {
                name: pa.array([_value(row[i], kind) for row in rows], type=kind)
                for i, (name, kind) in enumerate(zip(names, kinds, strict=True))
            }
        )
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise InputError(f"{where} has values Parquet cannot hold ({exc})") from None
    return _into_store(lambda into: pq.write_table(frame, into), ".parquet")


def _reading(database: str) -> psycopg.Connection[Any]:
    """A read-only connection to the admin-named ``database`` whose statements time out.
    Raises :class:`InputError` for a database the admin did not name."""
    named: Mapping[str, str] = settings.BPCONSOLE_SINK_DATABASES
    if database == CONSOLE_DATABASE or database not in named:
        known = ", ".join(sorted(set(named) - {CONSOLE_DATABASE})) or "none"
        raise InputError(
            f"database {database!r} is not one the admin named for pipelines (known: {known})"
        )
    conn = psycopg.connect(named[database], connect_timeout=5)
    try:
        conn.read_only = True
        conn.execute("SET statement_timeout = '30s'")
    except psycopg.Error:
        conn.close()
        raise
    return conn


# A PostgreSQL column's type, by its name, as Parquet keeps it; any other is kept as text.
_ARROW_TYPES: Mapping[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "numeric": pa.decimal128(38, 10),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
}


def _arrow_type(conn: psycopg.Connection[Any], oid: int) -> pa.DataType:
    info = conn.adapters.types.get(oid)
    return _ARROW_TYPES.get(info.name if info is not None else "", pa.string())


def _value(value: Any, kind: pa.DataType) -> Any:
    return str(value) if value is not None and kind == pa.string() else value


def _one_file(reference: str) -> list[str]:
    roots = [Path(r) for r in settings.INPUT_ROOTS]
    try:
        files = confined_files(reference, roots, follow_symlinks=settings.INPUT_FOLLOW_SYMLINKS)
    except InputError as exc:
        raise InputError(f"the reference table {reference!r}: {exc}") from None
    if len(files) != 1:
        raise InputError(f"the reference table {reference!r} names {len(files)} files, not one")
    return files


def columns_of(params: Mapping[str, Any]) -> Schema | None:
    """The columns a join's table has now, typed as its job reads them; None when a file
    has no row to tell them by. Raises :class:`InputError` saying why the table cannot be
    read. Bounded as a schema's sample is (orchestrator/pipeline/sample.py), and a table
    is asked for no row."""
    if "table" in params:
        table, database = str(params["table"]), str(params.get("database", ""))
        where = f"the reference table {table!r} in database {database!r}"
        try:
            with _reading(database) as conn:
                probe = conn.execute(
                    sql.SQL("SELECT * FROM {} LIMIT 0").format(sql.Identifier(table))
                )
                described = [
                    (c.name, _arrow_type(conn, c.type_code)) for c in probe.description or []
                ]
        except psycopg.Error as exc:
            raise InputError(f"{where} cannot be read ({str(exc).strip()})") from None
        return declared_proposal((name, field_type_of(kind)) for name, kind in described).schema
    reference = str(params.get("reference", ""))
    (path,) = _one_file(reference)
    return _file_columns(path)


def snapshot_columns(name: str) -> Schema | None:
    """The columns of a snapshot in the store, as :func:`columns_of` tells them."""
    return _file_columns(str(store() / Path(name).name))


def _file_columns(path: str) -> Schema | None:
    """A reference file's columns as Spark reads the file (sparkjobs/reference.py): a
    CSV file's all text, a JSON lines file's as JSON has them (a date in a string stays
    a string), a Parquet file's its own."""
    fmt = REFERENCE_FORMATS[Path(path).suffix.lower()]
    sample = read_sample(path, fmt)
    if fmt == "parquet":
        return sample.proposal.schema
    if not sample.records:
        return None
    return Schema([Field(f.name, _as_read(f.type, fmt)) for f in sample.proposal.schema.fields])


def _as_read(proposed: FieldType, fmt: str) -> FieldType:
    if fmt == "csv" or (fmt == "jsonl" and proposed in ("date", "timestamp")):
        return "string"
    return proposed


def snapshot_of(params: Mapping[str, Any]) -> str:
    """The copy of a join's table: its file, or its table in a database."""
    if "table" in params:
        return snapshot_table(str(params["table"]), str(params.get("database", "")))
    return snapshot(str(params.get("reference", "")))


def snapshot_tables(doc: PipelineDocument) -> PipelineDocument:
    """``doc`` with each join node's table snapshotted (``reference_file``), for a run's
    graph. Raises :class:`InputError` naming the node."""
    nodes: list[NodeDocument] = []
    for node in doc["nodes"]:
        taken = node
        if operator_name(node) == "join" and "reference_file" not in node:
            try:
                taken = {**node, "reference_file": snapshot_of(node.get("params") or {})}
            except InputError as exc:
                raise InputError(f"node {node['name']}: {exc}") from None
        nodes.append(taken)
    return {**doc, "nodes": nodes}


def job_params(node: NodeDocument, by_file: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """The parameters ``node``'s Spark job runs with: its own, and for a join the file
    of its table's snapshot (taken now when the graph has none, as for a plain job
    over a pipeline that never ran), and the later copies of a refreshed table that
    records of the files ``by_file`` names join (file name -> copy's name)."""
    params: Mapping[str, Any] = node.get("params") or {}
    if operator_name(node) != "join":
        return params
    name = node.get("reference_file") or snapshot_of(params)
    found = {**params, REFERENCE_PATH: str(store() / Path(str(name)).name)}
    if by_file:
        found[REFERENCE_BY_FILE] = {
            file: str(store() / Path(copy).name) for file, copy in by_file.items()
        }
    return found
