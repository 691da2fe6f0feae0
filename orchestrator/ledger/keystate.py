"""State of stateful (keyed) instances, per key (and event-time window), in PostgreSQL.

A stateful instance folds each batch into the running totals of its keys in the same
transaction that marks the batch done, so its state is exactly-once like the data. The
totals are mergeable (count and sum add, min and max fold): handing state over is
merging rows into the new holder and deleting them at the old one, in one statement
pair, never a copy that could be applied twice. A windowed pipeline's state is per (key,
window) and a window's state is dropped once the sink closes the window: no record can
reach a closed window any more (it would be late), and a run that goes on for days must
not keep every window it ever saw.

A key's state is the merge of its rows over holders. In a stage keyed by key groups
each key has one holder, its group's owner, once a hand-off completes; in a stage keyed
``local_global`` any instance folds any key it sees into a row of its own, and a
retired instance's rows are merged into a member that stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from django.db import connection

from orchestrator.models import KeyState
from sparkjobs.keygroups import slot_of

# Merging into a holder's row is how state is both folded and handed over.
_FOLD = """
    INSERT INTO orchestrator_keystate
      (run_id, stage, holder, key, window_us, slot, count, sum, min, max)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (run_id, stage, holder, key, window_us) DO UPDATE SET
      count = orchestrator_keystate.count + EXCLUDED.count,
      sum = orchestrator_keystate.sum + EXCLUDED.sum,
      min = LEAST(orchestrator_keystate.min, EXCLUDED.min),
      max = GREATEST(orchestrator_keystate.max, EXCLUDED.max)
"""
_MOVE = """
    INSERT INTO orchestrator_keystate
      (run_id, stage, holder, key, window_us, slot, count, sum, min, max)
    SELECT run_id, stage, %s, key, window_us, slot, count, sum, min, max
    FROM orchestrator_keystate
    WHERE run_id = %s AND stage = %s AND holder = %s AND slot = ANY(%s)
    ON CONFLICT (run_id, stage, holder, key, window_us) DO UPDATE SET
      count = orchestrator_keystate.count + EXCLUDED.count,
      sum = orchestrator_keystate.sum + EXCLUDED.sum,
      min = LEAST(orchestrator_keystate.min, EXCLUDED.min),
      max = GREATEST(orchestrator_keystate.max, EXCLUDED.max)
"""


class StateKey(NamedTuple):
    """Whose state a row is: a key, in an event-time window (None: over all time)."""

    key: str
    window_us: int | None = None


@dataclass(frozen=True)
class Totals:
    count: int
    sum: Decimal
    min: Decimal
    max: Decimal


def fold(run_id: int, stage: str, holder: str, deltas: Iterable[tuple[StateKey, Totals]]) -> None:
    """Add a batch's per-key totals to ``holder``'s state (inside the batch's transaction)."""
    rows = [
        (run_id, stage, holder, k.key, k.window_us, slot_of(k.key), t.count, t.sum, t.min, t.max)
        for k, t in deltas
    ]
    if not rows:
        return
    with connection.cursor() as cursor:
        cursor.executemany(_FOLD, rows)


def move(run_id: int, stage: str, source: str, target: str, slots: Iterable[int]) -> int:
    """Move ``source``'s state of the keys in ``slots`` to ``target``, merging with what
    ``target`` already holds of them. Returns the number of keys moved."""
    wanted = sorted(set(slots))
    if source == target or not wanted:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_MOVE, [target, run_id, stage, source, wanted])
        cursor.execute(
            "DELETE FROM orchestrator_keystate"
            " WHERE run_id = %s AND stage = %s AND holder = %s AND slot = ANY(%s)",
            [run_id, stage, source, wanted],
        )
        # The wrapper passes attributes through to the DB-API cursor, so the stubs see Any.
        moved: int = cursor.rowcount
        return moved


def rehome(run_id: int, stage: str, owners: Mapping[int, str]) -> int:
    """Move every key's state to the owner of its slot (``slot -> instance``)."""
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


def forget_closed(run_id: int, size_us: int, closed_us: int) -> int:
    """Drop every stage's state of the windows ending by ``closed_us`` (the sink's
    closing watermark). Returns the number of rows dropped."""
    dropped, _ = KeyState.objects.filter(run_id=run_id, window_us__lte=closed_us - size_us).delete()
    return dropped


def totals(run_id: int, stage: str) -> dict[StateKey, Totals]:
    """Every key's state combined over its holders: what a hand-off must preserve."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, window_us, SUM(count), SUM(sum), MIN(min), MAX(max)"
            " FROM orchestrator_keystate WHERE run_id = %s AND stage = %s"
            " GROUP BY key, window_us",
            [run_id, stage],
        )
        return {
            StateKey(key, window): Totals(int(count), Decimal(s), Decimal(lo), Decimal(hi))
            for key, window, count, s, lo, hi in cursor.fetchall()
        }


@dataclass(frozen=True)
class Progress:
    """A keyed stage's state and progress at one moment (one snapshot of the ledger)."""

    records: dict[tuple[str, int], int]  # (holder, key slot) -> records in its state
    done_bytes: dict[str, int]  # member -> input bytes of its done segments


_PROGRESS = """
    SELECT 'r', holder, slot, SUM(count) FROM orchestrator_keystate
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
    """Who holds each key's state (exactly one holder after a completed hand-off)."""
    result: dict[StateKey, list[str]] = {}
    for key, window, holder in (
        KeyState.objects.filter(run_id=run_id, stage=stage)
        .order_by("key", "window_us", "holder")
        .values_list("key", "window_us", "holder")
    ):
        result.setdefault(StateKey(key, window), []).append(holder)
    return result
