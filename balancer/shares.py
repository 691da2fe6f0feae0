"""Traffic shares inside a stage: water-level rebalancing (docs/spec/watermark-flags.md,
last part), or shares in proportion to measured capacities.

Each balancer tick, every upstream looks at each group of its direct downstreams that are
interchangeable (same stage, mergeable operator) and moves ``balance_step`` of the share
of the fullest member to the members with lower levels:

    levels  0.50  0.20  0.20          shares  1/3   1/3   1/3
    heavy    ^                   ->           0.300 0.350 0.350

The freed share is split in proportion to how much lower each receiver's level is than
the heavy node's (equal gaps, equal parts), so the emptiest peers get the most.

Members that share one resource (instances whose batches the same Spark workers run)
keep their shares: moving traffic between them moves no work off that resource.

With ``routing = measured`` (:func:`measured_tick`) each member's share is instead its
resource's measured true rate over the stage's (balancer/sizing.py; members sharing a
resource split its share evenly): what DS2 gives each instance, so that every member
takes new data as fast as it works it off. It waits, keeping the shares in force, until
every member's rate is known, and moves them only when one has changed by more than
:data:`MEASURED_MOVE`, so that the noise of the estimates does not churn the routes.

Invariants: a group's shares sum to 1; no member goes below ``min_share`` unless it is
being drained (then its share goes to 0 at once and its peers absorb it).

A group of more than ``1 / min_share`` members cannot give everyone ``min_share``; the
spec does not say what happens then. Taking the equal split ``1 / n`` as the floor would
freeze every large stage (nobody could give anything), so there each member keeps at
least half of its equal share, ``1 / (2n)``, instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from balancer.model import Action, Observation, SetShares
from balancer.policy import Policy
from balancer.sizing import stage_capacity
from balancer.topology import Topology

# Key of one upstream's shares towards one downstream stage.
GroupKey = tuple[str, str]

# How far (in share) a member's measured share must move before the routes do.
MEASURED_MOVE = 0.02


@dataclass(frozen=True)
class _Plan:
    """What one tick does to a group: the same for every upstream feeding it, so a fully
    connected stage is planned once and only applied per upstream."""

    members: tuple[str, ...]
    active: tuple[str, ...]  # members not being drained
    draining: tuple[str, ...]
    floor: float
    balance_step: float
    heavy: str
    heavy_level: float
    lowest_level: float
    weights: Mapping[str, float]  # receiver -> fraction of the freed share


def rebalance(
    upstream: str,
    stage: str,
    levels: Mapping[str, float],
    shares: Mapping[str, float] | None,
    *,
    policy: Policy,
    draining: Set[str] = frozenset(),
) -> tuple[list[Action], dict[str, float]]:
    """One tick of ``upstream``'s shares over ``stage``'s members (the keys of ``levels``).

    ``shares`` are the shares in force, or None for the default equal split; shares for a
    different set of members (the stage was rescaled) restart from the equal split.
    """
    members = tuple(levels)
    plan = _plan(members, levels, draining, policy)
    if plan is None:
        return [], _in_force(members, shares)
    new, why = _rebalanced(shares, plan, stage)
    return _set_shares(upstream, stage, new, why), new


def shares_tick(
    observation: Observation,
    shares: Mapping[GroupKey, Mapping[str, float]],
    policy: Policy,
) -> tuple[list[Action], dict[GroupKey, dict[str, float]]]:
    """:func:`rebalance` for every upstream and each of its interchangeable groups.

    A group with an unobserved member keeps its shares until every level is known.
    """
    actions: list[Action] = []
    new_shares: dict[GroupKey, dict[str, float]] = {}
    nodes, draining = observation.nodes, observation.draining
    plans: dict[tuple[str, ...], _Plan | None] = {}
    # The upstreams of a shuffle usually hold identical shares: they started equal and
    # saw the same levels every tick. Each outcome is computed once and the same dict is
    # kept for all of them (shares in the state are never mutated, only replaced), so
    # the next tick recognises them by identity instead of comparing 100-entry dicts.
    outcomes: dict[tuple[tuple[str, ...], int | None], tuple[dict[str, float], str | None]] = {}
    for upstream, stage, members in interchangeable_groups(observation.topology):
        key = (upstream, stage)
        current = shares.get(key)
        if members not in plans:
            if all(m in nodes for m in members) and not _one_resource(observation, members):
                levels = {m: nodes[m].level for m in members}
                plans[members] = _plan(members, levels, draining, policy)
            else:
                plans[members] = None
        plan = plans[members]
        if plan is None:
            # Unobserved members, members that share one resource (shifting traffic
            # between them moves no work off it), or every member draining: keep
            # routing as it is.
            if current is not None:
                new_shares[key] = dict(current)
            continue
        outcome_key = (members, None if current is None else id(current))
        if outcome_key not in outcomes:
            outcomes[outcome_key] = _rebalanced(current, plan, stage)
        new, why = outcomes[outcome_key]
        new_shares[key] = new
        actions.extend(_set_shares(upstream, stage, new, why))
    return actions, new_shares


def measured_tick(
    observation: Observation,
    shares: Mapping[GroupKey, Mapping[str, float]],
    policy: Policy,
) -> tuple[list[Action], dict[GroupKey, dict[str, float]]]:
    """Every interchangeable group's shares in proportion to its members' measured
    capacities (a drained member's at 0, every other at least the floor); a group with
    a member not observed or not measured yet keeps the shares in force."""
    actions: list[Action] = []
    new_shares: dict[GroupKey, dict[str, float]] = {}
    targets: dict[tuple[str, ...], dict[str, float] | None] = {}
    for upstream, stage, members in interchangeable_groups(observation.topology):
        key = (upstream, stage)
        current = shares.get(key)
        if members not in targets:
            targets[members] = _measured_shares(observation, members, policy)
        target = targets[members]
        previous = _in_force(members, current)
        if target is None or (
            previous.keys() == target.keys()
            and all(abs(target[m] - previous[m]) <= MEASURED_MOVE for m in members)
        ):
            if current is not None:
                new_shares[key] = dict(current)
            continue
        new_shares[key] = target
        found = stage_capacity(observation, members)
        rates = ", ".join(f"{m} {found.rate_of[found.resource_of[m]] / 2**20:.2f}" for m in members)
        why = f"shares of stage {stage} follow the measured capacities (MB/s: {rates})"
        actions.extend(_set_shares(upstream, stage, target, why))
    return actions, new_shares


def _measured_shares(
    observation: Observation, members: tuple[str, ...], policy: Policy
) -> dict[str, float] | None:
    if not all(m in observation.nodes for m in members):
        return None
    found = stage_capacity(observation, members)
    active = tuple(m for m in members if m not in observation.draining)
    if not found.known or not active:
        return None
    together = {r: sum(1 for m in active if found.resource_of[m] == r) for r in found.rate_of}
    weights = {
        m: found.rate_of[found.resource_of[m]] / together[found.resource_of[m]] for m in active
    }
    total = sum(weights.values())
    new = {m: weights.get(m, 0.0) / total for m in members}
    floor = _floor(len(members), policy.min_share)
    lifted = [m for m in active if new[m] < floor]
    if lifted:
        _lift(new, lifted, active, floor)
    return new


def _one_resource(observation: Observation, members: tuple[str, ...]) -> bool:
    """Every member runs on the same resource, none is being drained (a drained
    member's share goes to its peers whatever they run on) and none is bounded by an
    emulation knob of its own (its rate, or the bandwidth of a link into it)."""
    topology = observation.topology
    if observation.draining & set(members):
        return False
    if any(
        topology.node(m).max_rate_bps
        or any(topology.link(u, m).bandwidth_bps for u in topology.upstreams(m))
        for m in members
    ):
        return False
    return len({observation.nodes[m].resource for m in members}) == 1


def interchangeable_groups(topology: Topology) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(upstream, stage, members)`` for every stage an upstream feeds through 2+ nodes.

    Only mergeable stages qualify: a keyed, non-mergeable operator must see all of a
    key's records, so its traffic cannot be shifted between instances.
    """
    by_stage = topology.downstreams_by_stage
    return [
        (upstream, stage, members)
        for upstream in topology.order
        for stage, members in by_stage[upstream].items()
        if len(members) > 1 and topology.node(members[0]).mergeable
    ]


def _plan(
    members: tuple[str, ...], levels: Mapping[str, float], draining: Set[str], policy: Policy
) -> _Plan | None:
    active = tuple(m for m in members if m not in draining)
    if not active:
        # Draining every member would stop the stage.
        return None
    heavy = max(active, key=levels.__getitem__)
    heavy_level = levels[heavy]
    gaps = {m: heavy_level - levels[m] for m in active if levels[m] < heavy_level}
    total = sum(gaps.values())
    return _Plan(
        members=members,
        active=active,
        draining=tuple(m for m in members if m in draining),
        floor=_floor(len(members), policy.min_share),
        balance_step=policy.balance_step,
        heavy=heavy,
        heavy_level=heavy_level,
        lowest_level=min((levels[m] for m in gaps), default=heavy_level),
        weights={m: gap / total for m, gap in gaps.items()},
    )


def _floor(size: int, min_share: float) -> float:
    return min_share if size * min_share <= 1.0 else 0.5 / size


def _in_force(members: tuple[str, ...], shares: Mapping[str, float] | None) -> dict[str, float]:
    if shares is None:
        return dict.fromkeys(members, 1.0 / len(members))
    return dict(shares)


def _set_shares(upstream: str, stage: str, new: dict[str, float], why: str | None) -> list[Action]:
    if why is None:
        return []
    return [SetShares(reason=why, upstream=upstream, shares=dict(new), stage=stage)]


def _rebalanced(
    shares: Mapping[str, float] | None, plan: _Plan, stage: str
) -> tuple[dict[str, float], str | None]:
    """The shares after this tick, and why they changed (None when they did not)."""
    members = plan.members
    previous = _in_force(members, shares)
    why: list[str] = []
    if previous.keys() == set(members):
        new = dict(previous)
    else:
        new = dict.fromkeys(members, 1.0 / len(members))
        why.append(f"members of stage {stage} changed: shares reset to equal")

    floor = plan.floor
    drained = [m for m in plan.draining if new[m] > 0.0]
    if drained:
        _drain(new, drained, plan.active)
        why.append(f"draining {', '.join(drained)}: their share moved to peers")
    # min() over all values runs at C speed; only look member by member when needed.
    if plan.draining or min(new.values()) < floor:
        lifted = [m for m in plan.active if new[m] < floor]
        if lifted:
            _lift(new, lifted, plan.active, floor)
            why.append(f"{', '.join(lifted)} raised to the minimum share {floor:.3f}")

    moved = min(plan.balance_step * new[plan.heavy], new[plan.heavy] - floor)
    if plan.weights and moved > 0.0:
        new[plan.heavy] -= moved
        for receiver, weight in plan.weights.items():
            new[receiver] += moved * weight
        why.append(
            f"{plan.heavy} has the highest level {plan.heavy_level:.2f} (lowest peer "
            f"{plan.lowest_level:.2f}): {moved:.3f} of its share moved to "
            f"{len(plan.weights)} lower-level peer(s)"
        )

    if new == previous:
        return new, None
    # Renormalise so rounding error cannot accumulate over a long run.
    total = sum(new.values())
    if abs(total - 1.0) > 1e-12:
        new = {m: value / total for m, value in new.items()}
    return new, "; ".join(why)


def _drain(shares: dict[str, float], drained: list[str], active: tuple[str, ...]) -> None:
    freed = sum(shares[m] for m in drained)
    for m in drained:
        shares[m] = 0.0
    # Peers keep their relative split; if they all had nothing, they split it evenly.
    base = sum(shares[m] for m in active)
    for m in active:
        shares[m] += freed * (shares[m] / base if base > 0.0 else 1.0 / len(active))


def _lift(
    shares: dict[str, float], lifted: list[str], active: tuple[str, ...], floor: float
) -> None:
    # A member back from draining (a rolled-back scale-in) starts at the floor; the
    # members above the floor pay for it in proportion to their excess.
    deficit = sum(floor - shares[m] for m in lifted)
    donors = [m for m in active if shares[m] > floor]
    excess = sum(shares[m] - floor for m in donors)
    for m in donors:
        shares[m] -= deficit * (shares[m] - floor) / excess
    for m in lifted:
        shares[m] = floor
