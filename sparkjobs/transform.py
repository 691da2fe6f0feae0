"""Record-at-a-time operators: filter by a Spark SQL condition, project expressions,
join with a reference table.

One Spark job per batch; each input segment yields one output segment (possibly empty),
so outputs keep their input's place in the source data, as JSON lines. Lines that are
not JSON objects are returned for quarantine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.expression_guard import apply_record_step
from sparkjobs.keygroups import KeyGroup
from sparkjobs.outputs import PartialOutput
from sparkjobs.records import CORRUPT, SEGMENT_COL, column, read_rows, segment_of
from sparkjobs.schemas import INPUT_SCHEMA
from sparkjobs.segments import write_atomic
from sparkjobs.session import collect_all, collect_arrow, in_one_task


def record_batch(
    spark: SparkSession,
    operator: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    *,
    key_group: KeyGroup | None = None,
    highs: Mapping[str, int | None] | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """The batch job of ``filter``, ``project`` and ``join`` (sparkjobs/catalog.py). Records are
    not grouped by key, so a key group changes nothing here; nor are they windowed, so
    neither do ``highs`` (their outputs carry their inputs' event-time marks). Nor are
    they combined (``together``): each segment's records stay in its own output, which
    the balancer moves and the downstream reads as a segment of its own."""

    def lines(good: DataFrame, fields: list[str]) -> DataFrame:
        result = apply_record_step(good, operator, params, keep=[SEGMENT_COL], origin=SEGMENT_COL)
        payload = [c for c in result.columns if c != SEGMENT_COL]
        return result.select(
            SEGMENT_COL, F.to_json(F.struct(*[column(c) for c in payload])).alias(LINE_COL)
        )

    return each_segment(spark, params, inputs, outputs, lines)


LINE_COL = "_line"  # an output record as its JSON line
IDENTITY_COL = "_identity"  # an output record's identity, when the step gives one

# A record job's step over a batch's good records (the segment column, then the
# records' fields): a frame of the lines it writes, each with its segment (SEGMENT_COL)
# and, for a step that gives one, its identity (IDENTITY_COL).
Lines = Callable[[DataFrame, list[str]], DataFrame]


def each_segment(
    spark: SparkSession,
    params: Mapping[str, Any],
    inputs: Mapping[str, Path],
    outputs: Mapping[str, Path],
    lines: Lines,
) -> dict[str, PartialOutput]:
    """A record job over one batch, in one Spark job: the segments' records read (with
    the source's declared schema, if given), ``lines`` over the good ones, and each
    segment's lines written to its own output, as JSON lines, with the records it read
    (and the lines' identities, in the lines' order, when ``lines`` gives them); a line
    that is not a JSON object is counted malformed and returned for quarantine."""
    paths = [str(p) for p in inputs.values()]
    frame = in_one_task(
        read_rows(spark, paths, schema=params.get(INPUT_SCHEMA)), inputs.values()
    ).cache()
    try:
        has_corrupt = CORRUPT in frame.columns
        good = frame.where(F.col(CORRUPT).isNull()) if has_corrupt else frame
        fields = [c for c in good.columns if c not in {CORRUPT, SEGMENT_COL}]
        good = good.select(SEGMENT_COL, *[column(c) for c in fields])
        written = collect_arrow(lines(good, fields))
        bad = (
            collect_all(frame.where(F.col(CORRUPT).isNotNull()).select(SEGMENT_COL, CORRUPT))
            if has_corrupt
            else []
        )
        taken = collect_all(good.groupBy(SEGMENT_COL).count())
    finally:
        frame.unpersist()
    results = {seg: PartialOutput(seg, outputs[seg]) for seg in inputs}
    for row in taken:
        results[segment_of(row[SEGMENT_COL])].records += row["count"]
    by_segment: dict[str, list[str]] = {seg: [] for seg in inputs}
    files = _texts(written, SEGMENT_COL)
    names = {file: segment_of(file) for file in set(files)}
    segments = [names[file] for file in files]
    for seg, line in zip(segments, _texts(written, LINE_COL), strict=True):
        by_segment[seg].append(line)
    if IDENTITY_COL in written.column_names:
        for seg, identity in zip(segments, _texts(written, IDENTITY_COL), strict=True):
            results[seg].identities.append(identity)
    for row in bad:
        seg = segment_of(row[SEGMENT_COL])
        results[seg].malformed += 1
        results[seg].quarantined.append(row[CORRUPT])
    for seg, output in results.items():
        text = "".join(f"{line}\n" for line in by_segment[seg])
        output.bytes = write_atomic(output.path, text.encode())
    return results


def _texts(table: pa.Table, name: str) -> list[str]:
    """A column of ``lines``' frame, which is never null (a segment's file name, a
    struct's JSON, a digest), as Python strings."""
    return cast("list[str]", table.column(name).to_pylist())
