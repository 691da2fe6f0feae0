"""The ``join`` operator (sparkjobs/catalog.py): each record matched with the rows of a
reference table whose ``on`` fields equal its own, the table's ``columns`` added.

The table is the file a run snapshotted when it started (orchestrator/pipeline/
reference.py), passed in as ``params["reference_path"]``: every batch of the run, its
retries and the plain job read the same bytes, so a join is as exact as any record
operator. A join refreshed on a period (``refresh_s``) may have later copies, each bound
to the input files that arrived after it was taken: ``params["reference_by_file"]`` maps
the name of a file a record was read from to the copy its records join, every other
file joining ``reference_path``. The table is small (its file is bounded when it is
snapshotted) and broadcast to every task.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.catalog import REFERENCE_FORMATS
from sparkjobs.records import column

# The key under which the orchestrator passes a join's snapshotted table to its job.
REFERENCE_PATH = "reference_path"
# ...and the later copies of a refreshed table: {name of an input file: its copy}.
REFERENCE_BY_FILE = "reference_by_file"
# The column naming, in a job joining several copies, the copy each row belongs to.
_VERSION = "_reference_version"


class ReferenceError(ValueError):
    """The reference table cannot be joined as the node asks."""


def read_reference(spark: SparkSession, path: str) -> DataFrame:
    """The table in ``path``, read by its suffix: CSV with a header (every column text),
    JSON lines (types inferred) or Parquet (its own types)."""
    fmt = REFERENCE_FORMATS[Path(path).suffix.lower()]
    if fmt == "csv":
        return spark.read.csv(path, header=True, inferSchema=False)
    if fmt == "jsonl":
        return spark.read.json(path)
    return spark.read.parquet(path)


def join_reference(
    frame: DataFrame,
    params: Mapping[str, Any],
    *,
    keep: Collection[str],
    origin: str | None = None,
) -> DataFrame:
    """``frame``'s records joined with the node's reference table: each record's fields
    (and the ``keep`` columns), then the added ``columns``, one row per matching table
    row; with ``how = left`` a record without one is kept, its added columns null.
    ``origin``: the column holding the URL of the file each record was read from, which
    picks its copy where the table was refreshed (``REFERENCE_BY_FILE``)."""
    on = [str(f) for f in params["on"]]
    added = [str(c) for c in params["columns"]]
    default = str(params[REFERENCE_PATH])
    by_file = {str(k): str(v) for k, v in (params.get(REFERENCE_BY_FILE) or {}).items()}
    copies = sorted({default, *by_file.values()})
    if len(copies) == 1:
        rows = _table_rows(frame, params, copies[0], keep=keep)
        joined = frame.join(F.broadcast(rows), on=on, how=str(params.get("how", "inner")))
        return joined.select(*[column(c) for c in frame.columns], *[column(c) for c in added])
    if origin is None:
        raise ValueError("a join over several copies of its table needs the records' files")
    first = _table_rows(frame, params, copies[0], keep=keep)
    tables = first.withColumn(_VERSION, F.lit(0))
    for number, path in enumerate(copies[1:], start=1):
        rows = _table_rows(frame, params, path, keep=keep)
        typed = rows.select(*[column(c).cast(t).alias(c) for c, t in first.dtypes])
        tables = tables.unionByName(typed.withColumn(_VERSION, F.lit(number)))
    numbers = {path: number for number, path in enumerate(copies)}
    pairs = [
        x for name, path in sorted(by_file.items()) for x in (F.lit(name), F.lit(numbers[path]))
    ]
    version = F.coalesce(
        F.element_at(F.create_map(*pairs), F.substring_index(F.col(origin), "/", -1)),
        F.lit(numbers[default]),
    )
    joined = frame.withColumn(_VERSION, version).join(
        F.broadcast(tables), on=[*on, _VERSION], how=str(params.get("how", "inner"))
    )
    return joined.select(*[column(c) for c in frame.columns], *[column(c) for c in added])


def _table_rows(
    frame: DataFrame, params: Mapping[str, Any], path: str, *, keep: Collection[str]
) -> DataFrame:
    """The ``on`` and added columns of the copy in ``path``, checked against ``frame``."""
    on = [str(f) for f in params["on"]]
    added = [str(c) for c in params["columns"]]
    table = read_reference(frame.sparkSession, path)
    have = {c.lower(): c for c in table.columns}
    missing = [c for c in (*on, *added) if c.lower() not in have]
    if missing:
        raise ReferenceError(
            f"the reference table {params.get('table') or Path(str(params['reference'])).name}"
            f" has no column "
            f"{', '.join(repr(c) for c in missing)} (it has {', '.join(table.columns)})"
        )
    fields = {c.lower() for c in frame.columns if c not in keep}
    absent = [f for f in on if f.lower() not in fields]
    if absent:
        raise ReferenceError(f"the records have no field {', '.join(repr(f) for f in absent)}")
    clash = [c for c in added if c.lower() in fields]
    if clash:
        raise ReferenceError(
            f"the records already have a field {', '.join(repr(c) for c in clash)}; "
            "the table's column would hide it"
        )
    return table.select(
        *[column(have[f.lower()]).alias(f) for f in on],
        *[column(have[c.lower()]).alias(c) for c in added],
    )
