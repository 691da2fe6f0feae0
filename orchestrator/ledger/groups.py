"""A stage of grouped measures' result (sparkjobs/measures.py): each sink batch's
partials folded into the run's groups, and the groups read as rows.

A group's row holds each measure's partial state; a batch's partial of a new group is
inserted, one of a known group merged into it under the row's lock, in the sink
batch's transaction (the one that records its chunks: nothing is folded twice). Over
event-time windows a row is a (window, group), and a batch with data for a window the
sink already closed is refused (orchestrator/ledger/windows.py closes them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from decimal import Decimal

from orchestrator.ledger import bound
from orchestrator.models import ResultGroup, Run
from sparkjobs.event_time import WindowSpec, iso
from sparkjobs.measures import DECIMAL_VALUED, Grouping, State, Value
from sparkjobs.merge import GroupPartial, group_order

# A row of a grouped result as the API and the run page show it: over windows, its
# window's start and end (ISO-8601, UTC); each group field's value (text, or None),
# then each measure's (a count, or a number; None where SQL has NULL: a sum, minimum,
# maximum or average of no value).
GroupRow = dict[str, str | int | float | None]
WINDOW_COLUMNS = ("window_start", "window_end")


class ClosedWindowError(RuntimeError):
    """A partial for a window that was closed: a late record was not caught upstream."""


def digest(group: Sequence[str | None], window: int | None = None) -> str:
    at = list(group) if window is None else [window, list(group)]
    return hashlib.sha256(json.dumps(at).encode()).hexdigest()


def fold(
    run_id: int,
    grouping: Grouping,
    partials: Sequence[GroupPartial],
    *,
    windows: WindowSpec | None = None,
    closed_us: int | None = None,
) -> None:
    """Fold a batch's partials into the run's groups; the caller's transaction. Over
    ``windows``, each partial's window must still be open (its end after
    ``closed_us``, where the sink's watermark closed windows up to)."""
    if not partials:
        return
    if windows is not None:
        starts = {p.window for p in partials}
        if None in starts:
            raise ValueError(f"run {run_id}: a partial without a window in a windowed run")
        shut = sorted(
            w
            for w in starts
            if w is not None and closed_us is not None and w + windows.size_us <= closed_us
        )
        if shut:
            raise ClosedWindowError(
                f"run {run_id}: data for windows already closed (starts {shut[:5]} us)"
            )
    by_digest = {digest(p.group, p.window): p for p in partials}
    # The known groups' rows, locked; a partial of a new group is inserted as it is.
    rows = _locked(run_id, list(by_digest))
    new = [d for d in by_digest if d not in rows]
    if new:
        size = 0 if windows is None else windows.size_us
        inserted = {
            str(found[0])
            for found in bound.fetch(
                """
                INSERT INTO orchestrator_resultgroup
                  (run_id, digest, "group", states, records, start_us, end_us)
                SELECT %b, x.d, x.g::jsonb, x.s::jsonb, x.n, x.w, x.w + %b
                FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[])
                  AS x(d, g, s, n, w)
                ON CONFLICT (run_id, digest) DO NOTHING
                RETURNING digest
                """,
                [
                    run_id,
                    size,
                    new,
                    [json.dumps(list(by_digest[d].group)) for d in new],
                    [json.dumps(by_digest[d].states) for d in new],
                    [by_digest[d].records for d in new],
                    [by_digest[d].window for d in new],
                ],
            )
        }
        # A group another sink batch inserted meanwhile merges as a known one.
        raced = [d for d in new if d not in inserted]
        if raced:
            rows.update(_locked(run_id, raced))
    if not rows:
        return
    merged = {
        d: (grouping.merge(states, by_digest[d].states), records + by_digest[d].records)
        for d, (states, records) in rows.items()
    }
    bound.execute(
        """
        UPDATE orchestrator_resultgroup AS r SET states = u.s::jsonb, records = u.n
        FROM unnest(%b::text[], %b::text[], %b::bigint[]) AS u(d, s, n)
        WHERE r.run_id = %b AND r.digest = u.d
        """,
        [
            list(merged),
            [json.dumps(states) for states, _ in merged.values()],
            [records for _, records in merged.values()],
            run_id,
        ],
    )


def _locked(run_id: int, digests: list[str]) -> dict[str, tuple[dict[str, State], int]]:
    """The states and records of the run's groups among ``digests`` that exist, their
    rows locked (in digest order, as every sink batch locks them) until the caller's
    transaction ends."""
    found = (
        ResultGroup.objects.select_for_update()
        .filter(run_id=run_id, digest__in=digests)
        .order_by("digest")
        .values_list("digest", "states", "records")
    )
    return {d: (states, records) for d, states, records in found}


def group_rows(
    run: Run, grouping: Grouping, limit: int | None = None, *, windowed: bool = False
) -> list[GroupRow]:
    """The run's groups as rows, in (window and) group order; with ``limit``, at most
    that many: the latest windows' first, in each those with the most records first."""
    groups = ResultGroup.objects.filter(run=run)
    if limit is not None:
        latest = ("-start_us",) if windowed else ()
        groups = groups.order_by(*latest, "-records", "digest")[: max(0, limit)]
    found = list(groups.values_list("start_us", "end_us", "group", "states", "finished"))
    if limit is None:
        found.sort(key=lambda r: (r[0] or 0, group_order(tuple(r[2]))))
    rows = []
    for start, end, group, states, finished in found:
        values = grouping.finish(states) if finished is None else restored(grouping, finished)
        row = shown_row(grouping, group, values)
        if windowed and start is not None and end is not None:
            row = {"window_start": iso(start), "window_end": iso(end), **row}
        rows.append(row)
    return rows


def shown_row(
    grouping: Grouping, group: Sequence[str | None], values: dict[str, Value]
) -> GroupRow:
    """A group's values and its measures' as a result row shows them."""
    row: GroupRow = dict(zip(grouping.group_by, group, strict=True))
    for name, value in values.items():
        row[name] = float(value) if isinstance(value, Decimal) else value
    return row


def stored(values: dict[str, Value]) -> dict[str, str | int | float | None]:
    """Finished measures as JSON keeps them exactly (a decimal as its text)."""
    return {name: str(v) if isinstance(v, Decimal) else v for name, v in values.items()}


def restored(grouping: Grouping, kept: dict[str, str | int | float | None]) -> dict[str, Value]:
    """:func:`stored`'s measures back, each of its own type."""
    values: dict[str, Value] = {}
    for m in grouping.measures:
        v = kept[m.name]
        values[m.name] = Decimal(v) if isinstance(v, str) and m.fn in DECIMAL_VALUED else v
    return values
