"""Planning a rescale (docs/spec/hot-rescale.md section 1, and 3.1 for key groups), and
where data goes while a run's graph changes.

Owns: the request (:class:`Change`, :class:`NewInstance`) and its refusal
(:class:`RescaleError`); the graph document's stages and key groups (``stage_of``,
``stage_members``, ``is_keyed``, ``key_groups``: even ranges, or each member's
``key_slots`` after a key-group move); the plan of one change
(:func:`plan_change`: the subgraph from ``balancer.rescale``, the graph after it, every
instance's graph-state update and the stateful stages' hand-off); and routing under a
changing graph: the graph a node routes with (:func:`topology_at`), the copies of one
output (:func:`targets`, :func:`copy_id`) and queued data sent again by another graph
(:func:`reroute`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from balancer.document import PipelineDocument
from balancer.rescale import AdjustmentPlan, plan_adjustment, plan_handoff
from orchestrator.models import Adjustment, Event, Run, Segment
from orchestrator.pipeline.graph import balancer_topology, downstreams_of
from orchestrator.pipeline.routes import Routes, route
from sparkjobs.catalog import keyed
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup, stage_key_groups


class RescaleError(ValueError):
    """A rescale cannot be made as asked; nothing was changed."""


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
    # A key-group move: per keyed stage, each member's new slots ``(low, high)``; the
    # stage keeps its instances.
    regroup: Mapping[str, Mapping[str, tuple[int, int]]] = field(default_factory=dict)
    reason: str = ""
    actor: str = Event.Actor.USER
    user: Any = None
    # A scale-in after underload: once complete, the run asks the elastic pool for one
    # Spark worker fewer. Kept in the stored plan, so a driver that takes the run over
    # in the middle of the adjustment still gives the worker back.
    gives_back_worker: bool = False


# -- graph documents ------------------------------------------------------------------


def _nodes(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def stage_of(doc: Mapping[str, Any], name: str) -> str:
    node = _nodes(doc)[name]
    return node.get("stage") or name


def stage_members(doc: Mapping[str, Any], stage: str) -> list[str]:
    return [n["name"] for n in doc["nodes"] if (n.get("stage") or n["name"]) == stage]


def is_keyed(doc: Mapping[str, Any], name: str) -> bool:
    return keyed(_nodes(doc)[name])


def key_groups(doc: Mapping[str, Any], stage: str) -> dict[str, KeyGroup]:
    """Each member's key group (:func:`sparkjobs.keygroups.stage_key_groups`)."""
    members = stage_members(doc, stage)
    nodes = _nodes(doc)
    return stage_key_groups(
        members, {m: nodes[m]["key_slots"] for m in members if "key_slots" in nodes[m]}
    )


# -- where data goes ------------------------------------------------------------------


def topology_at(run: Run, config: int, node: str) -> PipelineDocument:
    """The graph ``node``, aligned with version ``config``, routes with: the graph
    before the next adjustment, unless the node exists only after it (a new instance
    that has not aligned yet routes like the new graph it was made for)."""
    # JSON columns read as Any: these two hold pipeline documents (balancer.document).
    current: PipelineDocument = run.topology
    if config >= run.config_version:
        return current
    adjustment = Adjustment.objects.filter(run=run, version__gt=config).order_by("version").first()
    if adjustment is None or node not in _nodes(adjustment.before):
        return current
    before: PipelineDocument = adjustment.before
    return before


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


def reroute(queued: QuerySet[Segment], doc: Mapping[str, Any]) -> int:
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


# -- the plan of one change -----------------------------------------------------------


def _after_doc(
    before: Mapping[str, Any],
    added: Sequence[NewInstance],
    removed: Sequence[str],
    plan: AdjustmentPlan,
    regroup: Mapping[str, Mapping[str, tuple[int, int]]],
) -> dict[str, Any]:
    nodes = _nodes(before)
    doc = copy.deepcopy(dict(before))
    new_nodes = [n for n in doc["nodes"] if n["name"] not in removed]
    for item in added:
        template = nodes[stage_members(before, item.stage)[0]]
        node = copy.deepcopy(dict(template))
        node["name"], node["stage"] = item.name, item.stage
        new_nodes.append(node)
    for node in new_nodes:
        # A stage whose members change starts again from even key groups.
        if (node.get("stage") or node["name"]) in plan.changed_stages:
            node.pop("key_slots", None)
    for groups in regroup.values():
        for node in new_nodes:
            if node["name"] in groups:
                node["key_slots"] = list(groups[node["name"]])
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


def plan_change(
    before: Mapping[str, Any], change: Change
) -> tuple[AdjustmentPlan, dict[str, Any], dict[str, Any]]:
    """``(plan, graph after the change, the plan as stored)``, or :class:`RescaleError`."""
    nodes = _nodes(before)
    for item in change.added:
        if not stage_members(before, item.stage):
            raise RescaleError(f"the pipeline has no stage {item.stage!r}")
        kind = nodes[stage_members(before, item.stage)[0]]["kind"]
        if kind != "operator":
            raise RescaleError(f"stage {item.stage!r} is a {kind}; only operators rescale")
    names = [a.name for a in change.added]
    taken = sorted({n for n in names if n in nodes or names.count(n) > 1})
    if taken:
        raise RescaleError(f"new instance id(s) already taken: {', '.join(taken)}")
    for name in change.removed:
        if name not in nodes:
            raise RescaleError(f"the run has no instance {name!r}")
        if nodes[name]["kind"] != "operator":
            raise RescaleError(f"{name} is a {nodes[name]['kind']}; only operators rescale")
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
    _check_regroup(before, change)
    union_topology = balancer_topology(probe)
    try:
        plan = plan_adjustment(
            balancer_topology(before),
            [union_topology.node(a.name) for a in change.added],
            change.removed,
            regrouped=change.regroup,
        )
    except ValueError as err:
        raise RescaleError(str(err)) from None
    after = _after_doc(before, change.added, change.removed, plan, change.regroup)
    handoff: dict[str, Any] = {}
    for stage in plan.changed_stages:
        members_before = stage_members(before, stage)
        if not is_keyed(before, members_before[0]):
            continue
        hand = plan_handoff(_slot_sets(before, stage), _slot_sets(after, stage))
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
        "regroup": {
            stage: {m: list(slots) for m, slots in groups.items()}
            for stage, groups in change.regroup.items()
        },
        "gives_back_worker": change.gives_back_worker,
    }
    return plan, after, plan_json


def _slot_sets(doc: Mapping[str, Any], stage: str) -> dict[str, frozenset[int]]:
    return {m: frozenset(g.slots) for m, g in key_groups(doc, stage).items()}


def _check_regroup(before: Mapping[str, Any], change: Change) -> None:
    """A key-group move names a keyed stage's every member, in order, with non-empty
    contiguous slot ranges that split the whole slot space, and nothing else changes."""
    if change.regroup and (change.added or change.removed):
        raise RescaleError("a key-group move changes no instance; add or remove in another")
    for stage, groups in change.regroup.items():
        members = stage_members(before, stage)
        if not members:
            raise RescaleError(f"the pipeline has no stage {stage!r}")
        if not is_keyed(before, members[0]):
            raise RescaleError(f"stage {stage!r} is not keyed; it has no key groups to move")
        if list(groups) != members:
            raise RescaleError(
                f"a key-group move of {stage} names {', '.join(groups) or 'nobody'}; "
                f"it must name its members {', '.join(members)} in that order"
            )
        low = 0
        for member, (start, end) in groups.items():
            if start != low or not start < end <= KEY_SLOTS:
                raise RescaleError(
                    f"{member}'s key slots [{start}, {end}) do not continue [0, {low}) "
                    f"with at least one slot, within {KEY_SLOTS}"
                )
            low = end
        if low != KEY_SLOTS:
            raise RescaleError(f"the key slots of {stage} end at {low}, not {KEY_SLOTS}")
