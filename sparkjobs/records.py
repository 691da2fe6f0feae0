"""Parsing input records the same way everywhere: operators and the batch reference job.

Segments are JSON lines. A record is *malformed* when its line is not a JSON object or a
field the operator needs is missing, null or of the wrong type (a value that is not a
number). Malformed records are counted and quarantined, never fatal. Numbers are read as
DECIMAL(38,10): sums of decimals are exact whatever the order of addition, which is what
lets data be regrouped across branches and still match the batch job to the last digit.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

VALUE_TYPE = "DECIMAL(38,10)"
SEGMENT_COL = "_segment"
RAW_COL = "_raw"
MALFORMED_COL = "_malformed"


def segment_of(file_name: str) -> str:
    """A segment's id is its file name without the extension. Mapped in Python after
    the job: a per-record regular expression in Spark would cost more than the parse."""
    return file_name.removesuffix(".jsonl")


def read_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Every line of the given JSON-lines files, with the segment it came from."""
    return (
        spark.read.text(list(paths))
        .withColumn(SEGMENT_COL, F.col("_metadata.file_name"))
        .withColumnRenamed("value", RAW_COL)
        .where(F.length(F.trim(F.col(RAW_COL))) > 0)
    )


def parse_fields(lines: DataFrame, strings: Sequence[str], numbers: Sequence[str]) -> DataFrame:
    """Typed columns for ``strings`` and ``numbers`` plus a ``_malformed`` flag."""
    fields = [f"`{name}` STRING" for name in strings] + [
        f"`{name}` {VALUE_TYPE}" for name in numbers
    ]
    parsed = lines.withColumn("_r", F.from_json(F.col(RAW_COL), ", ".join(fields)))
    wanted = [*strings, *numbers]
    bad = F.col("_r").isNull()
    for name in wanted:
        bad = bad | F.col(f"_r.`{name}`").isNull()
    return parsed.select(
        *[c for c in lines.columns],
        *[F.col(f"_r.`{name}`").alias(name) for name in wanted],
        bad.alias(MALFORMED_COL),
    )
