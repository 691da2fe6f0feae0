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

# The functions kept in longs where the values allow: those of an exact decimal.
IN_LONGS = DECIMAL_VALUED


@dataclass(frozen=True)
class Parts:
    first: list[Column]  # aggregates over records, each named
    second: list[Column]  # the same over rows of ``first``, under the same names
    state: Column  # the measure's state, from either's columns
    exact: Column | None  # whether the longs held every value (None: not in longs)


def with_unscaled(parsed: DataFrame, grouping: Grouping) -> DataFrame:
    """``parsed`` with the unscaled value of each number a sum, min, max or average
    reads (``_u0``, ``_u1``...: null when it is null or too large for a long)."""
    for index, field in enumerate(grouping.numbers):
        if any(m.field == field and m.fn in IN_LONGS for m in grouping.measures):
            parsed = parsed.withColumn(f"_u{index}", long_sums.small_unscaled(column(field)))
    return parsed


def parts_of(index: int, measure: Measure, grouping: Grouping, *, in_longs: bool) -> Parts | None:
    """Measure ``index``'s parts (its columns named ``_m{index}_...``), or None for a
    measure that has none; ``in_longs``, its numbers in longs (``with_unscaled``'s
    columns on the records)."""
    name = f"_m{index}"

    def part(suffix: str, first: Column, again: str) -> tuple[Column, Column]:
        named = f"{name}_{suffix}"
        return first.alias(named), getattr(F, again)(named).alias(named)

    if measure.field is None or measure.fn == "count":
        counted = F.lit(1) if measure.field is None else column(measure.field)
        first, second = part("c", F.count(counted), "sum")
        return Parts([first], [second], F.col(f"{name}_c"), None)
    if measure.fn not in IN_LONGS:
        return None
    value = column(measure.field)
    pairs = [part("n", F.count(value), "sum")]  # the values: an average's count
    if not in_longs:
        if measure.fn in ("sum", "avg"):
            pairs.append(part("s", F.sum(value), "sum"))
            kept = F.col(f"{name}_s")
        else:
            fold = "min" if measure.fn == "min" else "max"
            pairs.append(part("x", getattr(F, fold)(value), fold))
            kept = F.col(f"{name}_x")
        exact = None
    else:
        u = F.col(f"_u{grouping.numbers.index(measure.field)}")
        pairs.append(part("l", F.count(u), "sum"))  # the values in longs
        if measure.fn in ("sum", "avg"):
            pairs.append(part("h", F.sum(F.call_function("div", u, F.lit(long_sums.BASE))), "sum"))
            pairs.append(part("o", F.sum(u % F.lit(long_sums.BASE)), "sum"))
            kept = long_sums.total_of(F.col(f"{name}_h"), F.col(f"{name}_o"))
        else:
            fold = "min" if measure.fn == "min" else "max"
            pairs.append(part("x", getattr(F, fold)(u), fold))
            kept = long_sums.value_of(F.col(f"{name}_x"))
        in_long = F.col(f"{name}_l")
        exact = (in_long == F.col(f"{name}_n")) & (in_long < F.lit(long_sums.MAX_RECORDS))
    state = (
        F.struct(kept.cast("STRING").alias("sum"), F.col(f"{name}_n").alias("count"))
        if measure.fn == "avg"
        else kept.cast("STRING")
    )
    return Parts([p[0] for p in pairs], [p[1] for p in pairs], state, exact)
