"""A record's identity for the ``deduplicate`` operator (sparkjobs/dedup.py): its
fields' values as JSON (``to_json`` of their struct, a null left out as Spark leaves it
out), hashed: the first 32 hexadecimal digits of its SHA-256, its *digest*; and the drop
of repeats over a whole input, as the plain job makes it (Spark's ``dropDuplicates``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkjobs.records import column

# Hexadecimal digits of a record's SHA-256 kept as its digest: 128 bits.
DIGEST_CHARS = 32


def digest_of(frame: DataFrame, fields: Sequence[str], keep: Collection[str] = ()) -> Column:
    """The digest of each record's ``fields`` (a field the records do not have is
    null in every one of them)."""
    have = {c for c in frame.columns if c not in keep}
    values = [column(f) if f in have else F.lit(None).cast("string").alias(f) for f in fields]
    return F.substring(F.sha2(F.to_json(F.struct(*values)), 256), 1, DIGEST_CHARS)


def distinct(frame: DataFrame, fields: Sequence[str], keep: Collection[str] = ()) -> DataFrame:
    """``frame`` with one record per identity of ``fields``, as Spark's own
    ``dropDuplicates`` keeps one (a field the records do not have is null in every one
    of them; ``keep``: columns that are not fields, carried along). Of records equal in
    ``fields`` and different elsewhere, which one is kept is Spark's choice, as a run's
    is its arrival order's (sparkjobs/dedup.py)."""
    have = {c for c in frame.columns if c not in keep}
    absent = [f for f in fields if f not in have]
    padded = frame
    for name in absent:
        padded = padded.withColumn(name, F.lit(None).cast("string"))
    return padded.dropDuplicates(list(fields)).drop(*absent)
