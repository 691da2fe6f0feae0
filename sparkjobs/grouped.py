"""Grouped measures on Spark: per input segment (or per segments aggregated
``together``), one partial per group, each measure as its mergeable state
(sparkjobs/measures.py).

A partial is a JSON line: the group's values (``g``, as text; null for a null field)
and each measure's state by its name (``m``). Records are read as
``read_records(nullable=True)`` reads them: a missing or null field is null, as in
SQL; a line the reader cannot read, or a group field PostgreSQL could not keep, is
malformed, counted and quarantined per segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.expression_guard import admitted
from sparkjobs.holders import held_by, holders_of
from sparkjobs.measures import HLL_LG_K, KLL_K, Grouping, Measure
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import (
    CORRUPT,
    MALFORMED_COL,
    RAW_COL,
    SEGMENT_COL,
    column,
    parse_fields,
    read_records,
    read_rows,
    segment_of,
)
from sparkjobs.segments import write_atomic
from sparkjobs.session import collect_all, in_one_task

GROUP_COL = "_group"  # a good record's group values as JSON; a malformed one's line
KEPT_COL = "_kept"  # whether the stage's condition holds for the record
DROPPED_COL = "_dropped"  # a good record the condition does not hold for
UNREAD_COL = "_unread"  # a line the reader could not read as a record
RECORDS_COL = "_records"
LINE_COL = "_line"


def grouped_partials(
    spark: SparkSession,
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    grouping: Grouping,
    *,
    where: str | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """Each input segment (id -> file) into its output file (id -> file): one partial
    line per group of the records ``where`` holds for (an admitted condition; None:
    every record), written atomically; what each segment held (records, groups,
    malformed lines)."""
    paths = {seg: str(path) for seg, path in inputs.items()}
    holders = holders_of(paths, together or {})
    fields = [*grouping.strings, *grouping.numbers]
    if where is None:
        parsed = read_records(
            spark,
            list(paths.values()),
            strings=grouping.strings,
            numbers=grouping.numbers,
            keys=list(grouping.group_by),
            nullable=True,
        ).withColumn(KEPT_COL, F.lit(True))  # noqa: FBT003 - a Spark literal
    else:
        parsed = _held_for(spark, list(paths.values()), grouping, where)
    parsed = in_one_task(parsed, inputs.values())
    malformed = F.col(MALFORMED_COL)
    # A malformed record groups under its line (the reader's, or its fields as read when
    # a readable line held text that cannot be kept), so its group carries what to
    # quarantine.
    as_read = F.to_json(F.struct(*[column(name) for name in fields]))
    values = F.to_json(F.array(*[column(name).cast("STRING") for name in grouping.group_by]))
    group = F.when(malformed, F.coalesce(F.col(RAW_COL), as_read)).otherwise(values)
    # A record the condition does not hold for is counted (the stage took it) in a
    # group of its own, which makes no partial; it and a malformed one stay under their
    # own segment, a good one goes to the segment whose output holds its partial.
    dropped = ~malformed & ~F.col(KEPT_COL)
    group = F.when(dropped, F.lit(None)).otherwise(group)
    segment = (
        F.col(SEGMENT_COL)
        if holders is None
        else F.when(malformed | dropped, F.col(SEGMENT_COL)).otherwise(holders.of)
    )
    grouped = parsed.groupBy(
        segment.alias(SEGMENT_COL),
        malformed.alias(MALFORMED_COL),
        dropped.alias(DROPPED_COL),
        group.alias(GROUP_COL),
    ).agg(
        F.count(F.lit(1)).alias(RECORDS_COL),
        *[_state(m).alias(f"_m{i}") for i, m in enumerate(grouping.measures)],
    )
    states = F.to_json(
        F.struct(*[F.col(f"_m{i}").alias(m.name) for i, m in enumerate(grouping.measures)]),
        {"ignoreNullFields": "false"},
    )
    line = F.concat(F.lit('{"g": '), F.col(GROUP_COL), F.lit(', "m": '), states, F.lit("}"))
    rows = collect_all(
        grouped.select(
            SEGMENT_COL,
            MALFORMED_COL,
            DROPPED_COL,
            GROUP_COL,
            RECORDS_COL,
            F.when(~malformed & ~F.col(DROPPED_COL), line).alias(LINE_COL),
        )
    )
    results = {seg: PartialOutput(seg, outputs[seg]) for seg in inputs}
    lines: dict[str, list[str]] = {seg: [] for seg in inputs}
    for row in rows:
        if row[MALFORMED_COL]:
            result = results[segment_of(row[SEGMENT_COL])]
            result.malformed += row[RECORDS_COL]
            result.quarantined += [row[GROUP_COL]] * row[RECORDS_COL]
            continue
        if row[DROPPED_COL]:
            results[segment_of(row[SEGMENT_COL])].records += row[RECORDS_COL]
            continue
        seg = held_by(row[SEGMENT_COL], holders)
        results[seg].records += row[RECORDS_COL]
        results[seg].keys += 1
        lines[seg].append(row[LINE_COL])
    for seg, result in results.items():
        body = "".join(line + "\n" for line in sorted(lines[seg]))
        result.bytes = write_atomic(result.path, body.encode())
    return results


def _held_for(spark: SparkSession, paths: list[str], grouping: Grouping, where: str) -> DataFrame:
    """The records with the fields the grouping reads, as ``read_records(nullable=True)``
    gives them, and whether ``where`` holds for each (``KEPT_COL``; null is false, as in
    SQL). The condition reads every field of a record, as a filter stage's does
    (sparkjobs/expression_guard.py), so the records are read whole, and their fields
    then as the grouping reads them; a line that is not a record is malformed."""
    rows = read_rows(spark, paths)
    data = [c for c in rows.columns if c not in {CORRUPT, SEGMENT_COL}]
    whole = F.to_json(F.struct(*[column(c) for c in data]))
    holds = F.coalesce(admitted(spark, where, fields=data), F.lit(False))  # noqa: FBT003
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
        strings=grouping.strings,
        numbers=grouping.numbers,
        keys=list(grouping.group_by),
        nullable=True,
    )
    return parsed.withColumn(MALFORMED_COL, F.col(MALFORMED_COL) | F.col(UNREAD_COL))


def _state(measure: Measure) -> Column:
    """A measure's partial state over a group's records, as sparkjobs/measures.py keeps
    it: decimals as text, an average as its sum and count, a distinct count's sorted
    set, a sketch by Spark's own sketch function (nulls left out, as SQL leaves them)."""
    if measure.field is None:  # count: every other function names one (measures.problems)
        return F.count(F.lit(1))
    field = column(measure.field)
    if measure.fn == "count":
        return F.count(field)
    if measure.fn == "count_distinct":
        return F.sort_array(F.collect_set(field.cast("STRING")))
    if measure.fn == "avg":
        return F.struct(F.sum(field).cast("STRING").alias("sum"), F.count(field).alias("count"))
    if measure.fn == "approx_count_distinct":
        return F.base64(F.hll_sketch_agg(field.cast("STRING"), HLL_LG_K))
    if measure.fn == "approx_percentile":
        return F.base64(F.kll_sketch_agg_double(field.cast("DOUBLE"), KLL_K))
    aggregate = {"sum": F.sum, "min": F.min, "max": F.max}[measure.fn]
    return aggregate(field).cast("STRING")
