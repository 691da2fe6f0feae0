"""Completion and rollback (docs/spec/hot-rescale.md section 2 step 5, section 3.3 and
the policy's timeout), and what a rescale cost.

Owns: :func:`complete` (every tail reported: stateful stages fetch the keys of their new
group they lack and drop those they no longer own; new instances become active, removed
ones are retired and fenced), :func:`rollback` (the old graph again: data queued at new
instances goes back where the old graph sends it, state back to the old key groups,
markers dropped; nothing lost) and :func:`measure` (:class:`Outcome`: how long it took,
the sink's and every outside instance's longest pause meanwhile).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from orchestrator.ledger import keystate
from orchestrator.ledger.events import record_event
from orchestrator.models import Adjustment, Instance, MergedChunk, Run, Segment
from orchestrator.rescale.plan import key_groups, reroute, stage_members
from sparkjobs.catalog import keyed, operator_of
from sparkjobs.keygroups import KEY_SLOTS


@dataclass
class Outcome:
    seconds: float
    sink_max_gap_s: float
    outside_max_gap_s: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "sink_max_gap_s": round(self.sink_max_gap_s, 3),
            "outside_max_gap_s": {k: round(v, 3) for k, v in self.outside_max_gap_s.items()},
            "state": self.state,
        }


def complete(adjustment_id: int) -> Adjustment:
    """Every tail reported: finish the hand-off, retire removed instances, done."""
    now = timezone.now()
    with transaction.atomic():
        adjustment = Adjustment.objects.select_for_update().get(pk=adjustment_id)
        if adjustment.status != Adjustment.Status.RUNNING:
            return adjustment
        run_id, version = adjustment.run_id, adjustment.version
        # Closing windows drops their state under the run's lock: held here, the state
        # compared before and after the hand-off is the same state.
        Run.objects.select_for_update().get(pk=run_id)
        state: dict[str, Any] = {}
        for stage, hand in adjustment.plan["handoff"].items():
            before = keystate.totals(run_id, stage)
            fetched = sum(
                keystate.move(run_id, stage, source, target, slots)
                for source, target, slots in hand["fetches"]
            )
            after = keystate.totals(run_id, stage)
            misplaced = keystate.misplaced(run_id, stage, _owners(adjustment.after, stage))
            state[stage] = {
                "keys": len(after),
                "keys_fetched": fetched,
                "identical": before == after,
                "misplaced_keys": misplaced,
            }
        subgraph = adjustment.plan["subgraph"]
        Instance.objects.filter(run_id=run_id, name__in=subgraph).update(
            config=version, target=version
        )
        Instance.objects.filter(run_id=run_id, status=Instance.Status.JOINING).update(
            status=Instance.Status.ACTIVE
        )
        retired = sorted(
            Instance.objects.filter(run_id=run_id, status=Instance.Status.RETIRING).values_list(
                "name", flat=True
            )
        )
        Instance.objects.filter(run_id=run_id, name__in=retired).update(
            status=Instance.Status.RETIRED, worker=""
        )
        _hand_on_merged_state(run_id, adjustment.before, adjustment.after, retired)
        outcome = measure(adjustment, now)
        outcome.state = state
        adjustment.status = Adjustment.Status.COMPLETE
        adjustment.finished_at = now
        adjustment.outcome = outcome.to_json()
        adjustment.save(update_fields=["status", "finished_at", "outcome"])
        gap = outcome.sink_max_gap_s
        record_event(
            run_id,
            "adjust_complete",
            f"adjustment {version} ({adjustment.kind}) complete in {outcome.seconds:.2f} s"
            + f"; sink's longest pause {gap:.2f} s"
            + (f"; retired {', '.join(retired)}" if retired else "")
            + "".join(
                f"; {stage}: {s['keys']} keys, state {'identical' if s['identical'] else 'CHANGED'}"
                f", {s['keys_fetched']} fetched"
                for stage, s in state.items()
            ),
            data={"version": version, **adjustment.outcome, "retired": retired},
        )
    return adjustment


def _hand_on_merged_state(
    run_id: int, before: Mapping[str, Any], after: Mapping[str, Any], retired: Sequence[str]
) -> None:
    """A retired instance of a stateful stage keyed ``local_global`` held partial totals
    of the keys it saw (a key's state is the merge over its holders): they are merged
    into a member of ``after`` that stays, so that holders are live instances and their
    number stays bounded however often the stage is rescaled. Drained before an
    adjustment completes, or fenced before one rolls back, a retired instance folds
    nothing more. ``before`` is the graph the retired instances are in."""
    nodes = {n["name"]: n for n in before["nodes"]}
    for name in retired:
        node = nodes.get(name)
        if node is None or keyed(node) or not operator_of(node).stateful:
            continue
        stage = node.get("stage") or name
        staying = stage_members(after, stage)
        if staying:
            keystate.move(run_id, stage, name, staying[0], range(KEY_SLOTS))


def _owners(doc: Mapping[str, Any], stage: str) -> dict[int, str]:
    return {
        slot: member for member, group in key_groups(doc, stage).items() for slot in group.slots
    }


def rollback(adjustment_id: int, reason: str) -> Adjustment:
    """Back to the graph before the adjustment, with nothing lost."""
    now = timezone.now()
    with transaction.atomic():
        adjustment = Adjustment.objects.select_for_update().get(pk=adjustment_id)
        if adjustment.status != Adjustment.Status.RUNNING:
            return adjustment
        run = Run.objects.select_for_update().get(pk=adjustment.run_id)
        version, before = adjustment.version, adjustment.before
        added = adjustment.plan["added"]
        # New instances are fenced first: a late batch of theirs cannot complete.
        Instance.objects.filter(run=run, name__in=added).update(
            status=Instance.Status.RETIRED, worker="", config=version, target=version
        )
        Instance.objects.filter(run=run, name__in=adjustment.plan["subgraph"]).exclude(
            name__in=added
        ).update(status=Instance.Status.ACTIVE, config=version, target=version)
        Segment.objects.filter(run=run, marker=True, config=version).delete()
        moved = _requeue(run, before, added)
        _hand_on_merged_state(run.pk, adjustment.after, before, added)
        for stage in adjustment.plan["handoff"]:
            # A keyed stage's data sent with the new key groups must be split by the old
            # ones again, in flight included (its batch's completion is then refused).
            members = {*stage_members(before, stage), *stage_members(adjustment.after, stage)}
            moved += reroute(
                Segment.objects.filter(run=run, node__in=members, marker=False, config=version)
                .exclude(node__in=added)
                .exclude(state=Segment.State.DONE),
                before,
            )
            keystate.rehome(run.pk, stage, _owners(before, stage))
        run.topology = before
        run.save(update_fields=["topology"])
        adjustment.status = Adjustment.Status.ROLLED_BACK
        adjustment.finished_at = now
        adjustment.outcome = {
            **measure(adjustment, now).to_json(),
            "reason": reason,
            "requeued_segments": moved,
        }
        adjustment.save(update_fields=["status", "finished_at", "outcome"])
        record_event(
            run.pk,
            "adjust_rolled_back",
            f"adjustment {version} ({adjustment.kind}) rolled back: {reason}; "
            f"{moved} segment(s) sent with the new graph went back to the old instances",
            data={"version": version, **adjustment.outcome},
        )
    return adjustment


def _requeue(run: Run, before: Mapping[str, Any], added: Sequence[str]) -> int:
    """Send data waiting at (or held by) new instances where the old graph sends it."""
    return reroute(
        Segment.objects.filter(run=run, node__in=added, marker=False).exclude(
            state=Segment.State.DONE
        ),
        before,
    )


def measure(adjustment: Adjustment, until: dt.datetime) -> Outcome:
    """How long the adjustment took; the sink's longest pause between merges and each
    instance outside the subgraph's longest pause between batches, meanwhile (an
    instance that did nothing paused for the whole adjustment)."""
    start = adjustment.started_at
    run_id = adjustment.run_id
    merges = list(
        MergedChunk.objects.filter(run_id=run_id, merged_at__gte=start, merged_at__lte=until)
        .order_by("merged_at")
        .values_list("merged_at", flat=True)
    )
    last_before = MergedChunk.objects.filter(run_id=run_id, merged_at__lt=start).aggregate(
        last=Max("merged_at")
    )["last"]
    # From the last merge before the adjustment to its end: a sink that merged nothing
    # meanwhile paused for all of it.
    sink_gap = _max_gap([last_before or start, *merges, until])
    inside = set(adjustment.plan["subgraph"])
    outside_nodes = [
        n["name"]
        for n in adjustment.after["nodes"]
        if n["kind"] != "source" and n["name"] not in inside
    ]
    by_node: dict[str, list[dt.datetime]] = {name: [start, until] for name in outside_nodes}
    done = Segment.objects.filter(
        run_id=run_id,
        marker=False,
        node__in=outside_nodes,
        done_at__gte=start,
        done_at__lte=until,
    ).values_list("node", "done_at")
    for node, at in done:
        if at is not None:  # never None after the range lookups; done_at is nullable
            by_node[node].append(at)
    outside = {node: _max_gap(times) for node, times in by_node.items()}
    return Outcome((until - start).total_seconds(), sink_gap, outside)


def _max_gap(times: Sequence[dt.datetime]) -> float:
    ordered = sorted(times)
    return max(((b - a).total_seconds() for a, b in itertools.pairwise(ordered)), default=0.0)
