"""A grouped measure's aggregates on Spark in parts that aggregate again: over a
group's records, then over those parts, and its state (sparkjobs/measures.py) from
either.

A count is a count, then a sum of counts; a sum, minimum or maximum of a number is
kept in 64-bit integers where its values allow (sparkjobs/long_sums.py: its unscaled
values, summed in two longs), with the count of its values, and a group whose values
did not all fit says so (``exact``); otherwise in DECIMAL(38,10), as the idiomatic job
keeps it. An average is its sum and count. Other measures (a distinct count, a sketch,
a first or last value) have no parts: sparkjobs/grouped.py aggregates them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkjobs import long_sums
from sparkjobs.measures import DECIMAL_VALUED, Grouping, Measure
from sparkjobs.records import column

RECORDS_COL = "_records"  # a group's records, counted by every grouped stage
# The functions kept in longs where the values allow: those of an exact decimal.
IN_LONGS = DECIMAL_VALUED


@dataclass(frozen=True)
class Parts:
    """A measure's parts, each named for what it computes (its function and field), not
    for the measure: measures over one field share them (a sum, a minimum and an average
    of one value count its values once), and a stage aggregates each part once."""

    first: dict[str, Column]  # aggregates over records, by name
    second: dict[str, Column]  # the same over rows of ``first``, under the same names
    state: Column  # the measure's state, from either's columns
    exact: Column | None  # whether the longs held every value (None: not in longs)


def with_unscaled(parsed: DataFrame, grouping: Grouping) -> DataFrame:
    """``parsed`` with the unscaled value of each number a sum, min, max or average
    reads (``_u0``, ``_u1``...: null when it is null or too large for a long)."""
    for index, field in enumerate(grouping.numbers):
        if any(m.field == field and m.fn in IN_LONGS for m in grouping.measures):
            parsed = parsed.withColumn(f"_u{index}", long_sums.small_unscaled(column(field)))
    return parsed


def parts_of(measure: Measure, grouping: Grouping, *, in_longs: bool) -> Parts | None:
    """The measure's parts, or None for a measure that has none; ``in_longs``, its
    numbers in longs (``with_unscaled``'s columns on the records)."""
    first: dict[str, Column] = {}
    second: dict[str, Column] = {}

    def part(named: str, over_records: Column, again: str) -> Column:
        first[named] = over_records.alias(named)
        second[named] = getattr(F, again)(named).alias(named)
        return F.col(named)

    if measure.field is None:  # a group's records, which the stage counts anyway
        return Parts(first, second, F.col(RECORDS_COL), None)
    prefix = f"_p{grouping.fields.index(measure.field)}"
    value = column(measure.field)
    counted = part(f"{prefix}_n", F.count(value), "sum")  # its values: an average's count
    if measure.fn == "count":
        return Parts(first, second, counted, None)
    if measure.fn not in IN_LONGS:
        return None
    if not in_longs:
        if measure.fn in ("sum", "avg"):
            kept = part(f"{prefix}_s", F.sum(value), "sum")
        else:
            kept = part(f"{prefix}_{measure.fn}", getattr(F, measure.fn)(value), measure.fn)
        exact = None
    else:
        u = F.col(f"_u{grouping.numbers.index(measure.field)}")
        in_long = part(f"{prefix}_l", F.count(u), "sum")  # its values in longs
        if measure.fn in ("sum", "avg"):
            high = part(
                f"{prefix}_h", F.sum(F.call_function("div", u, F.lit(long_sums.BASE))), "sum"
            )
            low = part(f"{prefix}_o", F.sum(u % F.lit(long_sums.BASE)), "sum")
            kept = long_sums.total_of(high, low)
        else:
            fold = measure.fn
            kept = long_sums.value_of(part(f"{prefix}_{fold}", getattr(F, fold)(u), fold))
        exact = (in_long == counted) & (in_long < F.lit(long_sums.MAX_RECORDS))
    state = (
        F.struct(kept.cast("STRING").alias("sum"), counted.alias("count"))
        if measure.fn == "avg"
        else kept.cast("STRING")
    )
    return Parts(first, second, state, exact)
