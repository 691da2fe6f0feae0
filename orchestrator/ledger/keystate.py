"""State of stateful (keyed) instances, per group (and event-time window), in PostgreSQL.

A stateful instance folds each batch into the state of its groups in the same
transaction that marks the batch done, so its state is exactly-once like the data. A
group's state is each of the stage's measures as its partial state
(sparkjobs/measures.py). Partial states merge exactly, so handing
state over is deleting rows at the old holder and merging them into the new one, in
one transaction, never a copy that could be applied twice. A windowed pipeline's state
is per (group, window) and a window's state is dropped once the sink closes the window:
no record can reach a closed window any more (it would be late), and a run that goes on
for days must not keep every window it ever saw.

A group's state is the merge of its rows over holders. In a stage keyed by key groups
each group has one holder, its key group's owner, once a hand-off completes; in a stage
keyed ``local_global`` any instance folds any group it sees into a row of its own, and a
retired instance's rows are merged into a member that stays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from django.db import connection, transaction

from orchestrator.ledger import bound
from orchestrator.ledger.groups import digest
from orchestrator.models import KeyState, Run
from sparkjobs.keygroups import group_slot
from sparkjobs.measures import Grouping, State
from sparkjobs.merge import GroupPartial


class StateKey(NamedTuple):
    """Whose state a row is: a key (of grouped measures, the digest of the group's
    values), in an event-time window (None: over all time)."""

    key: str
    window_us: int | None = None


@dataclass(frozen=True)
class Kept:
    """A group's state: each measure's partial state by name, and the records in it."""

    states: dict[str, State]
    records: int


@dataclass(frozen=True)
class Delta:
    """A batch's partial of one group, to fold into its holder's state."""

    key: StateKey
    slot: int
    kept: Kept


def state_grouping(params: Mapping[str, Any]) -> Grouping:
    """The measures a stateful stage's state keeps: its grouped measures (the key
    form's as sparkjobs/key_form.py reads it)."""
    grouping = Grouping.of(params)
    if grouping is None:
        raise ValueError("a stateful stage's parameters name no valid grouping")
    return grouping


def group_deltas(partials: Iterable[GroupPartial]) -> list[Delta]:
    """A batch of grouped measures' partials as state."""
    return [
        Delta(StateKey(digest(p.group), p.window), group_slot(p.group), Kept(p.states, p.records))
        for p in partials
    ]


def fold(run_id: int, stage: str, holder: str, grouping: Grouping, deltas: Sequence[Delta]) -> None:
    """Merge a batch's partials into ``holder``'s state, in the caller's transaction. A
    row another transaction inserts meanwhile is merged into, as a known one."""
    combined: dict[StateKey, Delta] = {}
    for d in deltas:
        have = combined.get(d.key)
        combined[d.key] = (
            d if have is None else Delta(d.key, d.slot, _merged(grouping, have.kept, d.kept))
        )
    if not combined:
        return
    keys = sorted(combined, key=_order)
    held = _locked(run_id, stage, holder, keys)
    new = [k for k in keys if k not in held]
    if new:
        inserted = {
            StateKey(cast("str", key), cast("int | None", window))
            for key, window in bound.fetch(
                """
                INSERT INTO orchestrator_keystate
                  (run_id, stage, holder, key, window_us, slot, states, records)
                SELECT %b, %b, %b, x.k, x.w, x.slot, x.s::jsonb, x.n
                FROM unnest(%b::text[], %b::bigint[], %b::int[], %b::text[], %b::bigint[])
                  AS x(k, w, slot, s, n)
                ON CONFLICT (run_id, stage, holder, key, window_us) DO NOTHING
                RETURNING key, window_us
                """,
                [
                    run_id,
                    stage,
                    holder,
                    [k.key for k in new],
                    [k.window_us for k in new],
                    [combined[k].slot for k in new],
                    [json.dumps(combined[k].kept.states) for k in new],
                    [combined[k].kept.records for k in new],
                ],
            )
        }
        raced = [k for k in new if k not in inserted]
        if raced:
            held.update(_locked(run_id, stage, holder, raced))
    if not held:
        return
    merged = {k: _merged(grouping, kept, combined[k].kept) for k, kept in held.items()}
    bound.execute(
        """
        UPDATE orchestrator_keystate AS r SET states = u.s::jsonb, records = u.n
        FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::bigint[]) AS u(k, w, s, n)
        WHERE r.run_id = %b AND r.stage = %b AND r.holder = %b AND r.key = u.k
          AND r.window_us IS NOT DISTINCT FROM u.w
        """,
        [
            [k.key for k in merged],
            [k.window_us for k in merged],
            [json.dumps(m.states) for m in merged.values()],
            [m.records for m in merged.values()],
            run_id,
            stage,
            holder,
        ],
    )


def _merged(grouping: Grouping, a: Kept, b: Kept) -> Kept:
    return Kept(grouping.merge(a.states, b.states), a.records + b.records)


def _order(key: StateKey) -> tuple[str, bool, int]:
    return key.key, key.window_us is not None, key.window_us or 0


def _locked(run_id: int, stage: str, holder: str, keys: Sequence[StateKey]) -> dict[StateKey, Kept]:
    """``holder``'s state of ``keys`` that exists, its rows locked (in key order, as
    every fold locks them) until the caller's transaction ends."""
    wanted = set(keys)
    found = (
        KeyState.objects.select_for_update()
        .filter(run_id=run_id, stage=stage, holder=holder, key__in=sorted({k.key for k in keys}))
        .order_by("key", "window_us")
        .values_list("key", "window_us", "states", "records")
    )
    held = {StateKey(k, w): Kept(states, records) for k, w, states, records in found}
    return {k: kept for k, kept in held.items() if k in wanted}


def _stage_grouping(run_id: int, stage: str) -> Grouping:
    """The measures ``stage``'s state keeps, from the run's graph."""
    topology = Run.objects.values_list("topology", flat=True).get(pk=run_id)
    for node in topology["nodes"]:
        if (node.get("stage") or node["name"]) == stage:
            return state_grouping(node.get("params") or {})
    raise ValueError(f"run {run_id} has no stage {stage!r}")


def move(run_id: int, stage: str, source: str, target: str, slots: Iterable[int]) -> int:
    """Move ``source``'s state of the groups in ``slots`` to ``target``, merging with
    what ``target`` already holds of them. Returns the number of groups moved."""
    wanted = sorted(set(slots))
    if source == target or not wanted:
        return 0
    with transaction.atomic():
        taken = bound.fetch(
            """
            DELETE FROM orchestrator_keystate
            WHERE run_id = %b AND stage = %b AND holder = %b AND slot = ANY(%b::int[])
            RETURNING key, window_us, slot, states::text, records
            """,
            [run_id, stage, source, wanted],
        )
        if taken:
            deltas = [
                Delta(
                    StateKey(cast("str", k), cast("int | None", w)),
                    cast("int", slot),
                    Kept(json.loads(cast("str", states)), cast("int", n)),
                )
                for k, w, slot, states, n in taken
            ]
            fold(run_id, stage, target, _stage_grouping(run_id, stage), deltas)
    return len(taken)


def rehome(run_id: int, stage: str, owners: Mapping[int, str]) -> int:
    """Move every group's state to the owner of its slot (``slot -> instance``)."""
    moved = 0
    holders = (
        KeyState.objects.filter(run_id=run_id, stage=stage).values_list("holder", "slot").distinct()
    )
    by_move: dict[tuple[str, str], set[int]] = {}
    for holder, slot in holders:
        if owners[slot] != holder:
            by_move.setdefault((holder, owners[slot]), set()).add(slot)
    for (source, target), slots in sorted(by_move.items()):
        moved += move(run_id, stage, source, target, slots)
    return moved


def misplaced(run_id: int, stage: str, owners: Mapping[int, str], limit: int = 20) -> list[str]:
    """The first ``limit`` keys whose state is held by another instance than their
    slot's owner (``slot -> instance``): none once a hand-off has completed."""
    slots = sorted(owners)
    return [
        str(key)
        for (key,) in bound.fetch(
            """
            SELECT DISTINCT k.key FROM orchestrator_keystate AS k
            JOIN unnest(%b::int[], %b::text[]) AS o(slot, owner) ON k.slot = o.slot
            WHERE k.run_id = %b AND k.stage = %b AND k.holder <> o.owner
            ORDER BY k.key LIMIT %b
            """,
            [slots, [owners[s] for s in slots], run_id, stage, limit],
        )
    ]


def forget_closed(run_id: int, size_us: int, closed_us: int) -> int:
    """Drop every stage's state of the windows ending by ``closed_us`` (the sink's
    closing watermark). Returns the number of rows dropped."""
    dropped, _ = KeyState.objects.filter(run_id=run_id, window_us__lte=closed_us - size_us).delete()
    return dropped


def totals(run_id: int, stage: str) -> dict[StateKey, Kept]:
    """Every group's state merged over its holders: what a hand-off must preserve."""
    rows = list(
        KeyState.objects.filter(run_id=run_id, stage=stage)
        .order_by("key", "window_us", "holder")
        .values_list("key", "window_us", "states", "records")
    )
    if not rows:
        return {}
    grouping = _stage_grouping(run_id, stage)
    merged: dict[StateKey, Kept] = {}
    for key, window, states, records in rows:
        at, kept = StateKey(key, window), Kept(states, records)
        have = merged.get(at)
        merged[at] = kept if have is None else _merged(grouping, have, kept)
    return merged


@dataclass(frozen=True)
class Progress:
    """A keyed stage's state and progress at one moment (one snapshot of the ledger)."""

    records: dict[tuple[str, int], int]  # (holder, key slot) -> records in its state
    done_bytes: dict[str, int]  # member -> input bytes of its done segments


_PROGRESS = """
    SELECT 'r', holder, slot, SUM(records) FROM orchestrator_keystate
    WHERE run_id = %s AND stage = %s GROUP BY holder, slot
    UNION ALL
    SELECT 'd', node, 0, SUM(bytes) FROM orchestrator_segment
    WHERE run_id = %s AND node = ANY(%s) AND state = 'done' AND NOT marker
    GROUP BY node
"""


def progress(run_id: int, stage: str, members: list[str]) -> Progress:
    """How many records the stage's state holds per holder and key slot (of the windows
    still open, for a windowed pipeline) and the input bytes of each member's done
    segments, in one statement: a batch folds its records and marks its segments done
    in one transaction, so both count the same batches. What a key-group move weighs
    slots by."""
    records: dict[tuple[str, int], int] = {}
    done: dict[str, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(_PROGRESS, [run_id, stage, run_id, members])
        for what, name, slot, value in cursor.fetchall():
            if what == "r":
                records[(name, slot)] = int(value or 0)
            else:
                done[name] = int(value or 0)
    return Progress(records, done)


def holders(run_id: int, stage: str) -> dict[StateKey, list[str]]:
    """Who holds each group's state (exactly one holder after a completed hand-off)."""
    result: dict[StateKey, list[str]] = {}
    for key, window, holder in (
        KeyState.objects.filter(run_id=run_id, stage=stage)
        .order_by("key", "window_us", "holder")
        .values_list("key", "window_us", "holder")
    ):
        result.setdefault(StateKey(key, window), []).append(holder)
    return result
