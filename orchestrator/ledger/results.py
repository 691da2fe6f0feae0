"""Result rows in one shape for the streaming run and the plain batch job.

Sums are exact decimals on both sides; the average is computed here, from the same sum
and count, so equal inputs print equal rows to the last digit.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any, TypedDict

from django.db import transaction
from django.db.models import BigIntegerField, QuerySet
from django.db.models.functions import Coalesce

from orchestrator.ledger.groups import WINDOW_COLUMNS, GroupRow, group_rows
from orchestrator.ledger.windows import Cardinality, distinct_of
from orchestrator.models import ResultGroup, ResultKey, Run, WindowKey
from orchestrator.pipeline.graph import pipeline_grouping, pipeline_windows
from sparkjobs.event_time import iso


class ResultRow(TypedDict):
    key: str
    count: int
    sum_value: float
    min_value: float
    max_value: float
    avg_value: float
    distinct_users: int


def format_row(
    key: str, count: int, total: Decimal, low: Decimal, high: Decimal, *, distinct: int
) -> ResultRow:
    return ResultRow(
        key=key,
        count=int(count),
        sum_value=float(total),
        min_value=float(low),
        max_value=float(high),
        avg_value=float(Decimal(total) / Decimal(count)) if count else 0.0,
        distinct_users=int(distinct),
    )


def result_columns(run: Run) -> list[str]:
    """The names of a result row's values, in the order a table shows them."""
    grouping = pipeline_grouping(run.topology)
    if grouping is not None:
        windows = WINDOW_COLUMNS if pipeline_windows(run.topology) is not None else ()
        return [*windows, *grouping.group_by, *(m.name for m in grouping.measures)]
    return list(ResultRow.__annotations__)


def top_rows(run: Run, limit: int) -> tuple[int, list[ResultRow] | list[GroupRow]]:
    """The number of keys (groups) and the ``limit`` keys with the most records (then by
    key; groups of the latest windows first): what the run page shows while results
    merge, at a cost bounded by ``limit``."""
    grouping = pipeline_grouping(run.topology)
    if grouping is not None:
        windowed = pipeline_windows(run.topology) is not None
        rows = group_rows(run, grouping, limit, windowed=windowed)
        return ResultGroup.objects.filter(run=run).count(), rows
    keys = ResultKey.objects.filter(run=run)
    top = result_values(keys.order_by("-count", "key")[: max(0, limit)])
    return keys.count(), [format_row(*row[:5], distinct=row[5]) for row in top]


def run_rows(run: Run) -> list[ResultRow] | list[GroupRow]:
    """Every row of the run's result, in key (window and group) order."""
    grouping = pipeline_grouping(run.topology)
    if grouping is not None:
        return group_rows(run, grouping, windowed=pipeline_windows(run.topology) is not None)
    rows = result_values(ResultKey.objects.filter(run=run))
    return sorted(
        (format_row(*row[:5], distinct=row[5]) for row in rows), key=lambda row: row["key"]
    )


def result_values(
    keys: QuerySet[ResultKey],
) -> list[tuple[str, int, Decimal, Decimal, Decimal, int]]:
    """(key, count, sum, min, max, distinct count) of each of ``keys``, the ledger's own
    values. The distinct count is kept on the key's row once the run completed (its set
    dropped: :func:`orchestrator.ledger.retention.freeze_results`), else counted from
    its set, in the same statement: two reads could see the set dropped in between."""
    distinct = Coalesce("distinct", counted_distinct(), output_field=BigIntegerField())
    return list(
        keys.annotate(n_distinct=distinct).values_list(
            "key", "count", "sum", "min", "max", "n_distinct"
        )
    )


def counted_distinct() -> Coalesce:
    """A result row's distinct count counted from its set (0 without one): an
    expression over ``ResultKey`` rows, for reading and for keeping the count."""
    return Coalesce(Cardinality("values"), 0, output_field=BigIntegerField())


class WindowRow(ResultRow):
    window_start: str
    window_end: str
    closed: bool


def window_rows(run: Run) -> list[WindowRow]:
    """A windowed run's rows (open and closed), by window then key."""
    rows = WindowKey.objects.filter(run=run)
    return [
        WindowRow(
            window_start=iso(r.start_us),
            window_end=iso(r.end_us),
            closed=r.closed_at is not None,
            **format_row(r.key, r.count, r.sum, r.min, r.max, distinct=distinct_of(r)),
        )
        for r in rows.order_by("start_us", "key")
    ]


def sorted_rows(rows: Iterable[ResultRow]) -> list[ResultRow]:
    return sorted(rows, key=lambda row: row["key"])


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
    """A windowed run's late records, and the key form's rows per window (grouped
    measures' rows carry their windows)."""
    from orchestrator.ledger import segments

    if pipeline_windows(run.topology) is None:
        return {}
    late = {"late_records": segments.late_records(run.pk)}
    if pipeline_grouping(run.topology) is not None:
        return late
    return {"windows": window_rows(run), **late}


# A text cell a spreadsheet would read as a formula starts with one of these; such a
# cell is written after a quote (OWASP's "CSV injection"), unless it is a number's text
# (a group value "-1"), which no spreadsheet reads as anything but that number.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_lines(run: Run) -> Iterator[str]:
    """The run's result as CSV (RFC 4180): a header of its columns, then every row (a
    windowed run of the key form: each window's rows, with the window's bounds)."""
    columns = result_columns(run)
    rows: Iterable[Mapping[str, object]] = run_rows(run)
    if pipeline_windows(run.topology) is not None and pipeline_grouping(run.topology) is None:
        columns = ["window_start", "window_end", *columns]
        rows = window_rows(run)
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
