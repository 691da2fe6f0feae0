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

A move takes only what no batch holds, and a worker claims its whole pool in one batch:
a slow member that claims a full pool at the end of the input, or its first batch
before its capacity is known, runs alone while its siblings idle. So each tick also
bounds the members' batches (:func:`batch_bounds`): a member not measured yet takes at
most ``FIRST_BATCH_BYTES``, and a late member at most ``c_i * max(T, MIN_BATCH_S)``,
so that the rest of its pool stays waiting, where a move can take it.

Only stages whose operator merges partial results (as for migration) take part; a
keyed stage's data belongs to its key slots, and moves with them (balancer/key_moves.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from balancer.model import BoundBatches, MoveQueued, Observation
from balancer.policy import Policy
from balancer.units import MB

MOVE_AFTER_S = 2.0
LATE_SHARE = 0.25
# A member whose capacity is not measured yet takes at most this much in a batch: the
# batch measures it, and on a slow worker a first batch of a large pool, taken before
# anything is known, is what the whole stage then waits for.
FIRST_BATCH_BYTES = 8 * MB
# A late member's batch still takes this many seconds of its capacity: a batch's fixed
# cost is paid in CPU, and a smaller batch on a slow worker costs more than finishing
# together saves.
MIN_BATCH_S = 2.0


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


def batch_bounds(observation: Observation) -> list[BoundBatches]:
    """This tick's bounds on the batches of each stage's members (see the module)."""
    actions: list[BoundBatches] = []
    for stage, members in observation.topology.stages.items():
        capacity = _own_resources(observation, members)
        if len(capacity) < 2:
            continue
        unknown = [m for m in capacity if not _known(capacity[m])]
        if unknown:
            bounds = {m: float(FIRST_BATCH_BYTES) for m in unknown}
            reason = f"not measured yet: {', '.join(unknown)}"
        else:
            queued = {m: observation.nodes[m].buffered_bytes for m in capacity}
            bounds = _late_bounds(capacity, queued)
            reason = f"late behind stage {stage}'s common drain time"
        actions.append(
            BoundBatches(
                reason=reason if bounds else "no member bounded",
                stage=stage,
                members=tuple(capacity),
                bounds=bounds,
            )
        )
    return actions


def _late_bounds(capacity: Mapping[str, float], queued: Mapping[str, float]) -> dict[str, float]:
    """Each late member's bound: its share of the common drain time, at least
    ``MIN_BATCH_S`` of its capacity."""
    drain_s = sum(queued.values()) / sum(capacity.values())
    threshold_s = max(MOVE_AFTER_S, LATE_SHARE * drain_s)
    return {
        m: capacity[m] * max(drain_s, MIN_BATCH_S)
        for m in capacity
        if queued[m] / capacity[m] - drain_s > threshold_s
    }


def _known(rate: float) -> bool:
    return math.isfinite(rate) and rate > 0


def _own_resources(observation: Observation, members: tuple[str, ...]) -> dict[str, float]:
    """The members observed, mergeable and not drained by a scale-in that run on a
    resource no other member runs on, with their capacities (the declared rate where
    set, else as measured; ``math.inf`` while unknown). Empty when fewer than two are
    observed or one of them cannot merge partial results."""
    topology = observation.topology
    seen = [m for m in members if m in observation.nodes and m not in observation.draining]
    if len(seen) < 2 or not all(topology.node(m).mergeable for m in seen):
        return {}
    resources = Counter(observation.nodes[m].resource for m in seen)
    return {
        member: topology.node(member).max_rate_bps or observation.nodes[member].capacity_bps
        for member in seen
        if resources[observation.nodes[member].resource] == 1
    }


def _eligible(observation: Observation, members: tuple[str, ...]) -> dict[str, float]:
    """The members that take part in moves, with their capacities: those of
    :func:`_own_resources`, none while any of their capacities is unknown (the stage's
    drain time cannot be known either)."""
    capacity = _own_resources(observation, members)
    return capacity if all(map(_known, capacity.values())) else {}


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
