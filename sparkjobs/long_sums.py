"""Sum, min and max of a DECIMAL(38,10) value in 64-bit integers, exactly.

Values are read as DECIMAL(38,10) (sparkjobs/records.py), which Spark keeps as a
BigInteger's bytes in a row: a sum or min of them in a hash aggregate's buffer is read
into a BigDecimal and written back as bytes for every record, and a buffer of such
decimals keeps Spark from its generated fast hash map. Exact decimal arithmetic was 25
to 35% of the idiomatic job's CPU (docs/benchmarks.md, "the decimals' share").

A value of magnitude at most ``SMALL`` has an unscaled value (the value times 10^10)
that fits a long, and Spark's own ``UnscaledValue`` (what its optimizer sums for narrow
decimals) reads it without arithmetic. Each record's unscaled value ``u`` is summed in
two longs, ``u div 10^9`` and ``u % 10^9``, so that no sum of fewer than
``MAX_RECORDS`` records can overflow; min and max are those of ``u``. A group's
decimals are rebuilt at the end, once per group, in decimal types wide enough that
Spark's arithmetic loses nothing. A group that held a larger value, or more records,
says so (``EXACT``): its batch is aggregated again in decimals.
"""

from __future__ import annotations

from pyspark import SparkContext
from pyspark.sql import Column
from pyspark.sql import functions as F

from sparkjobs.records import VALUE_TYPE

# |value| <= SMALL: |unscaled| <= 9 * 10^18 < 2^63.
SMALL = 900_000_000
# |u div 10^9| < 9.3 * 10^9: a sum of fewer than 9.9 * 10^8 of them fits a long.
MAX_RECORDS = 900_000_000
BASE = 1_000_000_000

EXACT = "_exact"  # a group's sum, min and max hold: every value was in longs


def unscaled(value: Column) -> Column:
    """The unscaled value of a decimal as a long (Catalyst's ``UnscaledValue``, which
    no SQL function names). Only for a value whose unscaled value fits a long."""
    # The process's context, whichever thread made its session active (a session is
    # active per thread; a batch's columns may be built on another).
    context = SparkContext._active_spark_context
    jvm = None if context is None else context._jvm
    if jvm is None:
        raise RuntimeError("no Spark context with a JVM to build a column in")
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    expression = jvm.org.apache.spark.sql.catalyst.expressions.UnscaledValue(
        utils.expression(value._jc)
    )
    return Column(utils.column(expression))


def small_unscaled(column: Column) -> Column:
    """``column``'s unscaled value, or null when it is null or larger than longs take."""
    small = column.between(F.lit(-SMALL).cast(VALUE_TYPE), F.lit(SMALL).cast(VALUE_TYPE))
    return F.when(small, unscaled(column))


_TENTH = "0.1"
_ULP = "0.0000000001"


def total_of(high: Column, low: Column) -> Column:
    """The DECIMAL(38,10) sum of the unscaled values whose ``u div 10^9`` sum to ``high``
    and ``u % 10^9`` to ``low``: ``high / 10 + low / 10^10``. DECIMAL(26,0) times
    DECIMAL(1,1) is DECIMAL(28,1), DECIMAL(19,0) times DECIMAL(11,10) is DECIMAL(31,10),
    and their sum DECIMAL(38,10), none past 38 digits, where Spark would round the scale
    away."""
    tenth = F.lit(_TENTH).cast("DECIMAL(1,1)")
    ulp = F.lit(_ULP).cast("DECIMAL(11,10)")
    total = high.cast("DECIMAL(26,0)") * tenth + low.cast("DECIMAL(19,0)") * ulp
    return total.cast(VALUE_TYPE)


def value_of(unscaled_value: Column) -> Column:
    """The DECIMAL(38,10) value of an unscaled value."""
    ulp = F.lit(_ULP).cast("DECIMAL(11,10)")
    return (unscaled_value.cast("DECIMAL(19,0)") * ulp).cast(VALUE_TYPE)
