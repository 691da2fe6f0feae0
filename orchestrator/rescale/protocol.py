"""Hot migration and rescale on the segment ledger (shared/spec/hot-rescale.md, ADR 4).

The ledger side of an adjustment, each step one PostgreSQL transaction:

- ``begin``: plan the subgraph (``balancer.rescale``), store the graph-state updates on
  the instances (what markers each waits for, where it forwards them), switch the run to
  the new graph version, and inject the markers at the subgraph's sources.
- ``try_align``: called by a node's claim. Once the node holds the marker of every
  upstream connection and no data from before those markers is left, it applies its
  adjustment (its routing becomes the new graph's; a stateful instance hands its state
  to the owner of its best-matching new key group), forwards the marker downstream and,
  if it is a tail, reports.
- ``complete``: every tail reported; stateful stages fetch missing keys and drop keys no
  longer owned; new instances become active and removed ones retired (fenced).
- ``rollback``: the old graph again; data queued at new instances goes back where the
  old graph sends it; state goes back to the old key groups; markers are dropped.

Data carries the graph version its sender routed it with (``Segment.config``); a node
that is aligning claims only data from before the adjustment, so a batch never mixes
the two sides of a marker.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from balancer.rescale import AdjustmentPlan, even_key_groups, plan_adjustment, plan_handoff
from orchestrator.ledger import keystate, segments
from orchestrator.models import Adjustment, Event, Instance, MergedChunk, Run, Segment
from orchestrator.pipeline.graph import balancer_topology, downstreams_of
from orchestrator.pipeline.routes import Routes, route
from sparkjobs.catalog import OPERATORS
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup, slot_of

CONTROL = "control"  # the upstream name of a marker injected by the control side


class AdjustmentError(ValueError):
    """An adjustment cannot be made as asked; nothing was changed."""


@dataclass(frozen=True)
class NewInstance:
    name: str
    stage: str
    worker: str = ""


@dataclass(frozen=True)
class Change:
    kind: str
    added: tuple[NewInstance, ...] = ()
    removed: tuple[str, ...] = ()
    reason: str = ""
    actor: str = Event.Actor.USER
    user: Any = None


@dataclass(frozen=True)
class Aligned:
    """An instance applied its adjustment while claiming."""

    instance: str
    version: int
    tail: bool
    forwarded: tuple[str, ...]
    retired: bool = False


# -- graph documents ------------------------------------------------------------------


def _nodes(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def stage_of(doc: Mapping[str, Any], name: str) -> str:
    node = _nodes(doc)[name]
    return node.get("stage") or name


def stage_members(doc: Mapping[str, Any], stage: str) -> list[str]:
    return [n["name"] for n in doc["nodes"] if (n.get("stage") or n["name"]) == stage]


def is_keyed(doc: Mapping[str, Any], name: str) -> bool:
    node = _nodes(doc)[name]
    operator = node.get("operator") or ""
    return operator in OPERATORS and OPERATORS[operator].stateful


def key_groups(doc: Mapping[str, Any], stage: str) -> dict[str, KeyGroup]:
    """Each member's key group: even slot ranges in the stage's declaration order."""
    members = stage_members(doc, stage)
    return {m: KeyGroup.even(i, len(members)) for i, m in enumerate(members)}


def topology_at(run: Run, config: int, node: str) -> dict[str, Any]:
    """The graph ``node``, aligned with version ``config``, routes with: the graph
    before the next adjustment, unless the node exists only after it (a new instance
    that has not aligned yet routes like the new graph it was made for)."""
    if config >= run.config_version:
        return run.topology
    adjustment = Adjustment.objects.filter(run=run, version__gt=config).order_by("version").first()
    if adjustment is None or node not in _nodes(adjustment.before):
        return run.topology
    return adjustment.before


def targets(
    doc: Mapping[str, Any],
    sender: str,
    segment_id: str,
    *,
    tag: str,
    routes: Routes,
    slots: KeyGroup,
) -> list[tuple[str, str, KeyGroup]]:
    """Where ``sender`` sends one output: ``(node, migrated_from, key slots)`` per copy.

    A keyed (stateful) stage gets one copy per member whose key group meets the data's
    slots, each carrying only those slots; any other stage gets the whole segment at
    the node its routes pick.
    """
    downstreams = downstreams_of(doc, sender)
    if not downstreams:
        return []
    if is_keyed(doc, downstreams[0]):
        groups = key_groups(doc, stage_of(doc, downstreams[0]))
        copies = []
        for member in downstreams:
            inter = slots.intersect(groups[member])
            if inter is not None:
                copies.append((member, "", inter))
        return copies
    target, migrated_from = route(segment_id, tag, downstreams, routes)
    return [(target, migrated_from, slots)]


def copy_id(segment_id: str, target: str, slots: KeyGroup, copies: int) -> str:
    """A deterministic id per copy, so a re-run batch inserts nothing new."""
    return segment_id if copies == 1 and slots.whole else f"{segment_id}@{target}"


def _after_doc(
    before: Mapping[str, Any],
    added: Sequence[NewInstance],
    removed: Sequence[str],
    plan: AdjustmentPlan,
) -> dict[str, Any]:
    nodes = _nodes(before)
    doc = copy.deepcopy(dict(before))
    new_nodes = [n for n in doc["nodes"] if n["name"] not in removed]
    for item in added:
        template = nodes[stage_members(before, item.stage)[0]]
        node = copy.deepcopy(dict(template))
        node["name"], node["stage"] = item.name, item.stage
        new_nodes.append(node)
    doc["nodes"] = new_nodes
    edges = [e for e in doc["edges"] if (e["from"], e["to"]) not in plan.disconnect]
    union_stage = {**{n: stage_of(before, n) for n in nodes}, **{a.name: a.stage for a in added}}
    for src, dst in sorted(plan.connect):
        template = next(
            e
            for e in before["edges"]
            if stage_of(before, e["from"]) == union_stage[src]
            and stage_of(before, e["to"]) == union_stage[dst]
        )
        edges.append({**template, "from": src, "to": dst})
    doc["edges"] = edges
    return doc


def _plan(
    before: Mapping[str, Any], change: Change
) -> tuple[AdjustmentPlan, dict[str, Any], dict[str, Any]]:
    nodes = _nodes(before)
    for item in change.added:
        if not stage_members(before, item.stage):
            raise AdjustmentError(f"the pipeline has no stage {item.stage!r}")
        kind = nodes[stage_members(before, item.stage)[0]]["kind"]
        if kind != "operator":
            raise AdjustmentError(f"stage {item.stage!r} is a {kind}; only operators rescale")
    names = [a.name for a in change.added]
    taken = sorted({n for n in names if n in nodes or names.count(n) > 1})
    if taken:
        raise AdjustmentError(f"new instance id(s) already taken: {', '.join(taken)}")
    for name in change.removed:
        if name not in nodes:
            raise AdjustmentError(f"the run has no instance {name!r}")
        if nodes[name]["kind"] != "operator":
            raise AdjustmentError(f"{name} is a {nodes[name]['kind']}; only operators rescale")
    probe = {
        **before,
        "nodes": [
            *before["nodes"],
            *(
                {**nodes[stage_members(before, a.stage)[0]], "name": a.name, "stage": a.stage}
                for a in change.added
            ),
        ],
    }
    union_topology = balancer_topology(probe)
    try:
        plan = plan_adjustment(
            balancer_topology(before),
            [union_topology.node(a.name) for a in change.added],
            change.removed,
        )
    except ValueError as err:
        raise AdjustmentError(str(err)) from None
    after = _after_doc(before, change.added, change.removed, plan)
    handoff: dict[str, Any] = {}
    for stage in plan.changed_stages:
        members_before = stage_members(before, stage)
        if not is_keyed(before, members_before[0]):
            continue
        original = even_key_groups(range(KEY_SLOTS), members_before)
        new = even_key_groups(range(KEY_SLOTS), stage_members(after, stage))
        hand = plan_handoff(original, new)
        handoff[stage] = {
            "takeovers": [[t.source, t.target, sorted(t.keys)] for t in hand.takeovers],
            "fetches": [[t.source, t.target, sorted(t.keys)] for t in hand.fetches],
            "drops": {k: sorted(v) for k, v in hand.drops.items()},
            "second_group": dict(hand.second_group),
        }
    plan_json = {
        "changed_stages": list(plan.changed_stages),
        "added": sorted(plan.added),
        "removed": sorted(plan.removed),
        "subgraph": list(plan.subgraph),
        "sources": sorted(plan.sources),
        "tails": sorted(plan.tails),
        "connect": [list(lk) for lk in sorted(plan.connect)],
        "disconnect": [list(lk) for lk in sorted(plan.disconnect)],
        "updates": {
            name: {
                "upstreams": list(u.upstreams),
                "downstreams": list(u.downstreams),
                "connect": [list(lk) for lk in u.connect],
                "disconnect": [list(lk) for lk in u.disconnect],
            }
            for name, u in plan.updates.items()
        },
        "handoff": handoff,
    }
    return plan, after, plan_json


# -- begin ----------------------------------------------------------------------------


def ensure_instances(run: Run) -> None:
    """One instance row per node of the run (idempotent: a new driver calls it too)."""
    existing = set(Instance.objects.filter(run=run).values_list("name", flat=True))
    Instance.objects.bulk_create(
        [
            Instance(
                run=run,
                name=n["name"],
                stage=n.get("stage") or n["name"],
                config=run.config_version,
                target=run.config_version,
            )
            for n in run.topology["nodes"]
            if n["name"] not in existing
        ],
        ignore_conflicts=True,
    )


def begin(run_id: int, change: Change, *, epoch: int, source: str) -> Adjustment:
    """Plan and start an adjustment, or raise :class:`AdjustmentError` changing nothing.

    ``source`` is the run's source node: it lives in the driver, so when it is a source
    of the subgraph it takes the injected marker and aligns right here.
    """
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.epoch != epoch:
            raise AdjustmentError(f"run {run_id}: driver epoch {epoch} is no longer current")
        running = Adjustment.objects.filter(run=run, status=Adjustment.Status.RUNNING).first()
        if running is not None:
            raise AdjustmentError(
                f"adjustment {running.version} ({running.kind}) is still under way; "
                "one adjustment at a time"
            )
        before = run.topology
        plan, after, plan_json = _plan(before, change)
        version = run.config_version + 1
        adjustment = Adjustment.objects.create(
            run=run,
            version=version,
            kind=change.kind,
            reason=change.reason,
            before=before,
            after=after,
            plan=plan_json,
            placement={a.name: a.worker for a in change.added},
        )
        subgraph = set(plan.subgraph)
        union_edges = {(e["from"], e["to"]) for e in before["edges"]} | set(plan.connect)
        Instance.objects.bulk_create(
            [
                Instance(
                    run=run,
                    name=a.name,
                    stage=a.stage,
                    worker=a.worker,
                    status=Instance.Status.JOINING,
                    config=run.config_version,
                )
                for a in change.added
            ]
        )
        for inst in Instance.objects.select_for_update().filter(run=run, name__in=subgraph):
            inst.target = version
            inst.expect = (
                [CONTROL]
                if inst.name in plan.sources
                else sorted(u for u, d in union_edges if d == inst.name and u in subgraph)
            )
            inst.forward = sorted(d for u, d in union_edges if u == inst.name and d in subgraph)
            inst.tail = inst.name in plan.tails
            # Only a changed keyed stage must not touch data from after the markers
            # before its state is handed over; every other instance keeps processing
            # both sides (the order of stateless work does not change its result).
            inst.barrier = inst.name in plan.v_changed and is_keyed(
                after if inst.name in plan.added else before, inst.name
            )
            if inst.name in plan.removed:
                inst.status = Instance.Status.RETIRING
            inst.save()
        run.topology = after
        run.config_version = version
        run.save(update_fields=["topology", "config_version"])
        _event(
            run_id,
            "adjust_planned",
            _describe(change, plan),
            data=plan_json,
            actor=change.actor,
            user=change.user,
        )
        injected = sorted(plan.sources)
        for name in injected:
            if name != source:
                _marker(run_id, CONTROL, name, version, now)
        _event(
            run_id,
            "adjust_markers",
            f"adjustment {version}: graph-state updates sent to "
            f"{len(plan_json['updates'])} instance(s); markers injected at {', '.join(injected)}",
            data={"version": version, "sources": injected},
        )
        if source in plan.sources:
            inst = Instance.objects.select_for_update().get(run=run, name=source)
            _align(inst, now)
    return adjustment


def _describe(change: Change, plan: AdjustmentPlan) -> str:
    parts = []
    if plan.added:
        parts.append(f"add {', '.join(sorted(plan.added))}")
    if plan.removed:
        parts.append(f"remove {', '.join(sorted(plan.removed))}")
    return (
        f"{change.kind.replace('_', ' ')}: {' and '.join(parts)}"
        f" ({change.reason or 'no reason given'}); subgraph {', '.join(plan.subgraph)}"
    )


def _marker(run_id: int, upstream: str, node: str, version: int, now: dt.datetime) -> None:
    Segment.objects.get_or_create(
        id=f"r{run_id}.m{version}.{upstream}>{node}",
        defaults={
            "run_id": run_id,
            "chunk": -1,
            "origin_file": -1,
            "origin_offset": 0,
            "origin_length": 0,
            "node": node,
            "upstream": upstream,
            "path": "",
            "bytes": 0,
            "available_at": now,
            "config": version,
            "marker": True,
        },
    )


def _event(
    run_id: int,
    kind: str,
    reason: str,
    *,
    node: str = "",
    data: dict[str, Any] | None = None,
    actor: str = Event.Actor.SYSTEM,
    user: Any = None,
) -> None:
    Event.objects.create(
        run_id=run_id,
        kind=kind,
        reason=reason,
        node=node[:100],
        actor=Event.Actor.USER if user is not None else actor,
        user=user,
        data=data or {},
    )


# -- align (in the claim of the instance's worker) -------------------------------------


def try_align(instance: Instance, now: dt.datetime) -> Aligned | None:
    """Align ``instance`` (its row locked by the caller) if it can; None if not yet."""
    version = instance.target
    markers = set(
        Segment.objects.filter(
            run_id=instance.run_id,
            node=instance.name,
            marker=True,
            config=version,
            state=Segment.State.QUEUED,
        ).values_list("upstream", flat=True)
    )
    if not set(instance.expect) <= markers:
        return None
    pending = Segment.objects.filter(
        run_id=instance.run_id, node=instance.name, marker=False
    ).exclude(state=Segment.State.DONE)
    if pending.filter(state=Segment.State.CLAIMED).exists():
        return None  # its outputs must reach the downstreams before the marker does
    if instance.barrier and pending.filter(config__lt=version, upstream__in=instance.expect):
        return None  # a keyed instance handles data from before the marker first
    return _align(instance, now)


@dataclass
class AlignedClaim(segments.Claim):
    """A claim, and the rescale step its node took while claiming (if any)."""

    aligned: Aligned | None = None


def claim_batch(
    run_id: int,
    node: str,
    owner: str,
    *,
    max_segments: int,
    max_bytes: int,
    lease_s: float,
    rate_mbps: float = 0.0,
) -> AlignedClaim:
    """A worker's claim: the node aligns first if it takes part in a rescale and can,
    under the same lock of its instance row as the claim; while it cannot yet, data from
    before the rescale goes first, and a node behind a barrier (a changed keyed stage)
    takes none from after it."""
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(run_id=run_id, name=node).first()
        aligned = None
        order = segments.ARRIVAL_ORDER
        if instance is not None and instance.aligning:
            aligned = try_align(instance, timezone.now())
            if aligned is None:
                barrier = instance.target if instance.barrier else None
                order = segments.ClaimOrder(config_first=True, barrier=barrier)
        claim = segments.claim_batch(
            run_id,
            node,
            owner,
            max_segments=max_segments,
            max_bytes=max_bytes,
            lease_s=lease_s,
            rate_mbps=rate_mbps,
            order=order,
        )
    return AlignedClaim(claim.segments, claim.config, aligned)


def align_waiting(run_id: int, version: int) -> list[Aligned]:
    """Align every instance of adjustment ``version`` that can align now and is not
    being claimed: the control side's poll, so an idle instance (or one whose next batch
    waits in a worker's queue) does not hold the adjustment up. Same step, same lock."""
    aligned = []
    for name in Instance.objects.filter(
        run_id=run_id, target=version, config__lt=version
    ).values_list("name", flat=True):
        with transaction.atomic():
            instance = (
                Instance.objects.select_for_update(skip_locked=True)
                .filter(run_id=run_id, name=name, target=version, config__lt=version)
                .first()
            )
            if instance is not None:
                step = try_align(instance, timezone.now())
                if step is not None:
                    aligned.append(step)
    return aligned


def _align(instance: Instance, now: dt.datetime) -> Aligned:
    version = instance.target
    run_id = instance.run_id
    Segment.objects.filter(run_id=run_id, node=instance.name, marker=True, config=version).update(
        state=Segment.State.DONE, done_at=now
    )
    for downstream in instance.forward:
        _marker(run_id, instance.name, downstream, version, now)
    adjustment = Adjustment.objects.get(run_id=run_id, version=version)
    taken = 0
    hand = adjustment.plan["handoff"].get(instance.stage)
    if hand is not None:
        for source, target, slots in hand["takeovers"]:
            if source == instance.name:
                taken += keystate.move(run_id, instance.stage, source, target, slots)
    retiring = instance.status == Instance.Status.RETIRING
    handed = 0
    if retiring and not instance.barrier:
        # Stateless: what it still holds goes where the new graph sends its upstreams'
        # data (its replacement, for a hot migration) instead of waiting for it here.
        handed = _reroute(
            Segment.objects.filter(
                run_id=run_id, node=instance.name, marker=False, state=Segment.State.QUEUED
            ),
            adjustment.after,
        )
    instance.config = version
    instance.aligned_at = now
    instance.save(update_fields=["config", "aligned_at"])
    what = (
        f"handed its {handed} queued segment(s) on and disconnected"
        if retiring and not instance.barrier
        else "finished its data and disconnected"
        if retiring
        else "applied its adjustment"
    )
    extra = f"; handed {taken} key(s) to its best-matching group's owner" if taken else ""
    tail = " and reported as a tail" if instance.tail else ""
    forwarded = f"forwarded the marker to {', '.join(instance.forward)}" if instance.forward else ""
    _event(
        run_id,
        "adjust_aligned",
        f"{instance.name} has every marker of adjustment {version}: {what}{extra}"
        f"{'; ' + forwarded if forwarded else ''}{tail}",
        node=instance.name,
        data={
            "version": version,
            "forwarded": instance.forward,
            "tail": instance.tail,
            "keys_taken_over": taken,
        },
    )
    return Aligned(instance.name, version, instance.tail, tuple(instance.forward), retiring)


# -- complete and roll back (the driver) ----------------------------------------------


def tails_reported(adjustment: Adjustment) -> list[str]:
    return sorted(
        Instance.objects.filter(
            run_id=adjustment.run_id,
            name__in=adjustment.plan["tails"],
            config__gte=adjustment.version,
        ).values_list("name", flat=True)
    )


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
        state: dict[str, Any] = {}
        for stage, hand in adjustment.plan["handoff"].items():
            before = keystate.totals(run_id, stage)
            fetched = sum(
                keystate.move(run_id, stage, source, target, slots)
                for source, target, slots in hand["fetches"]
            )
            after = keystate.totals(run_id, stage)
            owners = _owners(adjustment.after, stage)
            holders = keystate.holders(run_id, stage)
            misplaced = sorted(key for key, who in holders.items() if who != [owners[slot_of(key)]])
            state[stage] = {
                "keys": len(after),
                "keys_fetched": fetched,
                "identical": before == after,
                "misplaced_keys": misplaced[:20],
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
        outcome = measure(adjustment, now)
        outcome.state = state
        adjustment.status = Adjustment.Status.COMPLETE
        adjustment.finished_at = now
        adjustment.outcome = outcome.to_json()
        adjustment.save(update_fields=["status", "finished_at", "outcome"])
        gap = outcome.sink_max_gap_s
        _event(
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
        for stage in adjustment.plan["handoff"]:
            # A keyed stage's data sent with the new key groups must be split by the old
            # ones again, in flight included (its batch's completion is then refused).
            members = {*stage_members(before, stage), *stage_members(adjustment.after, stage)}
            moved += _reroute(
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
        _event(
            run.pk,
            "adjust_rolled_back",
            f"adjustment {version} ({adjustment.kind}) rolled back: {reason}; "
            f"{moved} segment(s) sent with the new graph went back to the old instances",
            data={"version": version, **adjustment.outcome},
        )
    return adjustment


def _requeue(run: Run, before: Mapping[str, Any], added: Sequence[str]) -> int:
    """Send data waiting at (or held by) new instances where the old graph sends it."""
    return _reroute(
        Segment.objects.filter(run=run, node__in=added, marker=False).exclude(
            state=Segment.State.DONE
        ),
        before,
    )


def _reroute(queued: QuerySet[Segment], doc: Mapping[str, Any]) -> int:
    """Queue ``queued`` again where their upstream sends data in the graph ``doc``
    (split by key groups for a keyed stage); returns how many copies were queued."""
    moved = 0
    for seg in list(queued.select_for_update()):
        slots = KeyGroup(seg.slots_from, seg.slots_to)
        original = seg.pk
        copies = targets(doc, seg.upstream, original, tag=seg.tag, routes=Routes(), slots=slots)
        seg.delete()
        for node, migrated_from, part in copies:
            seg_copy = copy.copy(seg)
            seg_copy.pk = copy_id(original, node, part, len(copies))
            seg_copy.node, seg_copy.migrated_from = node, migrated_from
            seg_copy.slots_from, seg_copy.slots_to = part.low, part.high
            seg_copy.state, seg_copy.lease_owner, seg_copy.lease_expires = "queued", "", None
            seg_copy.save(force_insert=True)
            moved += 1
    return moved


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
        by_node[node].append(at)
    outside = {node: _max_gap(times) for node, times in by_node.items()}
    return Outcome((until - start).total_seconds(), sink_gap, outside)


def _max_gap(times: Sequence[dt.datetime]) -> float:
    ordered = sorted(times)
    return max(((b - a).total_seconds() for a, b in itertools.pairwise(ordered)), default=0.0)
