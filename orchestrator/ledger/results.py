"""Result rows in one shape for the streaming run and the plain batch job: per group
(and window), its group fields and each measure by its name (orchestrator/ledger/
groups.py). Sums are exact decimals on both sides and an average is divided from the
same sum and count, so equal inputs print equal rows to the last digit.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.db import transaction

from orchestrator.ledger.groups import WINDOW_COLUMNS, GroupRow, group_rows
from orchestrator.models import ResultGroup, Run
from orchestrator.pipeline.graph import pipeline_grouping, pipeline_windows


def result_columns(run: Run) -> list[str]:
    """The names of a result row's values, in the order a table shows them."""
    grouping = pipeline_grouping(run.topology)
    if grouping is None:
        return []
    windows = WINDOW_COLUMNS if pipeline_windows(run.topology) is not None else ()
    return [*windows, *grouping.group_by, *(m.name for m in grouping.measures)]


def top_rows(run: Run, limit: int) -> tuple[int, list[GroupRow]]:
    """The number of groups and the ``limit`` groups with the most records (then by
    group; groups of the latest windows first): what the run page shows while results
    merge, at a cost bounded by ``limit``."""
    grouping = pipeline_grouping(run.topology)
    if grouping is None:
        return 0, []
    windowed = pipeline_windows(run.topology) is not None
    rows = group_rows(run, grouping, limit, windowed=windowed)
    return ResultGroup.objects.filter(run=run).count(), rows


def run_rows(run: Run) -> list[GroupRow]:
    """Every row of the run's result, in window and group order."""
    grouping = pipeline_grouping(run.topology)
    if grouping is None:
        return []
    return group_rows(run, grouping, windowed=pipeline_windows(run.topology) is not None)


def summary(run: Run) -> dict[str, Any]:
    from orchestrator.ledger import segments
    from orchestrator.ledger.ingested import ingested_extent

    with transaction.atomic():
        # Coalescing folds merged chunks' rows into the run's merged prefix under the
        # run row's lock: both are read under it, fresh, or a fold between the two
        # reads (the caller's row being older) shows the folded chunks as missing.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        cover = segments.coverage(locked, ingested_extent(locked)).to_json()
    seconds = (
        (run.finished_at - run.started_at).total_seconds()
        if run.finished_at and run.started_at
        else None
    )
    return {
        "run": run.pk,
        "status": run.status,
        "seconds": seconds,
        "segments": run.chunks_total,
        "migrated_segments": segments.migrated_segments(run.pk),
        "malformed_records": segments.malformed_records(run.pk),
        "coverage": cover["status"] if cover["status"] == "exact" else cover,
        "error": run.error or None,
        "rows": run_rows(run),
        **_windowed(run),
    }


def _windowed(run: Run) -> dict[str, Any]:
    """A windowed run's late records (its rows carry their windows)."""
    from orchestrator.ledger import segments

    if pipeline_windows(run.topology) is None:
        return {}
    return {"late_records": segments.late_records(run.pk)}


# A text cell a spreadsheet would read as a formula starts with one of these; such a
# cell is written after a quote (OWASP's "CSV injection"), unless it is a number's text
# (a group value "-1"), which no spreadsheet reads as anything but that number.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_lines(run: Run) -> Iterator[str]:
    """The run's result as CSV (RFC 4180): a header of its columns, then every row."""
    columns = result_columns(run)
    rows: Iterable[Mapping[str, object]] = run_rows(run)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def line(cells: list[object]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()

    yield line(list(columns))
    for row in rows:
        yield line([_cell(row.get(c)) for c in columns])


def _cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not NUMBER.fullmatch(value):
        return "'" + value
    return "" if value is None else value
