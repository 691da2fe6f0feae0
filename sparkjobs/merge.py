"""The sink's pre-merge: partial aggregates of a batch combined per key in one Spark job.

The result is folded into the run's result table by the orchestrator, in the same
transaction that records which input ranges were merged (so nothing is merged twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkjobs.records import VALUE_TYPE

PARTIAL_SCHEMA = (
    f"key STRING, count BIGINT, sum {VALUE_TYPE}, min {VALUE_TYPE}, max {VALUE_TYPE}, "
    "distinct ARRAY<STRING>"
)


@dataclass(frozen=True)
class MergedKey:
    key: str
    count: int
    sum: Decimal
    min: Decimal
    max: Decimal
    distinct: tuple[str, ...]


def combine_partials(spark: SparkSession, paths: Sequence[Path]) -> list[MergedKey]:
    """Partials of several segments combined per key (count and sum add, sets unite)."""
    frame = spark.read.schema(PARTIAL_SCHEMA).json([str(p) for p in paths])
    rows = (
        frame.groupBy("key")
        .agg(
            F.sum("count").alias("count"),
            F.sum("sum").alias("sum"),
            F.min("min").alias("min"),
            F.max("max").alias("max"),
            F.sort_array(F.array_distinct(F.flatten(F.collect_list("distinct")))).alias("distinct"),
        )
        .collect()
    )
    return [
        MergedKey(
            key=row["key"],
            count=int(row["count"]),
            sum=row["sum"],
            min=row["min"],
            max=row["max"],
            distinct=tuple(row["distinct"]),
        )
        for row in rows
    ]
