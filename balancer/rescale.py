"""Planning a hot rescale: the adjustment subgraph and the key-group hand-off.

docs/spec/hot-rescale.md. The orchestrator runs the marker protocol; this module only
decides who takes part, which connections appear and disappear, and which state moves.

Adjustment subgraph (worked example: b1 -> b1,b2 and c1,c2 -> c1)::

    a1 ─┐            ┌─ c1 ─┐
        ├─ b1 ───────┤      ├─ d1        new:    a1→b2, a2→b2, b2→c1
    a2 ─┘   (b2 new) └─ c2 ─┘            delete: b1→c2, c2→d1
                       (removed)         sources {a1, a2}, tails {d1}

A new instance connects to every instance of its neighbouring stages that exists after
the change (as in a shuffle, even where the old instances were wired one to one); an
instance being removed keeps only its old connections, all marked for deletion. So a
new instance is never connected to a removed one.

Key groups: each instance of a stateful stage owns one key group. Every existing
instance's state goes, on the marker, to the owner of the new group it overlaps most
(itself if possible); on completion every instance fetches the keys it still lacks from
whoever holds them and drops the keys it no longer owns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from balancer.topology import LinkSpec, NodeSpec, Topology

Link = tuple[str, str]


@dataclass(frozen=True)
class GraphUpdate:
    """What one instance is told before the marker: its neighbours after the change and
    which connections to open or to mark for deletion."""

    instance: str
    upstreams: tuple[str, ...]
    downstreams: tuple[str, ...]
    connect: tuple[Link, ...]
    disconnect: tuple[Link, ...]


@dataclass(frozen=True)
class AdjustmentPlan:
    changed_stages: tuple[str, ...]
    added: frozenset[str]
    removed: frozenset[str]
    v_changed: frozenset[str]
    v_up: frozenset[str]
    v_down: frozenset[str]
    subgraph: tuple[str, ...]  # in pipeline order
    sources: frozenset[str]  # receive the adjustment marker from the control side
    tails: frozenset[str]  # report to the control side once they have every marker
    connect: frozenset[Link]
    disconnect: frozenset[Link]  # carry data until the marker passes, then close
    updates: Mapping[str, GraphUpdate]
    after: Topology


def plan_adjustment(
    topology: Topology,
    added: Iterable[NodeSpec],
    removed: Iterable[str],
    regrouped: Iterable[str] = (),
) -> AdjustmentPlan:
    """Plan adding the ``added`` instances to their (existing) stages and removing
    ``removed``; a hot migration is one of each in the same stage. The ``regrouped``
    stages keep their instances and change their key groups (a key-group move): they
    take part like a changed stage, with no connection opened or closed."""
    new_nodes = tuple(added)
    gone = frozenset(removed)
    moved = frozenset(regrouped)
    _check_change(topology, new_nodes, gone)
    strays = sorted(moved - set(topology.stages))
    if strays:
        raise ValueError(f"no stage {', '.join(strays)} to move key groups in")
    new_ids = frozenset(n.id for n in new_nodes)

    after_members: dict[str, list[str]] = {
        stage: [m for m in members if m not in gone] for stage, members in topology.stages.items()
    }
    for node in new_nodes:
        after_members[node.stage_name].append(node.id)
    stage_links = _stage_links(topology)

    connect: dict[Link, LinkSpec] = {}
    for node in new_nodes:
        stage = node.stage_name
        for (src_stage, dst_stage), template in stage_links.items():
            if dst_stage == stage:
                for m in after_members[src_stage]:
                    connect[(m, node.id)] = replace(template, src=m, dst=node.id)
            if src_stage == stage:
                for m in after_members[dst_stage]:
                    connect[(node.id, m)] = replace(template, src=node.id, dst=m)
    disconnect = frozenset((lk.src, lk.dst) for lk in topology.links if {lk.src, lk.dst} & gone)

    after = Topology.build(
        (*(n for n in topology.nodes if n.id not in gone), *new_nodes),
        (*(lk for lk in topology.links if (lk.src, lk.dst) not in disconnect), *connect.values()),
    )
    # Removed instances still carry data until the marker passes: the protocol runs on
    # the union of the old and the new graph.
    union = Topology.build((*topology.nodes, *new_nodes), (*topology.links, *connect.values()))

    changed_stages = tuple(
        dict.fromkeys(
            union.node(n).stage_name
            for n in union.order
            if n in new_ids | gone or union.node(n).stage_name in moved
        )
    )
    v_changed = frozenset(m for stage in changed_stages for m in union.stage_members(stage))
    v_up = frozenset(u for v in v_changed for u in union.upstreams(v))
    v_down = frozenset(d for v in v_changed for d in union.downstreams(v))
    inside = v_changed | v_up | v_down
    first_start = {n for n in inside if not set(union.upstreams(n)) & inside}
    first_end = {n for n in inside if not set(union.downstreams(n)) & inside}

    return AdjustmentPlan(
        changed_stages=changed_stages,
        added=new_ids,
        removed=gone,
        v_changed=v_changed,
        v_up=v_up,
        v_down=v_down,
        subgraph=_in_pipeline_order(union, inside),
        sources=frozenset(first_start | (v_up - v_changed)),
        tails=frozenset(first_end | (v_down - v_changed)),
        connect=frozenset(connect),
        disconnect=disconnect,
        updates=_updates(union, after, frozenset(connect), disconnect, gone),
        after=after,
    )


def even_key_groups(keys: Sequence[int], instances: Sequence[str]) -> dict[str, frozenset[int]]:
    """Split the (sorted) key space into contiguous ranges, one per instance, sizes
    differing by at most one (the first instances take the remainder)."""
    if not instances:
        raise ValueError("key groups need at least one instance")
    ordered = sorted(keys)
    return {
        instance: frozenset(ordered[i] for i in key_group(index, len(instances), len(ordered)))
        for index, instance in enumerate(instances)
    }


def key_group(part: int, parts: int, size: int) -> range:
    """Positions of the ``part``-th of ``parts`` even key groups of a key space of
    ``size`` keys: what :func:`even_key_groups` gives the ``part``-th instance."""
    if not 0 <= part < parts:
        raise ValueError(f"key group {part} of {parts} does not exist")
    base, extra = divmod(size, parts)
    start = part * base + min(part, extra)
    return range(start, start + base + (1 if part < extra else 0))


@dataclass(frozen=True)
class Transfer:
    """``keys``' state moves (takeover) or is copied (fetch) from ``source`` to ``target``."""

    source: str
    target: str
    keys: frozenset[int]


@dataclass(frozen=True)
class HandoffPlan:
    second_group: Mapping[str, str]  # existing instance -> owner of its best-matching group
    takeovers: tuple[Transfer, ...]  # on the marker; an instance matching its own group keeps
    fetches: tuple[Transfer, ...]  # on adjustment complete
    drops: Mapping[str, frozenset[int]]  # on adjustment complete, after the fetches
    holders: Mapping[int, str]  # who holds each key between takeover and completion


def plan_handoff(
    original: Mapping[str, frozenset[int]], new: Mapping[str, frozenset[int]]
) -> HandoffPlan:
    """Match every original key group to the new group it overlaps most (ties: the
    instance's own new group, then the first listed) and plan the state moves."""
    _check_groups(original, new)
    second_group: dict[str, str] = {}
    takeovers: list[Transfer] = []
    holders: dict[int, str] = {}
    for instance, keys in original.items():
        if not keys:
            continue
        owner = max(new, key=lambda o: (len(keys & new[o]), o == instance))
        second_group[instance] = owner
        if owner != instance:
            takeovers.append(Transfer(instance, owner, keys))
        holders.update(dict.fromkeys(keys, owner))

    fetches: list[Transfer] = []
    for target, keys in new.items():
        by_source: dict[str, set[int]] = {}
        for key in sorted(keys):
            if holders[key] != target:
                by_source.setdefault(holders[key], set()).add(key)
        fetches.extend(
            Transfer(source, target, frozenset(missing)) for source, missing in by_source.items()
        )
    held: dict[str, set[int]] = {}
    for key, holder in holders.items():
        held.setdefault(holder, set()).add(key)
    drops = {
        holder: frozenset(keys - new[holder]) for holder, keys in held.items() if keys - new[holder]
    }
    return HandoffPlan(second_group, tuple(takeovers), tuple(fetches), drops, holders)


def _check_change(topology: Topology, added: tuple[NodeSpec, ...], removed: frozenset[str]) -> None:
    unknown = sorted(r for r in removed if not topology.has_node(r))
    if unknown:
        raise ValueError(f"cannot remove unknown instance(s) {', '.join(unknown)}")
    ids = [n.id for n in added]
    clash = sorted({i for i in ids if topology.has_node(i) or ids.count(i) > 1})
    if clash:
        raise ValueError(f"new instance id(s) already taken: {', '.join(clash)}")
    strays = sorted({n.stage_name for n in added if n.stage_name not in topology.stages})
    if strays:
        raise ValueError(f"no stage {', '.join(strays)} to add instances to")
    emptied = sorted(
        stage
        for stage, members in topology.stages.items()
        if set(members) <= removed and not any(n.stage_name == stage for n in added)
    )
    if emptied:
        raise ValueError(f"the change would leave stage(s) {', '.join(emptied)} without instances")


def _in_pipeline_order(topology: Topology, nodes: frozenset[str]) -> tuple[str, ...]:
    # Stage by stage (in the order the stages first appear), instances in declaration
    # order within a stage: the order an operator reads the pipeline in.
    stage_rank: dict[str, int] = {}
    for n in topology.order:
        stage_rank.setdefault(topology.node(n).stage_name, len(stage_rank))
    position = {m: i for members in topology.stages.values() for i, m in enumerate(members)}
    return tuple(
        sorted(nodes, key=lambda n: (stage_rank[topology.node(n).stage_name], position[n]))
    )


def _check_groups(
    original: Mapping[str, frozenset[int]], new: Mapping[str, frozenset[int]]
) -> None:
    for name, groups in (("original", original), ("new", new)):
        if sum(len(keys) for keys in groups.values()) != len(set().union(*groups.values())):
            raise ValueError(f"{name} key groups overlap: every key needs exactly one owner")
    if set().union(*original.values()) != set().union(*new.values()):
        raise ValueError("original and new key groups must cover the same keys")


def _stage_links(topology: Topology) -> dict[tuple[str, str], LinkSpec]:
    # One existing link per pair of connected stages: it says the stages are neighbours
    # and lends its settings (emulated bandwidth, latency) to the new instances' links.
    links: dict[tuple[str, str], LinkSpec] = {}
    for link in topology.links:
        pair = (topology.node(link.src).stage_name, topology.node(link.dst).stage_name)
        links.setdefault(pair, link)
    return links


def _updates(
    union: Topology,
    after: Topology,
    connect: frozenset[Link],
    disconnect: frozenset[Link],
    removed: frozenset[str],
) -> dict[str, GraphUpdate]:
    touched = {n for link in connect | disconnect for n in link}
    return {
        n: GraphUpdate(
            instance=n,
            upstreams=() if n in removed else after.upstreams(n),
            downstreams=() if n in removed else after.downstreams(n),
            connect=tuple(sorted(lk for lk in connect if n in lk)),
            disconnect=tuple(sorted(lk for lk in disconnect if n in lk)),
        )
        for n in union.order
        if n in touched
    }
