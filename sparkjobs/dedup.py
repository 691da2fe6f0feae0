"""The ``deduplicate`` operator's batch job (sparkjobs/catalog.py): of a batch's records
with one identity (sparkjobs/identity.py), one goes on.

The one kept is the least by the segment it came from, then by its whole JSON text, so
a retried batch keeps the same one. Each output line comes with its identity
(``PartialOutput.identities``): the worker records the batch's identities in the
transaction that completes it (orchestrator/ledger/seen.py) and drops the lines whose
identity the run kept first, in an earlier batch or in one committing meanwhile. So a
record is kept once whatever ran where (migration, rescale, a retry after a crash).

The plain job drops repeats over the whole input with Spark's own ``dropDuplicates``
(sparkjobs/identity.py, ``distinct``). Records equal in ``fields`` and different
elsewhere are one identity, and which of them a run keeps depends on which arrived
first: name in ``fields`` every field that makes two records different events.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.identity import digest_of
from sparkjobs.keygroups import KeyGroup
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import SEGMENT_COL, column
from sparkjobs.transform import IDENTITY_COL, LINE_COL, each_segment


def dedup_batch(
    spark: SparkSession,
    operator: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    *,
    key_group: KeyGroup | None = None,
    highs: Mapping[str, int | None] | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """Each input segment's records that are the first of their identity in the batch
    into its output (sparkjobs/transform.py, ``each_segment``), with their identities.
    Records are neither grouped by key nor windowed nor combined: ``key_group``,
    ``highs`` and ``together`` change nothing."""
    identity = [str(f) for f in params["fields"]]

    def lines(good: DataFrame, fields: list[str]) -> DataFrame:
        keyed = good.select(
            digest_of(good, identity, {SEGMENT_COL}).alias(IDENTITY_COL),
            F.struct(
                F.col(SEGMENT_COL).alias("s"),
                F.to_json(F.struct(*[column(c) for c in fields])).alias("j"),
            ).alias("r"),
        )
        firsts = keyed.groupBy(IDENTITY_COL).agg(F.min("r").alias("r"))
        return firsts.select(
            F.col("r.s").alias(SEGMENT_COL), F.col("r.j").alias(LINE_COL), IDENTITY_COL
        )

    return each_segment(spark, params, inputs, outputs, lines)
