"""A stage of grouped measures' result (sparkjobs/measures.py): each sink batch's
partials folded into the run's groups, and the groups read as rows.

A group's row holds each measure's partial state; a batch's partial of a new group is
inserted, one of a known group merged into it under the row's lock, in the sink
batch's transaction (the one that records its chunks: nothing is folded twice).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from decimal import Decimal

from django.db import connection
from django.db.models import BigIntegerField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from orchestrator.models import ResultGroup, Run
from sparkjobs.measures import Grouping, Value
from sparkjobs.merge import GroupPartial, group_order

# A row of a grouped result as the API and the run page show it: each group field's
# value (text, or None), then each measure's (a count, or a number; None where SQL has
# NULL: a sum, minimum, maximum or average of no value).
GroupRow = dict[str, str | int | float | None]


def digest(group: Sequence[str | None]) -> str:
    return hashlib.sha256(json.dumps(list(group)).encode()).hexdigest()


def fold(run_id: int, grouping: Grouping, partials: Sequence[GroupPartial]) -> None:
    """Fold a batch's partials into the run's groups; the caller's transaction."""
    if not partials:
        return
    by_digest = {digest(p.group): p for p in partials}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO orchestrator_resultgroup (run_id, digest, "group", states)
            SELECT %s, x.d, x.g::jsonb, x.s::jsonb
            FROM unnest(%s::text[], %s::text[], %s::text[]) AS x(d, g, s)
            ON CONFLICT (run_id, digest) DO NOTHING
            RETURNING digest
            """,
            [
                run_id,
                list(by_digest),
                [json.dumps(list(p.group)) for p in by_digest.values()],
                [json.dumps(p.states) for p in by_digest.values()],
            ],
        )
        inserted = {row[0] for row in cursor.fetchall()}
    known = [d for d in by_digest if d not in inserted]
    if not known:
        return
    rows = list(
        ResultGroup.objects.select_for_update()
        .filter(run_id=run_id, digest__in=known)
        .order_by("digest")
    )
    for row in rows:
        row.states = grouping.merge(row.states, by_digest[row.digest].states)
    ResultGroup.objects.bulk_update(rows, ["states"], batch_size=1000)


def group_rows(run: Run, grouping: Grouping, limit: int | None = None) -> list[GroupRow]:
    """The run's groups as rows, in group order; with ``limit``, at most that many, those
    with the most records first (by the first count measure, when there is one)."""
    groups = ResultGroup.objects.filter(run=run)
    counted = next((m.name for m in grouping.measures if m.fn == "count"), None)
    if limit is not None:
        if counted is not None:
            most = Cast(KT(f"states__{counted}"), BigIntegerField())
            groups = groups.annotate(records=most).order_by("-records", "digest")
        groups = groups[: max(0, limit)]
    rows = [(tuple(g), s) for g, s in groups.values_list("group", "states")]
    if limit is None:
        rows.sort(key=lambda row: group_order(row[0]))
    return [shown_row(grouping, group, grouping.finish(states)) for group, states in rows]


def shown_row(
    grouping: Grouping, group: Sequence[str | None], values: dict[str, Value]
) -> GroupRow:
    """A group's values and its measures' as a result row shows them."""
    row: GroupRow = dict(zip(grouping.group_by, group, strict=True))
    for name, value in values.items():
        row[name] = float(value) if isinstance(value, Decimal) else value
    return row
