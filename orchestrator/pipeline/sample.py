"""A schema proposed from the first records of an input file, for an operator to confirm
in the editor (``sparkjobs/schemas.py``, :func:`propose`).

The file is named as a run's input is: a path or glob below the input roots, resolved
by ``confined_files`` and opened by a walk that follows no link; the first file it names
is read. At most :data:`MAX_SAMPLE_BYTES` and :data:`MAX_SAMPLE_RECORDS` of it, whatever
its size; a Parquet file's schema is read from its footer, refused past
:data:`MAX_FOOTER_BYTES`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from balancer.document import PipelineDocument
from orchestrator.pipeline.beneath import FROM_TOP
from orchestrator.pipeline.graph import RunGraph
from orchestrator.pipeline.inputs import FORMATS, InputError, check_suffix, confined_files
from sparkjobs import key_form
from sparkjobs.catalog import operator_name
from sparkjobs.measures import Grouping
from sparkjobs.schemas import FieldType, Proposal, declared_proposal, propose

if TYPE_CHECKING:
    import pyarrow as pa

MAX_SAMPLE_BYTES = 1024 * 1024
MAX_SAMPLE_RECORDS = 1000
MAX_FOOTER_BYTES = 1024 * 1024


@dataclass
class Sample:
    """What the first records of ``file`` suggest."""

    file: str
    records: int  # read (of a Parquet file: all of them, as its footer counts them)
    malformed: int  # lines that are not a JSON object (JSON lines only)
    proposal: Proposal
    names: frozenset[str]  # every top-level field name the records have, in lower case


def sample_schema(raw: str, fmt: str, roots: Sequence[Path], *, follow_symlinks: bool) -> Sample:
    """The schema the first records of the first file ``raw`` names suggest; raises
    :class:`InputError` saying why there is none."""
    sample = _sample(raw, fmt, roots, follow_symlinks=follow_symlinks)
    if not sample.proposal.schema.fields:
        bound = "its footer" if fmt == "parquet" else f"its first {MAX_SAMPLE_BYTES // 1024} KB"
        raise InputError(f"{sample.file}: no field to propose in {bound}")
    return sample


def _sample(raw: str, fmt: str, roots: Sequence[Path], *, follow_symlinks: bool) -> Sample:
    if fmt not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}, not {str(fmt)[:20]!r}")
    # Never empty: a path or glob that names no file is an InputError.
    return read_sample(min(confined_files(raw, roots, follow_symlinks=follow_symlinks)), fmt)


def read_sample(path: str, fmt: str) -> Sample:
    """The first records of the file at ``path`` (resolved, inside an input root), read
    by a walk that follows no link."""
    check_suffix(path, fmt)
    try:
        descriptor = FROM_TOP.open_file(path)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        if fmt == "parquet":
            count, proposal, names = _parquet(path, handle)
            return Sample(path, count, 0, proposal, names)
        head = handle.read(MAX_SAMPLE_BYTES)
    # A line cut by the byte bound is not a record: drop what follows the last newline.
    lines = head.split(b"\n")
    if len(head) == MAX_SAMPLE_BYTES:
        lines = lines[:-1]
    text = [line.decode("utf-8", errors="replace") for line in lines]
    if fmt == "csv":
        try:
            rows = list(
                itertools.islice(csv.DictReader(io.StringIO("\n".join(text))), MAX_SAMPLE_RECORDS)
            )
        except csv.Error as exc:
            raise InputError(f"{path}: not readable as CSV ({exc})") from None
        records = [{k: v for k, v in row.items() if isinstance(k, str)} for row in rows]
        header = [] if not text else next(csv.reader([text[0]]), [])
        return Sample(path, len(records), 0, propose(records, text=True), _lowered(header))
    objects: list[dict[str, object]] = []
    malformed = 0
    for line in text:
        if not line.strip():
            continue
        if len(objects) >= MAX_SAMPLE_RECORDS:
            break
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if isinstance(value, dict):
            objects.append(value)
        else:
            malformed += 1
    names = _lowered(name for record in objects for name in record)
    return Sample(path, len(objects), malformed, propose(objects, text=False), names)


def _lowered(names: Iterable[str]) -> frozenset[str]:
    """Names in lower case, as written and without a byte-order mark or surrounding
    blanks: a check that refuses a run must not miss a field a reader would find."""
    found: set[str] = set()
    for name in names:
        found.update((name.lower(), name.strip().lstrip("\ufeff").strip().lower()))
    return frozenset(found)


def unread_fields(doc: PipelineDocument, sample: Sample) -> list[str]:
    """Why every record of a run over the sampled file would be quarantined: each field
    an aggregating node requires (its ``required``, the key form's key, value and
    distinct among them; the event time when windowed) that no sampled record has,
    whatever its case. Nothing for a sample without records, nor for a node after a
    project or a join, whose fields may be made on the way. (A field a node reads but
    does not require is null where missing, as in SQL: for the declared schema to
    catch.)"""
    if not sample.records:
        return []
    missing = []
    made = _after_field_makers(doc)
    for node in doc["nodes"]:
        if operator_name(node) not in ("aggregate", "running") or node["name"] in made:
            continue
        params = node.get("params") or {}
        grouping = Grouping.of(params)
        if grouping is None:  # refused by the node's own check
            continue
        # A field is named by the parameter that made it required: the key form's own.
        given: dict[str, str] = {}
        if key_form.is_key_form(params):
            for param, default in key_form.FIELDS.items():
                given.setdefault(str(params.get(param, default)), param)
        wanted = {field: given.get(field, "required") for field in grouping.required}
        if params.get("window_s") is not None:
            wanted[str(params.get("event_time", "event_time"))] = "event_time"
        for field, param in wanted.items():
            if field.lower() not in sample.names:
                missing.append(
                    f"{node['name']} reads {field!r} ({param}), which none of the first "
                    f"{sample.records} records of {sample.file} has"
                )
    return list(dict.fromkeys(missing))


def _after_field_makers(doc: PipelineDocument) -> set[str]:
    """The nodes downstream of a project or a join (operators that make fields)."""
    graph = RunGraph.of(doc)
    stack = [n["name"] for n in doc["nodes"] if operator_name(n) in ("project", "join")]
    seen: set[str] = set()
    while stack:
        for nxt in graph.downstreams_of(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _parquet(path: str, handle: io.BufferedReader) -> tuple[int, Proposal, frozenset[str]]:
    """The rows a Parquet file's footer counts and the fields it declares, mapped to
    the types a schema declares (nested ones left out), and their names."""
    import pyarrow.parquet as pq

    size = os.fstat(handle.fileno()).st_size
    if size < 12:
        raise InputError(f"{path}: not a Parquet file (too short)")
    handle.seek(size - 8)
    footer, magic = struct.unpack("<I4s", handle.read(8))
    if magic != b"PAR1":
        raise InputError(f"{path}: not a Parquet file")
    if footer > MAX_FOOTER_BYTES:
        raise InputError(f"{path}: its Parquet footer is over {MAX_FOOTER_BYTES // 1024} KB")
    handle.seek(0)
    try:
        parquet = pq.ParquetFile(handle)
        schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    proposal = declared_proposal((item.name, field_type_of(item.type)) for item in schema)
    return rows, proposal, _lowered(schema.names)


def field_type_of(kind: pa.DataType) -> FieldType | None:
    from pyarrow import types

    if types.is_boolean(kind):
        return "boolean"
    if types.is_integer(kind):
        return "long"
    if types.is_floating(kind) or types.is_decimal(kind):
        return "double"
    if types.is_string(kind) or types.is_large_string(kind):
        return "string"
    if types.is_date(kind):
        return "date"
    if types.is_timestamp(kind):
        return "timestamp"
    return None
