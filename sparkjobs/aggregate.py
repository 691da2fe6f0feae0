"""Per-key partial aggregates that merge exactly: one partial per input segment, or one
for several segments that go to the same place (``together``).

A partial holds, per key: count, sum, min and max of the value, and the set of distinct
values of the distinct field. Partials of any grouping of the input merge into the exact
result: count and sum add (sums are decimals), min and max fold, sets unite; the average
is divided only at the output (a mean of partial means would be wrong).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sparkjobs import long_sums
from sparkjobs.event_time import WindowSpec
from sparkjobs.grouped import grouped_partials
from sparkjobs.holders import held_by, holders_of
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import (
    MALFORMED_COL,
    RAW_COL,
    SEGMENT_COL,
    column,
    lines_missing_fields,
    read_records,
    segment_of,
)
from sparkjobs.schemas import INPUT_SCHEMA
from sparkjobs.segments import write_atomic
from sparkjobs.session import collect_all, in_one_task
from sparkjobs.sql_stage import query_of
from sparkjobs.windows import EVENT_COL, LATE_COL, WINDOW_COL, in_windows

log = logging.getLogger(__name__)

GROUP_COL = "_group"  # a good record's key; a malformed or late one's line (or null)
DISTINCT_COL = "_distinct"  # a good record's distinct value; null for the others
LINE_COL = "_line"  # a good group's partial, as its output's line
# What a partial is grouped by, in the job's two plans alike (``_per_group``).
GROUP_KEYS = (SEGMENT_COL, MALFORMED_COL, LATE_COL, WINDOW_COL, GROUP_COL)


@dataclass(frozen=True)
class AggregateParams:
    key: str = "key"
    value: str = "value"
    distinct: str = "user"
    windows: WindowSpec | None = None  # per event-time window, or over all time

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AggregateParams:
        return cls(
            key=params.get("key", "key"),
            value=params.get("value", "value"),
            distinct=params.get("distinct", "user"),
            windows=WindowSpec.from_params(params),
        )

    @property
    def strings(self) -> list[str]:
        """The text fields read: key, distinct field, event time."""
        named = {self.key, self.distinct}
        if self.windows is not None:
            named.add(self.windows.field)
        return sorted(named)


# The aggregates (by their fields) whose values this process found too large to sum
# in longs: their later batches go straight to decimals, instead of twice through
# Spark each. A handful at most: one per aggregate a worker runs.
_IN_DECIMALS: set[AggregateParams] = set()


def partial_aggregate(
    spark: SparkSession,
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    params: AggregateParams,
    *,
    key_group: KeyGroup | None = None,
    highs: Mapping[str, int | None] | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """Aggregate each input segment (id -> file) into its output file (id -> file).

    One Spark job reads the whole batch; malformed lines are returned per segment for
    quarantine. Outputs are written atomically, so a crash leaves no half file. With a
    ``key_group`` only the keys of that group are aggregated (a keyed stage's part).
    Windowed, partials are per (window, key), and a record's window that the watermark
    of its segment's chunk had closed (``highs``: segment id -> the largest event time
    before its chunk) is late: counted and quarantined, not aggregated.

    ``together`` (segment id -> segment id) names, for a segment, the one whose output
    holds its partial: the partials of the segments named together are aggregated as
    one, into that output, and theirs are left empty. Malformed and late records are
    still counted and quarantined per segment.
    """
    strings = params.strings
    paths = {seg: str(path) for seg, path in inputs.items()}
    holders = holders_of(paths, together or {})
    parsed = in_one_task(
        read_records(
            spark, list(paths.values()), strings=strings, numbers=[params.value], keys=[params.key]
        ),
        inputs.values(),
    )
    spec = params.windows
    window = F.lit(None).cast("BIGINT")
    is_late = F.lit(False)  # noqa: FBT003 - a Spark literal
    if spec is not None:
        by_file = {Path(paths[seg]).name: high for seg, high in (highs or {}).items()}
        parsed = in_windows(parsed, spec, by_file)
        window, is_late = F.col(WINDOW_COL), F.col(LATE_COL)
    if key_group is not None:
        slot = F.pmod(F.crc32(F.col(params.key)), F.lit(KEY_SLOTS))
        slots = key_group.slots
        owned = ~F.col(MALFORMED_COL) & slot.between(slots.start, slots.stop - 1)
        parsed = parsed.where(owned | (F.col(MALFORMED_COL) & F.lit(key_group.counts_malformed)))
    # One pass: good records aggregate per (segment, key); a malformed one groups under
    # its own raw line, so the groups carry what to quarantine (a repeated line once,
    # with its count). Collecting the raw lines instead had cost a quarter of the job.
    # Records missing a field have no raw line from the reader: they group under null,
    # and their lines are read again below, from their segments only.
    # The distinct values are built in one of two plans (``_per_group``).
    # A late record is quarantined as the fields read, as JSON: the reader kept no line
    # of a readable record, and late ones are few.
    as_read = F.to_json(F.struct(*[F.col(f"`{n}`") for n in [*strings, params.value]]))
    group = (
        F.when(F.col(MALFORMED_COL), F.col(RAW_COL))
        .when(is_late, as_read)
        .otherwise(F.col(params.key))
    )
    # A malformed record whose event time alone is wrong has a readable line: it is
    # quarantined as its fields, like a late one.
    if spec is not None:
        time_alone_wrong = (
            F.col(MALFORMED_COL)
            & F.col(RAW_COL).isNull()
            & F.col(EVENT_COL).isNull()
            & F.col(f"`{spec.field}`").isNotNull()
        )
        group = F.when(time_alone_wrong, as_read).otherwise(group)
    # A good record is aggregated under the segment whose output holds its partial; a
    # malformed or late one stays under its own, where it is counted and quarantined.
    segment = (
        F.col(SEGMENT_COL)
        if holders is None
        else F.when(F.col(MALFORMED_COL) | is_late, F.col(SEGMENT_COL)).otherwise(holders.of)
    )
    # A malformed or late record has no distinct value to keep.
    distinct_value = F.when(F.col(MALFORMED_COL) | is_late, F.lit(None)).otherwise(
        column(params.distinct)
    )
    keys = [
        key.alias(name)
        for name, key in zip(
            GROUP_KEYS, (segment, F.col(MALFORMED_COL), is_late, window, group), strict=True
        )
    ]
    grouped = _groups(
        parsed,
        keys,
        params,
        distinct_value,
        shared=holders is not None,
        windowed=spec is not None,
    )
    partial_rows = [row for row in grouped if not row[MALFORMED_COL] and not row[LATE_COL]]
    late_rows = [
        (segment_of(row[SEGMENT_COL]), row[GROUP_COL])
        for row in grouped
        if row[LATE_COL]
        for _ in range(row["count"])
    ]
    bad_rows = [
        (segment_of(row[SEGMENT_COL]), row[GROUP_COL])
        for row in grouped
        if row[MALFORMED_COL] and row[GROUP_COL] is not None
        for _ in range(row["count"])
    ]
    missing = {
        segment_of(row[SEGMENT_COL]): int(row["count"])
        for row in grouped
        if row[MALFORMED_COL] and row[GROUP_COL] is None
    }
    if missing:
        bad_rows += _missing_field_lines(spark, paths, missing, params)

    results = {seg: PartialOutput(seg, outputs[seg]) for seg in inputs}
    lines_by_segment: dict[str, list[str]] = {seg: [] for seg in inputs}
    for row in partial_rows:
        seg = held_by(row[SEGMENT_COL], holders)
        result = results[seg]
        result.records += row["count"]
        result.keys += 1
        lines_by_segment[seg].append(row[LINE_COL])
    for seg, raw in bad_rows:
        result = results[seg]
        result.malformed += 1
        result.quarantined.append(raw)
    for seg, raw in late_rows:
        results[seg].late += 1
        results[seg].late_lines.append(raw)
    for seg, result in results.items():
        body = "".join(line + "\n" for line in sorted(lines_by_segment[seg]))
        result.bytes = write_atomic(result.path, body.encode())
    return results


def _groups(
    parsed: DataFrame,
    keys: list[Column],
    params: AggregateParams,
    distinct: Column,
    *,
    shared: bool,
    windowed: bool,
) -> list[Row]:
    """The job's groups, collected: each with its partial's line when it is good.

    The value's aggregates are summed in longs unless this process saw the aggregate's
    values too large for them; a batch that holds such a value is aggregated again in
    decimals (sparkjobs/long_sums.py)."""

    def collected(*, in_longs: bool) -> list[Row]:
        per_group = _per_group(
            parsed, keys, value=params.value, distinct=distinct, shared=shared, in_longs=in_longs
        )
        return collect_all(
            per_group.select(
                SEGMENT_COL,
                MALFORMED_COL,
                LATE_COL,
                GROUP_COL,
                "count",
                long_sums.EXACT,
                _partial_line(windowed=windowed).alias(LINE_COL),
            )
        )

    if params in _IN_DECIMALS:
        return collected(in_longs=False)
    grouped = collected(in_longs=True)
    good = [row for row in grouped if not row[MALFORMED_COL] and not row[LATE_COL]]
    if all(row[long_sums.EXACT] for row in good):
        return grouped
    log.info("values of %s too large to sum in longs: aggregated in decimals", params)
    _IN_DECIMALS.add(params)
    return collected(in_longs=False)


def _partial_line(*, windowed: bool) -> Column:
    """A good group's partial as the line its output holds, written by Spark: its
    window (windowed), key, count, sum, min, max (decimals as plain text) and distinct
    values, as JSON; null for a malformed or late group. Collecting the sets' values
    into Python one by one instead cost 0.2 to 0.6 s of a 512 MB batch's job
    (docs/benchmarks.md, "users aggregated before their sets")."""
    fields = [F.col(WINDOW_COL).alias("window")] if windowed else []
    fields += [
        F.col(GROUP_COL).alias("key"),
        F.col("count"),
        *[F.col(name).cast("STRING").alias(name) for name in ("sum", "min", "max")],
        F.col("distinct"),
    ]
    line = F.to_json(F.struct(*fields), {"ignoreNullFields": "false"})
    return F.when(~F.col(MALFORMED_COL) & ~F.col(LATE_COL), line)


def _per_group(
    parsed: DataFrame,
    keys: list[Column],
    *,
    value: str,
    distinct: Column,
    shared: bool,
    in_longs: bool,
) -> DataFrame:
    """Per group of ``keys``: count, sum, min and max of ``value`` and the sorted set of
    ``distinct`` (null for a record with none), in the plan that suits the groups, and
    whether the sum, min and max hold (``long_sums.EXACT``).

    ``in_longs``, the value's aggregates are summed in longs (sparkjobs/long_sums.py),
    and a group with a value too large for them says so; otherwise in decimals, as
    the idiomatic job sums them, always exact.

    Each segment its own group (not ``shared``): collect_set keeps each task's sets in
    the object hash aggregate (session.py raises its fallback to sorting), and one
    exchange unites them. Within a segment's key most values are new, so aggregating
    every (group, value) pair first, as count(DISTINCT)'s plan does, exchanged nearly
    every record, and collect_set made the job 22 to 37% faster (docs/benchmarks.md,
    "distinct sets built per task").

    Segments aggregated together (``shared``) share their groups, and a value recurs
    many times in its group (the peers' 512 MB: 3.6 million records, 243,000 pairs).
    Then the pairs are aggregated first, in Spark's code-generated hash aggregate, and
    the values that aggregation leaves are listed per group: collect_set over every
    record copied each record's value into a set kept in the object hash aggregate,
    which has no generated code, and the sets lived through every young collection
    (docs/benchmarks.md, "users aggregated before their sets").
    """
    count = F.count(F.lit(1)).alias("count")
    if in_longs:
        parsed = long_sums.with_unscaled(parsed, value)
        of_values, of_partials = long_sums.per_record(), long_sums.of_partials()
        as_decimals = long_sums.as_decimals(F.col("count"))
    else:
        of_values, of_partials = _decimals(F.col(value)), _decimals_of_partials()
        exact = F.lit(True).alias(long_sums.EXACT)  # noqa: FBT003 - a Spark literal
        as_decimals = [F.col("sum"), F.col("min"), F.col("max"), exact]
    if not shared:
        grouped = parsed.groupBy(*keys).agg(
            count, *of_values, F.sort_array(F.collect_set(distinct)).alias("distinct")
        )
        return grouped.select(*GROUP_KEYS, "count", *as_decimals, "distinct")
    per_value = parsed.groupBy(*keys, distinct.alias(DISTINCT_COL)).agg(count, *of_values)
    grouped = per_value.groupBy(*GROUP_KEYS).agg(
        F.sum("count").alias("count"),
        *of_partials,
        F.sort_array(F.collect_list(DISTINCT_COL)).alias("distinct"),
    )
    return grouped.select(*GROUP_KEYS, "count", *as_decimals, "distinct")


def _decimals(value: Column) -> list[Column]:
    """Sum, min and max of a decimal value, as the idiomatic job has them."""
    return [F.sum(value).alias("sum"), F.min(value).alias("min"), F.max(value).alias("max")]


def _decimals_of_partials() -> list[Column]:
    """The same aggregates over groups of ``_decimals``' columns."""
    return [F.sum("sum").alias("sum"), F.min("min").alias("min"), F.max("max").alias("max")]


def _missing_field_lines(
    spark: SparkSession,
    paths: Mapping[str, str],
    missing: Mapping[str, int],
    params: AggregateParams,
) -> list[tuple[str, str]]:
    """(segment, raw line) of each record that was malformed for a missing field, from a
    second read of the segments that had them (in a keyed stage, only by the part that
    counts malformed records)."""
    rows = collect_all(
        lines_missing_fields(
            spark,
            [paths[seg] for seg in missing],
            params.strings,
            [params.value],
            keys=[params.key],
        )
    )
    found = [(segment_of(row[SEGMENT_COL]), row[RAW_COL]) for row in rows for _ in range(row["n"])]
    per_segment = Counter(seg for seg, _ in found)
    if per_segment != Counter(missing):
        # A line the rules above do not model: counts stay the reader's, exact; what
        # could be found is still quarantined.
        log.warning(
            "malformed records missing a field: the reader counted %s, their lines show %s",
            dict(missing),
            dict(per_segment),
        )
    return found


def aggregate_batch(
    spark: SparkSession,
    operator: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    *,
    key_group: KeyGroup | None,
    highs: Mapping[str, int | None] | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """The batch job of ``aggregate`` and ``running`` (sparkjobs/catalog.py): per-key
    partials of each segment, or of the segments named ``together``, only of
    ``key_group``'s keys when it is a part; a stage of grouped measures' per group
    (sparkjobs/grouped.py)."""
    query = query_of(params)
    if query is not None:
        return grouped_partials(
            spark,
            inputs,
            outputs,
            query.grouping,
            where=query.where,
            together=together,
            windows=WindowSpec.from_params(params),
            highs=highs,
            schema=params.get(INPUT_SCHEMA),
            key_group=key_group,
        )
    return partial_aggregate(
        spark,
        inputs,
        outputs,
        AggregateParams.from_params(params),
        key_group=key_group,
        highs=highs,
        together=together,
    )
