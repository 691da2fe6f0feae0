"""A record's identity for the ``deduplicate`` operator (sparkjobs/dedup.py): its
fields' values as JSON (``to_json`` of their struct, a null left out as Spark leaves it
out), hashed: the first 32 hexadecimal digits of its SHA-256, its *digest*; and the drop
of repeats over a whole input, as the plain job makes it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sparkjobs.records import column

# Hexadecimal digits of a record's SHA-256 kept as its digest: 128 bits.
DIGEST_CHARS = 32
DIGEST = "_digest"
_TEXT, _RANK = "_text", "_rank"


def digest_of(frame: DataFrame, fields: Sequence[str], keep: Collection[str] = ()) -> Column:
    """The digest of each record's ``fields`` (a field the records do not have is
    null in every one of them)."""
    have = {c for c in frame.columns if c not in keep}
    values = [column(f) if f in have else F.lit(None).cast("string").alias(f) for f in fields]
    return F.substring(F.sha2(F.to_json(F.struct(*values)), 256), 1, DIGEST_CHARS)


def distinct(frame: DataFrame, fields: Sequence[str], keep: Collection[str] = ()) -> DataFrame:
    """``frame`` with one record per digest of ``fields``: the least by its JSON text
    (``keep``: columns that are not fields, carried along)."""
    data = [c for c in frame.columns if c not in keep]
    ranked = frame.withColumn(DIGEST, digest_of(frame, fields, keep)).withColumn(
        _TEXT, F.to_json(F.struct(*[column(c) for c in data]))
    )
    first = F.row_number().over(Window.partitionBy(DIGEST).orderBy(_TEXT))
    return ranked.withColumn(_RANK, first).where(F.col(_RANK) == 1).drop(DIGEST, _TEXT, _RANK)
