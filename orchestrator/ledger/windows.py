"""Event-time windows at the sink: open while data may still come, closed once.

A windowed pipeline's partials are per (window, key). The sink folds them into open
windows in the transaction that records their chunks as merged (as for all-time
results). A window is *final* when the sink's watermark passes its end: the chunks
``0 .. n-1`` are all merged and the largest event time among them, minus the allowed
lateness, is at or past the window's end. Every later chunk was read under a watermark
at least that high, so its records for that window were found late by the operators
and never reach the sink: nothing can change a closed window. Closing marks its rows in
one statement, once; an input that ends closes every window (its watermark is +inf).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Func, IntegerField, QuerySet

from orchestrator.ledger import bound, keystate, value_sets
from orchestrator.ledger.coalesce import Prefix, tiles_the_slots
from orchestrator.models import MergedChunk, Run, WindowKey
from orchestrator.sink.targets import ClosedRow, ResultTable, Sink
from sparkjobs.event_time import WindowSpec
from sparkjobs.merge import MergedKey

# Most merged chunk rows one call walks, so the driver's tick never waits long.
MAX_ROWS = 50_000
# Closed windows whose rows the ledger keeps when the sink writes them elsewhere.
KEEP_CLOSED = 10


class Cardinality(Func):
    """PostgreSQL's cardinality(): an array's size, without reading the array out."""

    function = "cardinality"
    output_field = IntegerField()


class ClosedWindowError(RuntimeError):
    """A delta for a window that was closed: a late record was not caught upstream."""


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


def advance(run_id: int, spec: WindowSpec, sink: Sink, *, final: bool = False) -> int:
    """Move the sink's watermark over the chunks merged since, and close the windows it
    passed (``final``: the input ended, close them all). Returns how many (window, key)
    rows were closed."""
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
        pending = WindowKey.objects.filter(run_id=run_id, closed_at__isnull=True)
        if not final:
            pending = pending.none() if closed is None else pending.filter(end_us__lte=closed)
        rows = closing_rows(run_id, pending)
        # The target is written first: in this transaction when it shares the ledger's
        # database, else committed before it (an upsert, so a crash between the two
        # writes the same rows again).
        sink.write(run_id, rows)
        _close(run_id, rows)
        if final:
            last_end = WindowKey.objects.filter(run_id=run_id).order_by("-end_us").first()
            closed = _higher(closed, last_end.end_us if last_end else None)
        if not isinstance(sink, ResultTable):
            _forget_written(run_id)
        if closed is not None:
            keystate.forget_closed(run_id, spec.size_us, closed)
        Run.objects.filter(pk=run_id).update(
            windows_closed=SinkWatermark(
                chunk, high, closed, mark.windows + len({r.start_us for r in rows})
            ).to_json()
        )
        return len(rows)


def _close(run_id: int, rows: Sequence[ClosedRow]) -> None:
    """Mark the rows closed, keeping each set's size and dropping the set: a closed
    window never changes, and a run that goes on for days must not keep every value
    it ever counted."""
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
            [[r.start_us for r in rows], [r.key for r in rows], [r.distinct for r in rows], run_id],
        )


def _forget_written(run_id: int) -> None:
    """A sink elsewhere holds the closed windows: the ledger keeps only the latest
    ``KEEP_CLOSED`` of them, for the run page."""
    starts = (
        WindowKey.objects.filter(run_id=run_id, closed_at__isnull=False)
        .values_list("start_us", flat=True)
        .distinct()
        .order_by("-start_us")
    )
    oldest_kept = list(starts[:KEEP_CLOSED])
    if len(oldest_kept) == KEEP_CLOSED:
        WindowKey.objects.filter(
            run_id=run_id, closed_at__isnull=False, start_us__lt=oldest_kept[-1]
        ).delete()


def closing_rows(run_id: int, pending: QuerySet[WindowKey]) -> list[ClosedRow]:
    """The final rows of the windows about to close, with their distinct counts."""
    rows = pending.order_by("start_us", "key").values_list(
        "start_us", "end_us", "key", "count", "sum", "min", "max", "distinct", Cardinality("values")
    )
    return [
        ClosedRow(start, end, key, count, total, low, high, kept if kept is not None else size or 0)
        for start, end, key, count, total, low, high, kept, size in rows
    ]


def distinct_of(row: WindowKey) -> int:
    """A window row's distinct count: kept on it once closed, else its set's size."""
    if row.distinct is not None:
        return row.distinct
    return len(row.values or [])


def _higher(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
