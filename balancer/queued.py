"""Data already waiting in a pool moves to a sibling that would finish sooner (ours,
with ``migration = proportional``).

Routing and migration decide where data goes as it leaves its upstream; once in a
pool, it waits for that pool's worker. When an upstream has sent everything it had (a
bounded input read ahead into the pools, a burst the source let in at once), a slow
worker's pool can hold minutes of work while its stage's other workers idle, and no
routing decision can change that: nothing is left to route. Each tick, for every stage
of two interchangeable members or more, each on a resource of its own with a known
capacity ``c_i`` (measured, or its declared rate) and ``q_i`` bytes in its pool:

    T = sum(q) / sum(c)            the stage's drain time if its pools empty together
    late_i = q_i / c_i - T         how much later member i would finish

A member late by more than ``MOVE_AFTER_S`` and by more than ``LATE_SHARE`` of ``T`` (so
that the noise of the estimates moves nothing) gives up to ``q_i - c_i * T`` of what
waits in its pool (``waiting_bytes``: arrived, not taken by a batch) to the members
that would finish early, in proportion to how much more each could take before it
finishes at ``T`` and never past its high water. A member being drained by a scale-in
is left to its adjustment. It is the same goal as the proportional plan's
(balancer/pressure.py: equal drain times, not equal levels), applied to the data that
has already arrived.

Only stages whose operator merges partial results (as for migration) take part; a
keyed stage's data belongs to its key slots, and moves with them (balancer/key_moves.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from balancer.model import MoveQueued, Observation
from balancer.policy import Policy
from balancer.units import MB

MOVE_AFTER_S = 2.0
LATE_SHARE = 0.25


def queued_moves(observation: Observation, policy: Policy) -> list[MoveQueued]:
    """This tick's moves of waiting data between the members of each stage."""
    actions: list[MoveQueued] = []
    topology = observation.topology
    for stage, members in topology.stages.items():
        eligible = _eligible(observation, members)
        if len(eligible) < 2:
            continue
        actions.extend(_stage_moves(observation, policy, stage, eligible))
    return actions


def _eligible(observation: Observation, members: tuple[str, ...]) -> dict[str, float]:
    """The members that take part, with their capacities: observed, mergeable, with a
    finite capacity and a resource no other member runs on. Empty when any observed
    member's capacity is unknown (the stage's drain time cannot be known either)."""
    topology = observation.topology
    seen = [m for m in members if m in observation.nodes and m not in observation.draining]
    if len(seen) < 2 or not all(topology.node(m).mergeable for m in seen):
        return {}
    resources = Counter(observation.nodes[m].resource for m in seen)
    capacity: dict[str, float] = {}
    for member in seen:
        node = observation.nodes[member]
        rate = topology.node(member).max_rate_bps or node.capacity_bps
        if not math.isfinite(rate) or rate <= 0:
            return {}
        if resources[node.resource] == 1:
            capacity[member] = rate
    return capacity


def _stage_moves(
    observation: Observation, policy: Policy, stage: str, capacity: Mapping[str, float]
) -> list[MoveQueued]:
    nodes = observation.nodes
    topology = observation.topology
    queued = {m: nodes[m].buffered_bytes for m in capacity}
    drain_s = sum(queued.values()) / sum(capacity.values())
    fair = {m: capacity[m] * drain_s for m in capacity}
    threshold_s = max(MOVE_AFTER_S, LATE_SHARE * drain_s)

    def late_s(member: str) -> float:
        return queued[member] / capacity[member] - drain_s

    givers = sorted((m for m in capacity if late_s(m) > threshold_s), key=late_s, reverse=True)
    room = {
        m: min(
            fair[m] - queued[m],
            policy.high_water * topology.node(m).capacity_bytes - queued[m],
        )
        for m in capacity
        if m not in givers
    }
    room = {m: r for m, r in room.items() if r > 0}
    actions = []
    for giver in givers:
        give = min(queued[giver] - fair[giver], nodes[giver].waiting_bytes)
        total_room = sum(room.values())
        if give <= 0 or total_room <= 0:
            continue
        give = min(give, total_room)
        moves = {m: give * r / total_room for m, r in room.items()}
        for m, size in moves.items():
            room[m] -= size
        actions.append(
            MoveQueued(
                reason=(
                    f"{giver} ({queued[giver] / MB:.1f} MB in its pool at "
                    f"{capacity[giver] / MB:.2f} MB/s) would finish "
                    f"{late_s(giver):.0f} s after stage {stage}'s pools could empty "
                    f"together ({drain_s:.0f} s)"
                ),
                stage=stage,
                node=giver,
                moves=moves,
            )
        )
    return actions
