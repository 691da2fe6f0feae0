"""Reading input records the same way everywhere: operators and the batch reference job.

Segments are JSON lines, read by Spark's own JSON reader with a schema of the fields an
operator needs, as a Spark engineer reads them (``spark.read.schema(...).json(...)``), so
a record means what it means to plain Spark: a line holding an array of objects holds
those records, a blank line or an empty array none, and of a field given twice the last
counts. A record is *malformed* when its line is not valid JSON or not an object (the
reader's corrupt record), a field does not convert to its type (a value that is not a
number), or a field the operator needs is missing or null. Malformed records are counted
and quarantined with their raw line, never fatal. Numbers are read as DECIMAL(38,10):
sums of decimals are exact whatever the order of addition, which is what lets data be
regrouped across branches and still match the batch job to the last digit.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

VALUE_TYPE = "DECIMAL(38,10)"
SEGMENT_COL = "_segment"
RAW_COL = "_raw"
MALFORMED_COL = "_malformed"


def segment_of(file_name: str) -> str:
    """A segment's id is its file name without the extension. Mapped in Python after
    the job: a per-record regular expression in Spark would cost more than the parse."""
    return file_name.removesuffix(".jsonl")


def read_records(
    spark: SparkSession,
    paths: Sequence[str],
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    segments: bool = True,
) -> DataFrame:
    """Typed columns for ``strings`` and ``numbers``, a ``_malformed`` flag and ``_raw``:
    the raw line of a record the reader could not read (null for a readable record,
    also one that is malformed for a missing field: see ``lines_missing_fields``). With
    ``segments``, the file each record came from."""
    schema = _ddl([*_fields(strings, numbers), (RAW_COL, "STRING")])
    frame = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", RAW_COL)
        .json(list(paths))
    )
    wanted = [*strings, *numbers]
    bad = F.col(RAW_COL).isNotNull()
    for name in wanted:
        bad = bad | F.col(f"`{name}`").isNull()
    kept = [F.col(f"`{name}`") for name in wanted]
    if segments:
        kept.insert(0, F.col("_metadata.file_name").alias(SEGMENT_COL))
    return frame.select(*kept, F.col(RAW_COL), bad.alias(MALFORMED_COL))


def lines_missing_fields(
    spark: SparkSession, paths: Sequence[str], strings: Sequence[str], numbers: Sequence[str]
) -> DataFrame:
    """The raw lines of the records ``read_records`` found malformed for a missing or
    null field (the reader keeps no line of a record it could read), with their file:
    a line once per such record in it (an array line may hold several).

    A second read, only of the files that had such records. It repeats the reader's
    rules on each line: an object, or an array of objects, whose every present field
    converts (else the reader had kept the whole line as corrupt), and a needed field
    missing or null.
    """
    numeric = list(numbers)
    as_text = f"struct<{_ddl([(n, 'STRING') for n in [*strings, *numeric]], ':')}>"
    typed = f"struct<{_ddl(_fields(strings, numbers), ':')}>"
    raw = F.col("value")

    def missing(text: Column) -> Column:
        out = F.lit(False)  # noqa: FBT003 - a Spark literal, not a flag
        for name in [*strings, *numeric]:
            out = out | text[name].isNull()
        return out

    def converts(text: Column, value: Column) -> Column:
        out = F.lit(True)  # noqa: FBT003 - a Spark literal, not a flag
        for name in numeric:
            out = out & (text[name].isNull() | value[name].isNotNull())
        return out

    one_text, one_typed = F.from_json(raw, as_text), F.from_json(raw, typed)
    many_text = F.from_json(raw, f"array<{as_text}>")
    many_typed = F.from_json(raw, f"array<{typed}>")
    pairs = F.arrays_zip(many_text.alias("t"), many_typed.alias("v"))
    in_array = F.when(
        F.forall(pairs, lambda e: e["t"].isNotNull() & converts(e["t"], e["v"])),
        F.size(F.filter(pairs, lambda e: missing(e["t"]))),
    ).otherwise(0)
    in_object = F.when(
        F.json_object_keys(raw).isNotNull() & missing(one_text) & converts(one_text, one_typed),
        1,
    ).otherwise(0)
    records = F.when(F.ltrim(raw).startswith("["), F.coalesce(in_array, F.lit(0))).otherwise(
        in_object
    )
    lines = spark.read.text(list(paths)).select(
        F.col("_metadata.file_name").alias(SEGMENT_COL), raw.alias(RAW_COL), records.alias("n")
    )
    return lines.where(F.col("n") > 0)


def parse_fields(lines: DataFrame, strings: Sequence[str], numbers: Sequence[str]) -> DataFrame:
    """Typed columns for ``strings`` and ``numbers`` plus a ``_malformed`` flag, of JSON
    objects in the ``_raw`` column (records a record operator wrote, in the batch job)."""
    parsed = lines.withColumn("_r", F.from_json(F.col(RAW_COL), _ddl(_fields(strings, numbers))))
    wanted = [*strings, *numbers]
    bad = F.col("_r").isNull()
    for name in wanted:
        bad = bad | F.col(f"_r.`{name}`").isNull()
    return parsed.select(
        *[c for c in lines.columns],
        *[F.col(f"_r.`{name}`").alias(name) for name in wanted],
        bad.alias(MALFORMED_COL),
    )


def _fields(strings: Sequence[str], numbers: Sequence[str]) -> list[tuple[str, str]]:
    """(name, Spark type) of each field an operator reads."""
    return [(name, "STRING") for name in strings] + [(name, VALUE_TYPE) for name in numbers]


def _ddl(fields: Sequence[tuple[str, str]], sep: str = "") -> str:
    """Fields as Spark DDL: ``a STRING, b DECIMAL(38,10)`` (``sep`` ":" inside struct<>)."""
    return ", ".join(f"`{name}`{sep} {kind}" for name, kind in fields)
