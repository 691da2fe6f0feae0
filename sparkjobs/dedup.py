"""The ``deduplicate`` operator's batch job (sparkjobs/catalog.py): a record whose
``fields`` equal a record the run already kept is dropped; the others go on as they are.

A record's identity is its digest (sparkjobs/identity.py). Of the records of one batch
with one digest, the least by the segment it came from, then by its whole JSON text, is
kept, so a retried batch keeps the same one; a digest the run kept in an earlier batch
(``seen``, the ledger's answer: orchestrator/ledger/seen.py) keeps none. The job returns,
with each segment's output, the digests it kept, which the ledger records in the
batch's own transaction: a batch that finds one of them recorded meanwhile (another
instance kept it first) is refused and runs again, so a record is kept once whatever ran
where (migration, rescale, a retry after a crash).

The plain job drops repeats over the whole input the same way (sparkjobs/identity.py,
``distinct``). Records equal in ``fields`` and different elsewhere are one identity,
and which of them a run keeps depends on which arrived first: name in ``fields`` every
field that makes two records different events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.identity import DIGEST, digest_of
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import SEGMENT_COL, column
from sparkjobs.session import collect_all
from sparkjobs.transform import each_segment

# The ledger's answer to "which of these digests did the run keep already?"
Seen = Callable[[Sequence[str]], Collection[str]]


def dedup_batch(
    spark: SparkSession,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    *,
    seen: Seen,
) -> tuple[dict[str, PartialOutput], list[str]]:
    """Each input segment's records that are the first of their digest into its
    output (sparkjobs/transform.py, ``each_segment``), and the digests kept."""
    identity = [str(f) for f in params["fields"]]
    kept: list[str] = []

    def lines(good: DataFrame, fields: list[str]) -> list[tuple[str, str]]:
        keyed = good.select(
            digest_of(good, identity, {SEGMENT_COL}).alias(DIGEST),
            F.struct(
                F.col(SEGMENT_COL).alias("s"),
                F.to_json(F.struct(*[column(c) for c in fields])).alias("j"),
            ).alias("r"),
        )
        firsts = collect_all(keyed.groupBy(DIGEST).agg(F.min("r").alias("r")))
        already = set(seen([row[DIGEST] for row in firsts]))
        new = [row for row in firsts if row[DIGEST] not in already]
        kept.extend(row[DIGEST] for row in new)
        return [(row["r"]["s"], row["r"]["j"]) for row in new]

    return each_segment(spark, params, inputs, outputs, lines), kept
