"""Small builders for topologies and observations used by the balancer's tests."""

from __future__ import annotations

import math
from collections.abc import Mapping

from balancer.model import NodeObservation, Observation
from balancer.policy import MB
from balancer.topology import LinkSpec, NodeSpec, Topology

CAPACITY = 64 * MB


def layered(*stages: tuple[str, int], mergeable: bool = True) -> Topology:
    """Stages in order, each fully connected to the next; instances are named stage+index
    (``("a", 2)`` gives a1, a2). The first stage is the source, the last the sink."""
    nodes: list[NodeSpec] = []
    links: list[LinkSpec] = []
    previous: list[str] = []
    for index, (stage, count) in enumerate(stages):
        kind = "source" if index == 0 else "sink" if index == len(stages) - 1 else "operator"
        members = [f"{stage}{i}" for i in range(1, count + 1)]
        nodes.extend(
            NodeSpec(m, kind=kind, stage=stage, capacity_bytes=CAPACITY, mergeable=mergeable)
            for m in members
        )
        links.extend(LinkSpec(src, dst) for src in previous for dst in members)
        previous = members
    return Topology.build(nodes, links)


def observe(
    topology: Topology,
    time_s: float = 0.0,
    levels: Mapping[str, float] | None = None,
    *,
    flagged: frozenset[str] = frozenset(),
    buffered: Mapping[str, float] | None = None,
    draining: frozenset[str] = frozenset(),
    nodes: Mapping[str, NodeObservation] | None = None,
    omit: frozenset[str] = frozenset(),
) -> Observation:
    """Every node of ``topology`` observed at ``time_s``; unlisted levels are 0.

    ``buffered`` sets queued bytes directly (level follows from the capacity); ``nodes``
    replaces individual node observations wholesale.
    """
    levels = levels or {}
    buffered = buffered or {}
    observed: dict[str, NodeObservation] = {}
    for spec in topology.nodes:
        if spec.id in omit:
            continue
        if spec.id in buffered:
            queued = buffered[spec.id]
            level = queued / spec.capacity_bytes
        else:
            level = levels.get(spec.id, 0.0)
            queued = level * spec.capacity_bytes
        observed[spec.id] = node(spec.id, level, buffered_bytes=queued, flagged=spec.id in flagged)
    observed.update(nodes or {})
    return Observation(
        time_s=time_s, interval_s=1.0, topology=topology, nodes=observed, draining=draining
    )


def node(
    node_id: str,
    level: float = 0.0,
    *,
    buffered_bytes: float | None = None,
    in_rate: float = 0.0,
    out_rate: float = 0.0,
    flagged: bool = False,
    speed: float = 1.0,
    origin_speed: float = 1.0,
    in_backpressure: bool = False,
    head_by_route: Mapping[str, float] | None = None,
    in_rate_by_route: Mapping[str, float] | None = None,
    capacity_bps: float = math.inf,
    resource: str | None = None,
    waiting_bytes: float | None = None,
) -> NodeObservation:
    """A node at full speed, out of backpressure, with no per-route figures, its
    capacity unmeasured, a resource of its own and all its buffered bytes waiting (none
    taken by a batch), unless told."""
    buffered = level * CAPACITY if buffered_bytes is None else buffered_bytes
    return NodeObservation(
        node=node_id,
        level=level,
        buffered_bytes=buffered,
        in_rate=in_rate,
        out_rate=out_rate,
        flagged=flagged,
        speed=speed,
        origin_speed=origin_speed,
        in_backpressure=in_backpressure,
        head_by_route=head_by_route or {},
        in_rate_by_route=in_rate_by_route or {},
        capacity_bps=capacity_bps,
        resource=node_id if resource is None else resource,
        waiting_bytes=buffered if waiting_bytes is None else waiting_bytes,
    )
