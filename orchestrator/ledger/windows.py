"""Event-time windows at the sink: open while data may still come, closed once.

A windowed pipeline's partials are per (window, group) (orchestrator/ledger/groups.py).
The sink folds them into open
windows in the transaction that records their chunks as merged (as for all-time
results). A window is *final* when the sink's watermark passes its end: the chunks
``0 .. n-1`` are all merged and the largest event time among them, minus the allowed
lateness, is at or past the window's end. Every later chunk was read under a watermark
at least that high, so its records for that window were found late by the operators
and never reach the sink: nothing can change a closed window. Closing marks its rows in
one statement, once; an input that ends closes every window (its watermark is +inf).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from django.db import connection, transaction
from django.db.models import QuerySet

from orchestrator.ledger import keystate
from orchestrator.ledger.coalesce import Prefix, tiles_the_slots
from orchestrator.ledger.groups import stored
from orchestrator.models import MergedChunk, ResultGroup, Run
from orchestrator.sink.layout import Layout
from orchestrator.sink.targets import ClosedRow, ResultTable, Sink, SinkError
from sparkjobs.event_time import WindowSpec
from sparkjobs.measures import Grouping, Value

# Most merged chunk rows one call walks, so the driver's tick never waits long.
MAX_ROWS = 50_000
# Closed windows whose rows the ledger keeps when the sink writes them elsewhere.
KEEP_CLOSED = 10


@dataclass(frozen=True)
class SinkWatermark:
    """Chunks below ``chunk`` are merged; ``high_us`` is their largest event time;
    windows ending by ``closed_us`` are closed (None: none yet)."""

    chunk: int = 0
    high_us: int | None = None
    closed_us: int | None = None
    windows: int = 0  # windows closed so far (a sink elsewhere keeps the rows of few)

    @classmethod
    def of(cls, run: Run) -> SinkWatermark:
        kept = run.windows_closed or {}
        return cls(
            int(kept.get("chunk", 0)),
            _int_or_none(kept.get("high_us")),
            _int_or_none(kept.get("closed_us")),
            int(kept.get("windows", 0)),
        )

    def to_json(self) -> dict[str, int | None]:
        return {
            "chunk": self.chunk,
            "high_us": self.high_us,
            "closed_us": self.closed_us,
            "windows": self.windows,
        }


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(str(value))


def advance(
    run_id: int,
    spec: WindowSpec,
    sink: Sink,
    *,
    grouping: Grouping,
    final: bool = False,
) -> int:
    """Move the sink's watermark over the chunks merged since, and close the windows it
    passed (``final``: the input ended, close them all), writing their rows in the
    sink's columns, their measures by ``grouping``. Returns how many rows were closed."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        mark = SinkWatermark.of(run)
        folded = Prefix.of(run, [])
        if run.merged_prefix and folded.chunk > mark.chunk:
            # Rows below a continuous run's merged prefix are gone: start from it.
            mark = SinkWatermark(
                folded.chunk, _higher(mark.high_us, folded.high_us), mark.closed_us, mark.windows
            )
        merged = list(
            MergedChunk.objects.filter(run_id=run_id, chunk__gte=mark.chunk)
            .order_by("chunk", "slots_from")
            .values_list("chunk", "slots_from", "slots_to", "high_us")[:MAX_ROWS]
        )
        chunk, high = mark.chunk, mark.high_us
        at = 0
        while at < len(merged) and merged[at][0] == chunk:
            parts = [r for r in merged[at:] if r[0] == chunk]
            if not tiles_the_slots([(r[1], r[2]) for r in parts]):
                break
            high = _higher(high, parts[0][3])
            chunk, at = chunk + 1, at + len(parts)
        closed = mark.closed_us
        if high is not None:
            closed = _higher(closed, high - spec.lateness_us)
        closing = _Groups(run_id, grouping, sink.layout)
        rows = closing.rows(None if final else closed, nothing=not final and closed is None)
        # The target is written first: in this transaction when it shares the ledger's
        # database, else committed before it (an upsert, so a crash between the two
        # writes the same rows again).
        sink.write(run_id, [row for row, _ in rows])
        closing.close(rows)
        if final:
            closed = _higher(closed, closing.last_end())
        if not isinstance(sink, ResultTable):
            closing.forget_written()
        if closed is not None:
            keystate.forget_closed(run_id, spec.size_us, closed)
        Run.objects.filter(pk=run_id).update(
            windows_closed=SinkWatermark(
                chunk, high, closed, mark.windows + len({r.start_us for r, _ in rows})
            ).to_json()
        )
        return len(rows)


class _Groups:
    """A run's windows of grouped measures (``ResultGroup`` rows with a window), as one
    closing step reads and closes them."""

    all: QuerySet[ResultGroup]

    def __init__(self, run_id: int, grouping: Grouping, layout: Layout) -> None:
        self.run_id, self.grouping, self.layout = run_id, grouping, layout
        self.all = ResultGroup.objects.filter(run_id=run_id, start_us__isnull=False)
        self.values: dict[int, dict[str, Value]] = {}  # each closing row's measures

    def last_end(self) -> int | None:
        """The latest end of a window the run has."""
        return self.all.order_by("-end_us").values_list("end_us", flat=True).first()

    def forget_written(self) -> None:
        """A sink elsewhere holds the closed windows: the ledger keeps only the latest
        ``KEEP_CLOSED`` of them, for the run page."""
        closed = self.all.filter(closed_at__isnull=False)
        starts = closed.values_list("start_us", flat=True).distinct().order_by("-start_us")
        oldest_kept = list(starts[:KEEP_CLOSED])
        if len(oldest_kept) == KEEP_CLOSED:
            closed.filter(start_us__lt=oldest_kept[-1]).delete()

    def rows(self, up_to: int | None, *, nothing: bool) -> list[tuple[ClosedRow, int]]:
        """The final rows of the windows ending by ``up_to`` (None: all), each with its
        group's row id; their measures are finished from their states once."""
        if nothing:
            return []
        pending = self.all.filter(closed_at__isnull=True)
        if up_to is not None:
            pending = pending.filter(end_us__lte=up_to)
        rows = []
        for pk, start, end, group, states in pending.order_by("start_us", "digest").values_list(
            "pk", "start_us", "end_us", "group", "states"
        ):
            values = self.grouping.finish(states)
            try:
                cells = self.layout.cells([*group, *values.values()])
            except ValueError as exc:
                raise SinkError(f"window starting {start} us: {exc}") from exc
            self.values[pk] = values
            rows.append((ClosedRow(cast("int", start), cast("int", end), cells), pk))
        return rows

    def close(self, rows: Sequence[tuple[ClosedRow, int]]) -> None:
        """Mark the rows closed, keeping each measure's value and dropping its state."""
        if not rows:
            return
        finished = [json.dumps(stored(self.values[pk])) for _, pk in rows]
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE orchestrator_resultgroup g
                SET closed_at = now(), finished = d.f::jsonb, states = '{}'::jsonb
                FROM unnest(%s::bigint[], %s::text[]) AS d(id, f)
                WHERE g.id = d.id AND g.run_id = %s
                """,
                [[pk for _, pk in rows], finished, self.run_id],
            )


def _higher(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
