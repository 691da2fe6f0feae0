"""Grouped measures on Spark: per input segment (or per segments aggregated
``together``), one partial per group, each measure as its mergeable state
(sparkjobs/measures.py).

A partial is a JSON line: the group's values (``g``, as text; null for a null field),
each measure's state by its name (``m``), the records it holds (``n``) and, over
event-time windows, its window's start in microseconds (``w``). Records are read as
``read_records`` reads them: a missing or null field is null, as in SQL, but for the
grouping's required fields; a line the reader cannot read, a record missing a
required field, a group field PostgreSQL could not keep, or (over windows) a record
the stage keeps that has no event time, is malformed, counted and quarantined per
segment. A record whose window the watermark of its segment's chunk
had closed is late: counted and quarantined apart, not aggregated.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Mapping
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sparkjobs import long_sums
from sparkjobs.event_time import WindowSpec
from sparkjobs.expression_guard import admitted, with_computed
from sparkjobs.holders import Holders, held_by, holders_of
from sparkjobs.keygroups import GROUP_SEPARATOR, KEY_SLOTS, KeyGroup
from sparkjobs.measure_parts import RECORDS_COL, parts_of, with_unscaled
from sparkjobs.measures import BY_TIME, HLL_LG_K, KLL_K, Grouping, Measure
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import (
    CORRUPT,
    MALFORMED_COL,
    RAW_COL,
    SEGMENT_COL,
    column,
    lines_missing_fields,
    parse_fields,
    read_records,
    read_rows,
    segment_of,
)
from sparkjobs.schemas import INPUT_SCHEMA
from sparkjobs.segments import write_atomic
from sparkjobs.session import collect_all, in_one_task
from sparkjobs.sql_stage import query_of
from sparkjobs.windows import LATE_COL, WINDOW_COL, in_windows, with_event_us

log = logging.getLogger(__name__)

GROUP_COL = "_group"  # a good record's group values as JSON; a malformed one's line
KEPT_COL = "_kept"  # whether the stage's condition holds for the record
DROPPED_COL = "_dropped"  # a good record the condition does not hold for
UNREAD_COL = "_unread"  # a line the reader could not read as a record
UNLINED_COL = "_unlined"  # a malformed record the reader kept no line of
LINE_COL = "_line"
DISTINCT_COL = "_distinct"  # a record's distinct value, when pairs are aggregated first
# The groupings this process found values too large to sum in longs: their later
# batches go straight to decimals (sparkjobs/long_sums.py).
_IN_DECIMALS: set[Grouping] = set()


def grouped_partials(
    spark: SparkSession,
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    grouping: Grouping,
    *,
    where: str | None = None,
    together: Mapping[str, str] | None = None,
    windows: WindowSpec | None = None,
    highs: Mapping[str, int | None] | None = None,
    schema: str | None = None,
    key_group: KeyGroup | None = None,
) -> dict[str, PartialOutput]:
    """Each input segment (id -> file) into its output file (id -> file): one partial
    line per group (per window and group, with ``windows``) of the records ``where``
    holds for (an admitted condition; None: every record), written atomically; what
    each segment held (records, groups, malformed and late lines). ``highs``: per
    segment, the largest event time of the chunks before its own (None: none). ``schema``:
    the source's declared fields, for records read whole from the source's chunks.
    ``key_group``: only the records of the groups whose slot it owns (its malformed
    lines too, when it counts them), as a part of a stage keyed by key groups."""
    paths = {seg: str(path) for seg, path in inputs.items()}
    holders = holders_of(paths, together or {})
    strings = list(grouping.strings)
    if windows is not None and windows.field not in [*strings, *grouping.numbers]:
        strings.append(windows.field)
    fields = [*strings, *grouping.numbers]
    if where is None and not grouping.computed:
        parsed = read_records(
            spark,
            list(paths.values()),
            strings=strings,
            numbers=grouping.numbers,
            keys=list(grouping.group_by),
            required=grouping.required,
        ).withColumns(
            {
                KEPT_COL: F.lit(True),  # noqa: FBT003 - a Spark literal
                # What the reader found malformed but kept no line of: read again after.
                UNLINED_COL: F.col(MALFORMED_COL) & F.col(RAW_COL).isNull(),
            }
        )
    else:
        parsed = _held_for(
            spark, list(paths.values()), grouping, where, strings, schema=schema
        ).withColumn(UNLINED_COL, F.lit(False))  # noqa: FBT003 - a Spark literal
    parsed = with_times(in_one_task(parsed, inputs.values()), grouping)
    window = F.lit(None).cast("BIGINT")
    is_late = F.lit(False)  # noqa: FBT003 - a Spark literal
    if windows is not None:
        by_file = {Path(paths[seg]).name: high for seg, high in (highs or {}).items()}
        # A record the condition drops needs no event time, and is never late.
        parsed = in_windows(parsed, windows, by_file, timed=F.col(KEPT_COL))
        window = F.col(WINDOW_COL)
        is_late = F.col(LATE_COL) & F.col(KEPT_COL)
    malformed = F.col(MALFORMED_COL)
    if key_group is not None:
        parsed = parsed.where(
            (~malformed & in_key_group(grouping, key_group))
            | (malformed & F.lit(key_group.counts_malformed))
        )
    # A malformed record groups under its line (the reader's; over windows, its fields as
    # read when only its event time is wrong), so its group carries what to quarantine;
    # one the reader kept no line of groups under null, its line read again after.
    as_read = F.to_json(F.struct(*[column(name) for name in fields]))
    bad_line = F.when(
        malformed, F.when(~F.col(UNLINED_COL), F.coalesce(F.col(RAW_COL), as_read))
    ).when(is_late, as_read)
    # A record the condition does not hold for is counted (the stage took it) in a
    # group of its own, which makes no partial; it, a malformed and a late one stay
    # under their own segment, a good one goes to the segment whose output holds its
    # partial (late ones only exist over windows, where segments are never together).
    dropped = ~malformed & ~F.col(KEPT_COL)
    segment = (
        F.col(SEGMENT_COL)
        if holders is None
        else F.when(malformed | dropped, F.col(SEGMENT_COL)).otherwise(holders.of)
    )
    # Grouped by the group's own fields (a good record's; null in a malformed, dropped
    # or late one's): its values are written as JSON once per group, not once per record.
    kept = ~malformed & ~dropped & ~is_late
    keys = [F.when(kept, column(name).cast("STRING")) for name in grouping.group_by]
    by = {
        SEGMENT_COL: segment,
        MALFORMED_COL: malformed,
        DROPPED_COL: dropped,
        LATE_COL: is_late,
        GROUP_COL: bad_line,
        WINDOW_COL: F.when(kept, window),
        **{f"_g{i}": key for i, key in enumerate(keys)},
    }
    fixed = _fixed(where, windows)
    for name in fixed:
        del by[name]
    distinct = _pairs_first(grouping) if holders is not None else None

    def collected(*, in_longs: bool) -> list[Row]:
        grouped = _aggregated(parsed, by, fixed, grouping, distinct, in_longs=in_longs)
        values = F.to_json(F.array(*[F.col(f"_g{i}") for i in range(len(grouping.group_by))]))
        states = F.to_json(
            F.struct(*[F.col(f"_m{i}").alias(m.name) for i, m in enumerate(grouping.measures)]),
            {"ignoreNullFields": "false"},
        )
        tail = [F.lit(', "n": '), F.col(RECORDS_COL).cast("STRING")]
        if windows is not None:
            tail += [F.lit(', "w": '), F.col(WINDOW_COL).cast("STRING")]
        line = F.concat(F.lit('{"g": '), values, F.lit(', "m": '), states, *tail, F.lit("}"))
        good = ~malformed & ~F.col(DROPPED_COL) & ~F.col(LATE_COL)
        return collect_all(
            grouped.select(
                SEGMENT_COL,
                MALFORMED_COL,
                DROPPED_COL,
                LATE_COL,
                GROUP_COL,
                RECORDS_COL,
                F.when(good, line).alias(LINE_COL),
                (~good | F.col(long_sums.EXACT)).alias(long_sums.EXACT),
            )
        )

    if grouping in _IN_DECIMALS:
        rows = collected(in_longs=False)
    else:
        rows = collected(in_longs=True)
        if not all(row[long_sums.EXACT] for row in rows):
            log.info("values of %s too large to sum in longs: aggregated in decimals", grouping)
            _IN_DECIMALS.add(grouping)
            rows = collected(in_longs=False)
    lines = _lines_again(spark, paths, rows, grouping, strings)
    return _written(rows, outputs, holders, lines)


def _lines_again(
    spark: SparkSession,
    paths: Mapping[str, str],
    rows: list[Row],
    grouping: Grouping,
    strings: list[str],
) -> list[tuple[str, str]]:
    """(segment, raw line) of each record the reader found malformed but kept no line
    of (a required field missing; in CSV and Parquet, any), from a second read of the
    segments that had them (none: no read): an operator sees in the quarantine what
    was written."""
    unlined = Counter[str]()
    for row in rows:
        if row[MALFORMED_COL] and row[GROUP_COL] is None:
            unlined[segment_of(row[SEGMENT_COL])] += row[RECORDS_COL]
    if not unlined:
        return []
    found = [
        (segment_of(row[SEGMENT_COL]), row[RAW_COL])
        for row in collect_all(
            lines_missing_fields(
                spark,
                [paths[seg] for seg in unlined],
                strings,
                grouping.numbers,
                keys=list(grouping.group_by),
                required=grouping.required,
            )
        )
        for _ in range(row["n"])
    ]
    shown = Counter(seg for seg, _ in found)
    if shown != unlined:
        # A line the rules above do not model: the counts stay the reader's, exact;
        # what could be found is quarantined.
        log.warning(
            "malformed records without a line: the reader counted %s, their lines show %s",
            dict(unlined),
            dict(shown),
        )
    return found


def in_key_group(grouping: Grouping, key_group: KeyGroup) -> Column:
    """Whether a record's group is in ``key_group``: its slot as
    ``sparkjobs.keygroups.group_slot`` computes it from the group's values as text."""
    values = [F.coalesce(column(name).cast("STRING"), F.lit("")) for name in grouping.group_by]
    slot = F.pmod(F.crc32(F.concat_ws(GROUP_SEPARATOR, *values)), F.lit(KEY_SLOTS))
    return slot.between(key_group.low, key_group.high - 1)


def _fixed(where: str | None, windows: WindowSpec | None) -> dict[str, Column]:
    """The columns no record of the stage can differ in (no condition: none dropped; no
    windows: none late, no window), by name, as every group has them: they are not
    grouped by, only written beside the groups (a constant among the keys costs every
    record its hashing and every row its width)."""
    fixed: dict[str, Column] = {}
    if where is None:
        fixed[DROPPED_COL] = F.lit(False)  # noqa: FBT003 - a Spark literal
    if windows is None:
        fixed[LATE_COL] = F.lit(False)  # noqa: FBT003 - a Spark literal
        fixed[WINDOW_COL] = F.lit(None).cast("BIGINT")
    return fixed


def _written(
    rows: list[Row],
    outputs: Mapping[str, Path],
    holders: Holders | None,
    read_again: list[tuple[str, str]],
) -> dict[str, PartialOutput]:
    """Each segment's output (id -> file) written from the job's groups: its good
    groups' partial lines; what it held, counted; its malformed lines, those
    ``read_again`` (segment, line) among them."""
    results = {seg: PartialOutput(seg, path) for seg, path in outputs.items()}
    lines: dict[str, list[str]] = {seg: [] for seg in outputs}
    for seg, line in read_again:
        results[seg].quarantined.append(line)
    for row in rows:
        if row[MALFORMED_COL]:
            result = results[segment_of(row[SEGMENT_COL])]
            result.malformed += row[RECORDS_COL]
            if row[GROUP_COL] is not None:
                result.quarantined += [row[GROUP_COL]] * row[RECORDS_COL]
            continue
        if row[DROPPED_COL]:
            results[segment_of(row[SEGMENT_COL])].records += row[RECORDS_COL]
            continue
        if row[LATE_COL]:
            result = results[segment_of(row[SEGMENT_COL])]
            result.late += row[RECORDS_COL]
            result.late_lines += [row[GROUP_COL]] * row[RECORDS_COL]
            continue
        seg = held_by(row[SEGMENT_COL], holders)
        results[seg].records += row[RECORDS_COL]
        results[seg].keys += 1
        lines[seg].append(row[LINE_COL])
    for seg, result in results.items():
        body = "".join(line + "\n" for line in sorted(lines[seg]))
        result.bytes = write_atomic(result.path, body.encode())
    return results


def _held_for(
    spark: SparkSession,
    paths: list[str],
    grouping: Grouping,
    where: str | None,
    strings: list[str],
    *,
    schema: str | None,
) -> DataFrame:
    """The records with the fields the grouping reads (``strings`` as text, its numbers
    as decimals; its computed group fields computed first), as ``read_records`` gives
    them, and whether ``where`` holds for each
    (``KEPT_COL``; null is false, as in SQL; None: it holds for every record). A
    condition or a computed field reads any field of a record, as a filter or project
    stage's does (sparkjobs/expression_guard.py), so the records are read whole, and
    their fields then as the grouping reads them; a line that is not a record is
    malformed."""
    rows = read_rows(spark, paths, schema=schema)
    data = [c for c in rows.columns if c not in {CORRUPT, SEGMENT_COL}]
    if grouping.computed:
        rows = with_computed(rows, grouping.computed, keep={CORRUPT, SEGMENT_COL})
    named = [c for c in rows.columns if c not in {CORRUPT, SEGMENT_COL}]
    whole = F.to_json(F.struct(*[column(c) for c in named]))
    holds = (
        F.lit(True)  # noqa: FBT003 - a Spark literal
        if where is None
        else F.coalesce(admitted(spark, where, fields=data), F.lit(False))  # noqa: FBT003
    )
    if CORRUPT in rows.columns:
        unread = F.col(CORRUPT).isNotNull()
        line = F.when(unread, F.col(CORRUPT)).otherwise(whole)
    else:  # every line was read as a record
        unread, line = F.lit(False), whole  # noqa: FBT003 - a Spark literal
    lines = rows.select(
        SEGMENT_COL,
        line.alias(RAW_COL),
        (~unread & holds).alias(KEPT_COL),
        unread.alias(UNREAD_COL),
    )
    parsed = parse_fields(
        lines,
        strings=strings,
        numbers=grouping.numbers,
        keys=list(grouping.group_by),
        required=grouping.required,
    )
    return parsed.withColumn(MALFORMED_COL, F.col(MALFORMED_COL) | F.col(UNREAD_COL))


def _pairs_first(grouping: Grouping) -> Measure | None:
    """The one exact distinct count whose (group, value) pairs a batch aggregated as one
    is built from, when every other measure re-aggregates (a count, sum, minimum,
    maximum or average); None otherwise.

    Segments aggregated together share their groups, and a value recurs many times in
    its group: aggregating the pairs first, in Spark's code-generated hash aggregate,
    and listing the values that leaves per group, costs less than copying every
    record's value into a set kept by the object hash aggregate."""
    distinct = [m for m in grouping.measures if m.fn == "count_distinct"]
    others = [m for m in grouping.measures if m.fn != "count_distinct"]
    if len(distinct) == 1 and all(m.fn in _REAGGREGATED for m in others):
        return distinct[0]
    return None


_REAGGREGATED = frozenset({"count", "sum", "min", "max", "avg"})


def _aggregated(
    parsed: DataFrame,
    by: Mapping[str, Column],
    fixed: Mapping[str, Column],
    grouping: Grouping,
    distinct: Measure | None,
    *,
    in_longs: bool,
) -> DataFrame:
    """Per group of ``by`` (columns by name; ``fixed``: columns every group has alike):
    its records, each measure's state (``_m0``, ``_m1``...) and whether its sums, minima
    and maxima held in longs (``long_sums.EXACT``). With a ``distinct`` measure
    (``_pairs_first``), aggregated per (group, distinct value) first, then per group;
    otherwise in one aggregation."""
    names = list(by)
    keys = [key.alias(name) for name, key in by.items()]
    if in_longs:
        parsed = with_unscaled(parsed, grouping)
    parts = [parts_of(m, grouping, in_longs=in_longs) for m in grouping.measures]
    first = {name: c for p in parts if p is not None for name, c in p.first.items()}
    records = F.count(F.lit(1)).alias(RECORDS_COL)
    if distinct is None:
        others = [
            _state(m, grouping).alias(f"_m{i}")
            for i, (m, p) in enumerate(zip(grouping.measures, parts, strict=True))
            if p is None
        ]
        grouped = parsed.groupBy(*keys).agg(records, *first.values(), *others)
    else:
        value = column(distinct.field or "").cast("STRING")
        pairs = parsed.groupBy(*keys, value.alias(DISTINCT_COL)).agg(records, *first.values())
        # One row per (group, value): the list of a group's values has no repeat.
        listed = F.sort_array(F.collect_list(DISTINCT_COL))
        grouped = pairs.groupBy(*names).agg(
            F.sum(RECORDS_COL).alias(RECORDS_COL),
            *{n: c for p in parts if p is not None for n, c in p.second.items()}.values(),
            listed.alias(f"_m{grouping.measures.index(distinct)}"),
        )
    exacts = [p.exact for p in parts if p is not None and p.exact is not None]
    exact = reduce(operator.and_, exacts) if exacts else F.lit(True)  # noqa: FBT003
    states = [
        (F.col(f"_m{i}") if p is None else p.state).alias(f"_m{i}") for i, p in enumerate(parts)
    ]
    return grouped.select(
        *names,
        *[constant.alias(name) for name, constant in fixed.items()],
        RECORDS_COL,
        *states,
        exact.alias(long_sums.EXACT),
    )


def with_times(parsed: DataFrame, grouping: Grouping) -> DataFrame:
    """``parsed`` with each event time a first or last measure is taken by, in
    microseconds (``_t0``, ``_t1``...; null when the record has none), as windows read an
    event time (sparkjobs/windows.py)."""
    for index, field in enumerate(grouping.times):
        parsed = with_event_us(parsed, field, name=f"_t{index}")
    return parsed


def at_time(measure: Measure, grouping: Grouping, field: Column) -> Column:
    """The first (last) of ``field`` by the measure's event time, as a struct of the
    time ``t`` and the value as text ``v``: the smallest (largest) (t, v), as Spark
    orders structs (a null value smallest); records without a time left out."""
    time = F.col(f"_t{grouping.times.index(measure.by or '')}")  # with_times' column
    pair = F.when(time.isNotNull(), F.struct(time.alias("t"), field.cast("STRING").alias("v")))
    return F.min(pair) if measure.fn == "first" else F.max(pair)


def _state(measure: Measure, grouping: Grouping) -> Column:
    """The partial state of a measure without parts (sparkjobs/measure_parts.py) over a
    group's records, as sparkjobs/measures.py keeps it: a distinct count's sorted set,
    a sketch by Spark's own sketch function (nulls left out, as SQL leaves them), a
    first or last value with its time."""
    field = column(measure.field or "")
    if measure.fn == "count_distinct":
        return F.sort_array(F.collect_set(field.cast("STRING")))
    if measure.fn == "approx_count_distinct":
        return F.base64(F.hll_sketch_agg(field.cast("STRING"), HLL_LG_K))
    if measure.fn == "approx_percentile":
        return F.base64(F.kll_sketch_agg_double(field.cast("DOUBLE"), KLL_K))
    if measure.fn in BY_TIME:
        pair = at_time(measure, grouping, field)
        return F.when(pair.isNotNull(), F.array(pair["t"].cast("STRING"), pair["v"]))
    raise ValueError(f"{measure.fn} aggregates in parts (sparkjobs/measure_parts.py)")


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
    """The batch job of ``aggregate``, ``sql`` and ``running`` (sparkjobs/catalog.py):
    per group, the partials of each segment, or of the segments named ``together``,
    only of ``key_group``'s groups when it is a part."""
    query = query_of(params)
    if query is None:
        raise ValueError(f"{operator}: its parameters name no valid grouping")
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
