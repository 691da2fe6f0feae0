"""Event time and windows as Spark columns: ``sparkjobs/event_time.py`` in Spark SQL.

The same rules on both sides, so the source's watermark and the operators' windows
agree on what a record's time is: a number of seconds (or its text) is floored to the
microsecond; any other text is read as a timestamp (ISO-8601, UTC when it has no
offset); anything else is no time, and the record malformed.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkjobs.event_time import MAX_US, MIN_US, US, WindowSpec
from sparkjobs.records import MALFORMED_COL, SEGMENT_COL, file_name

EVENT_COL = "_event_us"
WINDOW_COL = "_window"
LATE_COL = "_late"


def with_event_us(frame: DataFrame, field: str, name: str = EVENT_COL) -> DataFrame:
    """``frame`` with column ``name``: the event time in microseconds of text column
    ``field``, or null (``parse_us`` in Spark). The field is read as text: Spark's JSON
    reader gives a number its literal text.

    Each step is a column of its own, so the text is trimmed and parsed once per record
    whatever Spark's code generation does: built as one expression, the plan held the
    parse three times (the range check repeats the value). Spark keeps projections
    apart when merging them would repeat an expensive expression."""
    text, parsed = f"{name}_text", f"{name}_parsed"
    trimmed = F.col(text)
    # try_ all the way: a hostile number must be no time, not a failed job (ANSI mode).
    number = F.floor(F.try_multiply(trimmed.try_cast("DECIMAL(38,12)"), F.lit(US)))
    number = number.try_cast("BIGINT")
    stamp = F.unix_micros(F.try_to_timestamp(trimmed))
    # "1_000" is no number to Spark's cast either; refused on both sides.
    t = F.when(trimmed.contains("_"), F.lit(None)).otherwise(F.coalesce(number, stamp))
    return (
        frame.withColumn(text, F.trim(F.col(f"`{field}`")))
        .withColumn(parsed, t)
        .withColumn(name, F.when(F.col(parsed).between(MIN_US, MAX_US), F.col(parsed)))
        .drop(text, parsed)
    )


def window_starts(t: Column, spec: WindowSpec) -> Column:
    """The starts of the windows holding time ``t`` (an array: hopping windows overlap)."""
    last = t - F.pmod(t, F.lit(spec.slide_us))
    candidates = F.transform(
        F.sequence(F.lit(0), F.lit(spec.fan_out - 1)),
        lambda k: last - k.cast("BIGINT") * F.lit(spec.slide_us),
    )
    return F.filter(candidates, lambda start: start + F.lit(spec.size_us) > t)


def late(
    start: Column, segment: Column, spec: WindowSpec, highs: Mapping[str, int | None]
) -> Column:
    """Is the window at ``start`` closed for its record's segment (file name) by the
    watermark that segment's chunk was read under (``highs``: the largest event time of
    the chunks before it, per file name; absent or None: no earlier event)?"""
    known = {name: high for name, high in highs.items() if high is not None}
    if not known:
        return F.lit(False)  # noqa: FBT003 - a Spark literal
    pairs = [item for name, high in sorted(known.items()) for item in (F.lit(name), F.lit(high))]
    high = F.create_map(*pairs)[segment]
    end = start + F.lit(spec.size_us)
    never = F.lit(False)  # noqa: FBT003 - a Spark literal
    # Nearly every record is on time: one comparison with the batch's highest watermark
    # rules it out before the look-up of its own segment's.
    highest = max(known.values()) - spec.lateness_us
    own = F.coalesce(end <= high - F.lit(spec.lateness_us), never)
    return F.when(end <= F.lit(highest), own).otherwise(never)


def in_windows(
    parsed: DataFrame,
    spec: WindowSpec,
    highs: Mapping[str, int | None],
    *,
    timed: Column | None = None,
) -> DataFrame:
    """``parsed`` with each record's window (``WINDOW_COL``: a row per window holding it,
    null for a malformed record) and whether it is late (``LATE_COL``: its window closed
    by the watermark its segment was read under; ``highs`` per file name, see
    :func:`late`). A record ``timed`` says needs an event time (None: every record) and
    has none is malformed; one it does not is in no window (a row of its own)."""
    needs = F.col(EVENT_COL).isNull() if timed is None else timed & F.col(EVENT_COL).isNull()
    parsed = with_event_us(parsed, spec.field).withColumn(
        MALFORMED_COL, F.col(MALFORMED_COL) | needs
    )
    no_window = F.lit(None).cast("BIGINT")
    malformed = F.col(MALFORMED_COL) | F.col(EVENT_COL).isNull()
    if timed is not None:
        malformed = malformed | ~timed
    if spec.fan_out == 1:
        # Tumbling: one window, computed without an array.
        start = F.col(EVENT_COL) - F.pmod(F.col(EVENT_COL), F.lit(spec.slide_us))
        window = F.when(malformed, no_window).otherwise(start)
    else:
        starts = window_starts(F.col(EVENT_COL), spec)
        window = F.explode(F.when(malformed, F.array(no_window)).otherwise(starts))
    parsed = parsed.withColumn(WINDOW_COL, window)
    return parsed.withColumn(
        LATE_COL,
        F.col(WINDOW_COL).isNotNull()
        & late(F.col(WINDOW_COL), file_name(F.col(SEGMENT_COL)), spec, highs),
    )
