"""Event-time windows at the sink: open while data may still come, closed once.

A windowed pipeline's partials are per (window, key), or per (window, group) for
grouped measures (orchestrator/ledger/groups.py). The sink folds them into open
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
from django.db.models import Func, IntegerField, QuerySet

from orchestrator.ledger import bound, keystate, value_sets
from orchestrator.ledger.coalesce import Prefix, tiles_the_slots
from orchestrator.ledger.groups import ClosedWindowError, stored
from orchestrator.models import MergedChunk, ResultGroup, Run, WindowKey
from orchestrator.sink.layout import KEYED, Layout
from orchestrator.sink.targets import ClosedRow, ResultTable, Sink, SinkError
from sparkjobs.event_time import WindowSpec
from sparkjobs.measures import Grouping, Value
from sparkjobs.merge import MergedKey

# Most merged chunk rows one call walks, so the driver's tick never waits long.
MAX_ROWS = 50_000
# Closed windows whose rows the ledger keeps when the sink writes them elsewhere.
KEEP_CLOSED = 10


class Cardinality(Func):
    """PostgreSQL's cardinality(): an array's size, without reading the array out."""

    function = "cardinality"
    output_field = IntegerField()


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


def fold(run_id: int, spec: WindowSpec, deltas: Sequence[MergedKey]) -> None:
    """Add a sink batch's per-(window, key) deltas to the open windows (inside the
    batch's transaction): one set-based statement per table."""
    if not deltas:
        return
    closed = SinkWatermark.of(Run.objects.only("windows_closed").get(pk=run_id)).closed_us
    if closed is not None:
        shut = sorted(
            {d.window for d in deltas if d.window is not None and d.window + spec.size_us <= closed}
        )
        if shut:
            raise ClosedWindowError(
                f"run {run_id}: data for windows already closed (starts {shut[:5]} us)"
            )
    starts = [_start(d) for d in deltas]
    # Each set travels as one text, split server-side (value_sets.py); then it unites
    # with the row's own set, each value once.
    sets = value_sets.pack([d.distinct for d in deltas])
    bound.execute(
        """
        WITH odd AS (
          SELECT i, array_agg(v) AS vals
          FROM unnest(%b::int[], %b::text[]) AS x(i, v) GROUP BY i)
        INSERT INTO orchestrator_windowkey
          (run_id, start_us, end_us, key, count, sum, min, max, "values")
        SELECT %b, d.start_us, d.start_us + %b, d.key, d.count, d.sum, d.min, d.max,
               COALESCE(string_to_array(d.vals, chr(31)) || odd.vals, '{}')
        FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::numeric[], %b::numeric[],
                    %b::numeric[], %b::text[]) WITH ORDINALITY
             AS d(start_us, key, count, sum, min, max, vals, n)
        LEFT JOIN odd ON odd.i = d.n
        ON CONFLICT (run_id, start_us, key) DO UPDATE SET
          count = orchestrator_windowkey.count + EXCLUDED.count,
          sum = orchestrator_windowkey.sum + EXCLUDED.sum,
          min = LEAST(orchestrator_windowkey.min, EXCLUDED.min),
          max = GREATEST(orchestrator_windowkey.max, EXCLUDED.max),
          "values" = CASE WHEN cardinality(EXCLUDED."values") = 0
            THEN orchestrator_windowkey."values"
            ELSE ARRAY(SELECT DISTINCT v
                       FROM unnest(orchestrator_windowkey."values" || EXCLUDED."values") AS v)
            END
        """,
        [
            sets.odd_sets,
            sets.odd_values,
            run_id,
            spec.size_us,
            starts,
            [d.key for d in deltas],
            [d.count for d in deltas],
            [d.sum for d in deltas],
            [d.min for d in deltas],
            [d.max for d in deltas],
            sets.texts,
        ],
    )


def _start(delta: MergedKey) -> int:
    if delta.window is None:
        raise ValueError(f"partial of key {delta.key!r} has no window in a windowed run")
    return delta.window


def advance(
    run_id: int,
    spec: WindowSpec,
    sink: Sink,
    *,
    grouping: Grouping | None = None,
    final: bool = False,
) -> int:
    """Move the sink's watermark over the chunks merged since, and close the windows it
    passed (``final``: the input ended, close them all), writing their rows in the
    sink's columns (a stage of grouped measures': by its ``grouping``). Returns how
    many rows were closed."""
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
        closing = _Groups(run_id, grouping, sink.layout) if grouping is not None else _Keys(run_id)
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


class _Closing:
    """A run's window rows (``all``), as one closing step reads and closes them."""

    all: QuerySet[WindowKey] | QuerySet[ResultGroup]

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


class _Keys(_Closing):
    """The windows of the key, value and distinct form (``WindowKey`` rows)."""

    all: QuerySet[WindowKey]

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.all = WindowKey.objects.filter(run_id=run_id)

    def rows(self, up_to: int | None, *, nothing: bool) -> list[tuple[ClosedRow, int]]:
        """The final rows of the windows ending by ``up_to`` (None: all), each with its
        distinct count."""
        pending = self.all.filter(closed_at__isnull=True)
        if nothing:
            return []
        if up_to is not None:
            pending = pending.filter(end_us__lte=up_to)
        found = pending.order_by("start_us", "key").values_list(
            "start_us",
            "end_us",
            "key",
            "count",
            "sum",
            "min",
            "max",
            "distinct",
            Cardinality("values"),
        )
        rows = []
        for start, end, key, count, total, low, high, kept, size in found:
            distinct = kept if kept is not None else size or 0
            avg = total / count if count else 0
            cells = KEYED.cells([key, count, total, low, high, avg, distinct])
            rows.append((ClosedRow(start, end, cells), distinct))
        return rows

    def close(self, rows: Sequence[tuple[ClosedRow, int]]) -> None:
        """Mark the rows closed, keeping each set's size and dropping the set: a closed
        window never changes, and a run that goes on for days must not keep every
        value it ever counted."""
        if not rows:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE orchestrator_windowkey k
                SET closed_at = now(), "distinct" = d.n, "values" = NULL
                FROM unnest(%s::bigint[], %s::text[], %s::bigint[]) AS d(start_us, key, n)
                WHERE k.run_id = %s AND k.start_us = d.start_us AND k.key = d.key
                """,
                [
                    [r.start_us for r, _ in rows],
                    [r.cells[0] for r, _ in rows],
                    [n for _, n in rows],
                    self.run_id,
                ],
            )


class _Groups(_Closing):
    """The windows of grouped measures (``ResultGroup`` rows with a window)."""

    all: QuerySet[ResultGroup]

    def __init__(self, run_id: int, grouping: Grouping, layout: Layout) -> None:
        self.run_id, self.grouping, self.layout = run_id, grouping, layout
        self.all = ResultGroup.objects.filter(run_id=run_id, start_us__isnull=False)
        self.values: dict[int, dict[str, Value]] = {}  # each closing row's measures

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


def distinct_of(row: WindowKey) -> int:
    """A window row's distinct count: kept on it once closed, else its set's size."""
    if row.distinct is not None:
        return row.distinct
    return len(row.values or [])


def _higher(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
