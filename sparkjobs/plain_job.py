"""The plain Spark batch job: the whole input, one job, the reference for exactness.

It reads the original input files (not segments) as a Spark engineer would, with a
schema and Spark's own JSON reader, and applies the same rules as the operators
(sparkjobs/records.py), so malformed records are excluded on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sparkjobs.event_time import WindowSpec
from sparkjobs.expression_guard import apply_record_step, with_computed
from sparkjobs.grouped import at_time, with_times
from sparkjobs.measures import BY_TIME, HLL_LG_K, KLL_K, Grouping, Measure, Value, average
from sparkjobs.records import (
    CORRUPT,
    MALFORMED_COL,
    RAW_COL,
    SEGMENT_COL,
    column,
    parse_fields,
    read_records,
    read_rows,
)
from sparkjobs.reference import REFERENCE_BY_FILE
from sparkjobs.session import collect_all
from sparkjobs.windows import EVENT_COL, with_event_us


def _after_record_steps(
    spark: SparkSession,
    paths: Sequence[str],
    fmt: str,
    steps: Sequence[tuple[str, Any]],
    computed: Sequence[str] = (),
    *,
    schema: str | None = None,
) -> DataFrame:
    """The input after filter/project steps (and with a stage's ``computed`` group
    fields), as JSON lines again (as segments would be). A line the reader could not
    read stays as it is, past the steps, to be counted malformed by the aggregation, as
    the live run's first stage counts it. (Spark refuses a query of a file's corrupt
    lines alone: the unread ones are selected beside the record they would be, which
    makes them a second scan of the input.)"""
    frame = read_rows(spark, paths, fmt, schema=schema)
    # A join over a refreshed table picks each record's copy by the file it came from.
    keep = [SEGMENT_COL] if any(REFERENCE_BY_FILE in params for _, params in steps) else []
    if not keep:
        frame = frame.drop(SEGMENT_COL)
    unread = None
    if CORRUPT in frame.columns:
        fields = [c for c in frame.columns if c not in (CORRUPT, *keep)]
        whole = F.to_json(F.struct(*[column(c) for c in fields]))
        line = F.coalesce(F.col(CORRUPT), whole).alias(RAW_COL)
        unread = frame.where(F.col(CORRUPT).isNotNull()).select(line)
        frame = frame.where(F.col(CORRUPT).isNull()).drop(CORRUPT)
    origin = SEGMENT_COL if keep else None
    for operator, params in steps:
        frame = apply_record_step(frame, operator, params, keep=keep, origin=origin)
    frame = with_computed(frame, computed, keep=keep).drop(*keep)
    lines = frame.select(F.to_json(F.struct(*[column(c) for c in frame.columns])).alias(RAW_COL))
    return lines if unread is None else lines.unionByName(unread)


Grouped = tuple[tuple[str | None, ...], dict[str, Value]]  # (group, measures)


@dataclass(frozen=True)
class GroupedResult:
    rows: list[Grouped]
    records: int
    malformed: int
    # Over event-time windows: each window's (start, end) in microseconds and groups.
    windows: list[tuple[int, int, Grouped]] | None = None


def batch_grouped(
    spark: SparkSession,
    paths: Sequence[str],
    fmt: str,
    grouping: Grouping,
    steps: Sequence[tuple[str, Any]] = (),
    *,
    windows: WindowSpec | None = None,
    schema: str | None = None,
) -> GroupedResult:
    """A stage of grouped measures over the whole input, after the record operators
    ``steps``: ``groupBy(...).agg(...)``, as a Spark engineer writes it, over the records
    as the live stage reads them (nulls as SQL has them); with ``windows``, grouped by
    Spark's own ``window()`` too."""
    strings, numbers = grouping.strings, grouping.numbers
    if windows is not None and windows.field not in [*strings, *numbers]:
        strings = [*strings, windows.field]
    if steps or grouping.computed:
        lines = _after_record_steps(spark, paths, fmt, steps, grouping.computed, schema=schema)
        frame = parse_fields(
            lines,
            strings=strings,
            numbers=numbers,
            keys=grouping.group_by,
            required=grouping.required,
        )
    else:
        frame = read_records(
            spark,
            paths,
            strings,
            numbers,
            fmt=fmt,
            segments=False,
            keys=grouping.group_by,
            required=grouping.required,
        )
    frame = with_times(frame, grouping)
    aggregates = [
        agg.alias(f"_m{i}_{part}")
        for i, m in enumerate(grouping.measures)
        for part, agg in _measure(m, grouping).items()
    ]
    if windows is not None:
        return _grouped_windows(frame, grouping, aggregates, windows)
    # Malformed records are counted in the same aggregation: a record is malformed by
    # the fields the reader parses, and a plan that parsed fewer would find fewer.
    grouped = collect_all(
        frame.groupBy(MALFORMED_COL, *[column(f) for f in grouping.group_by]).agg(
            F.count(F.lit(1)).alias("_records"), *aggregates
        )
    )
    malformed = sum(int(r["_records"]) for r in grouped if r[MALFORMED_COL])
    rows = [_grouped_row(r, grouping) for r in grouped if not r[MALFORMED_COL]]
    records = sum(int(r["_records"]) for r in grouped) - malformed
    return GroupedResult(rows, records=records, malformed=malformed)


def _grouped_row(row: Row, grouping: Grouping) -> Grouped:
    values: dict[str, Value] = {}
    for i, m in enumerate(grouping.measures):
        if m.fn == "avg":
            values[m.name] = average(row[f"_m{i}_sum"], int(row[f"_m{i}_count"]))
        else:
            values[m.name] = row[f"_m{i}_value"]
    return tuple(row[f] for f in grouping.group_by), values


def _grouped_windows(
    frame: DataFrame, grouping: Grouping, aggregates: list[Column], spec: WindowSpec
) -> GroupedResult:
    """Grouped measures per event-time window, by Spark's own ``window()`` over every
    record: a batch job sees the whole input at once, so no record is late (a live
    run's equal when none was)."""
    frame = with_event_us(frame, spec.field)
    frame = frame.withColumn(MALFORMED_COL, F.col(MALFORMED_COL) | F.col(EVENT_COL).isNull())
    good = frame.where(~F.col(MALFORMED_COL)).withColumn("_t", F.timestamp_micros(EVENT_COL))
    window = F.window("_t", f"{spec.size_us} microseconds", f"{spec.slide_us} microseconds")
    grouped = collect_all(
        good.groupBy(window, *[column(f) for f in grouping.group_by])
        .agg(F.count(F.lit(1)).alias("_records"), *aggregates)
        .select(
            F.unix_micros(F.col("window.start")).alias("_start"),
            F.unix_micros(F.col("window.end")).alias("_end"),
            "*",
        )
    )
    counts = {
        r[MALFORMED_COL]: int(r["count"]) for r in frame.groupBy(MALFORMED_COL).count().collect()
    }
    windows = [(int(r["_start"]), int(r["_end"]), _grouped_row(r, grouping)) for r in grouped]
    return GroupedResult(
        [], records=counts.get(False, 0), malformed=counts.get(True, 0), windows=windows
    )


def _measure(measure: Measure, grouping: Grouping) -> dict[str, Column]:
    """A measure's aggregates: its value, or an average's exact sum and count."""
    if measure.field is None:
        return {"value": F.count(F.lit(1))}
    field = column(measure.field)
    if measure.fn == "avg":
        return {"sum": F.sum(field), "count": F.count(field)}
    if measure.fn == "approx_count_distinct":
        sketch = F.hll_sketch_agg(field.cast("STRING"), HLL_LG_K)
        return {"value": F.hll_sketch_estimate(sketch)}
    if measure.fn in BY_TIME:
        return {"value": at_time(measure, grouping, field)["v"]}
    if measure.fn == "approx_percentile":
        sketch = F.kll_sketch_agg_double(field.cast("DOUBLE"), KLL_K)
        quantile = F.kll_sketch_get_quantile_double(sketch, F.lit(measure.percentile))
        # A sketch of no value has no quantile: null, as SQL's percentile of none is
        return {"value": F.when(F.count(field) > 0, quantile)}
    folded = {
        "count": F.count,
        "sum": F.sum,
        "min": F.min,
        "max": F.max,
        "count_distinct": F.count_distinct,
    }
    return {"value": folded[measure.fn](field)}
