"""Backpressure relief by migrating data to light branches (docs/spec/pressure-migration.md).

Every balancer tick :func:`migration_step` looks at the observation and decides which
branch nodes send part of a heavy branch's data through other branches:

1. *Detection*: a node is a backpressure node when its queue usage ``Q`` is above
   ``bp_threshold`` **and** more bytes came in than went out over the tick.
2. *Tracing*: from a backpressure node walk upstream to the first *branch node* (a node
   with more than one downstream); the path from that branch node's child down to the
   backpressure node is the *heavy branch*.
3. *Scoring*: every branch leaving the branch node gets the pressure score
   ``P = (alpha*Q + (1-alpha)*gap) / b**beta`` (normalised, see :func:`pressure_score`).
4. *Light branch*: the lowest score among the branches that are not heavy and share no
   resource with the heavy one (``NodeObservation.resource``: data moved to a branch
   whose batches the same Spark worker runs would wait for the same cores).
5. *Recovery*: every ``recovery_check`` ticks a backpressure node whose ``Q`` is below
   ``recovery_threshold`` gets its branch back (:class:`StopMigration`); otherwise the
   migration goes on.

``policy.migration`` picks the plan: ``"pressure"`` is the published mechanism above
(all of ``migration_share`` to one light branch, triggered at ``bp_threshold``);
``"proportional"`` is ours (:func:`proportional_plan`): every tick, from the tags of the
data about to leave the branch node, it moves only what each branch cannot take at its
capacity (and a queue draining in step with the others), spread over every branch with
room; ``"off"`` ends any migration still running. Branches that share a resource with a
sibling are left out of the plan. A branch's capacity is declared (the emulation knobs)
or measured (each node's true processing rate, balancer/capacity.py).

A *branch* of a branch node ``b`` starts at one child ``c`` of ``b`` and follows the chain
of nodes below ``c`` while each has exactly one downstream that has exactly one upstream;
its links are ``b -> c``, the chain's links and the links leaving the chain's last node
(into the merge node). This is the "path of nodes and links" the score is computed over;
the heavy branch reported in the action is the spec's path from ``c`` to the backpressure
node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from balancer.model import (
    Action,
    NodeObservation,
    Observation,
    StartMigration,
    StopMigration,
)
from balancer.policy import Policy
from balancer.topology import Topology


@dataclass(frozen=True)
class Branch:
    """One branch leaving ``branch_node``: its nodes (first the child) and links."""

    branch_node: str
    nodes: tuple[str, ...]
    links: tuple[tuple[str, str], ...]

    @property
    def child(self) -> str:
        return self.nodes[0]


@dataclass(frozen=True)
class Migration:
    """A migration under way: ``share`` of what ``branch_node`` routes into ``heavy[0]``
    goes to the light branches ``targets`` (first node -> fraction of the moved data)."""

    branch_node: str
    heavy: tuple[str, ...]
    backpressure_node: str
    light: tuple[str, ...]
    share: float
    targets: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MigrationState:
    """What :func:`migration_step` remembers between ticks.

    ``tick`` counts calls (the recovery check runs when it is a multiple of
    ``recovery_check``); ``active`` holds one entry per heavy branch being relieved, so the
    BP list is the entries' ``backpressure_node``.
    """

    tick: int = 0
    active: tuple[Migration, ...] = ()

    @property
    def bp_list(self) -> tuple[str, ...]:
        return tuple(m.backpressure_node for m in self.active)


def migration_step(
    observation: Observation, state: MigrationState, policy: Policy
) -> tuple[list[Action], MigrationState]:
    """One balancer tick of data migration; see the module docstring."""
    if policy.migration == "pressure":
        return _pressure_step(observation, state, policy)
    if policy.migration == "proportional":
        return _proportional_step(observation, state, policy)
    stops: list[Action] = [_stop(m, "migration is off for this run") for m in state.active]
    return stops, MigrationState(tick=state.tick + 1)


# --- detection, tracing, branches --------------------------------------------------------


def is_backpressure_node(node: NodeObservation, policy: Policy) -> bool:
    """``Q > bp_threshold`` and input faster than output over the last tick."""
    return node.level > policy.bp_threshold and node.in_rate > node.out_rate


def trace_heavy_branch(topology: Topology, bp_node: str) -> tuple[str, tuple[str, ...]] | None:
    """``(branch_node, heavy path from its child down to bp_node)``, or None.

    None when walking up meets a source or a merge (a node with several upstreams)
    before any branch node: then no single branch carries the pressure and there is
    nothing to migrate away from.
    """
    path = [bp_node]
    current = bp_node
    while True:
        ups = topology.upstreams(current)
        if len(ups) != 1:
            return None
        parent = ups[0]
        if len(topology.downstreams(parent)) > 1:
            return parent, tuple(reversed(path))
        path.append(parent)
        current = parent


def branches_of(topology: Topology, branch_node: str) -> tuple[Branch, ...]:
    """Every branch leaving ``branch_node``, in the order of its downstream links."""
    branches = []
    for child in topology.downstreams(branch_node):
        nodes = [child]
        links = [(branch_node, child)]
        current = child
        while True:
            downs = topology.downstreams(current)
            if len(downs) != 1 or len(topology.upstreams(downs[0])) != 1:
                links.extend((current, d) for d in downs)
                break
            links.append((current, downs[0]))
            current = downs[0]
            nodes.append(current)
        branches.append(Branch(branch_node, tuple(nodes), tuple(links)))
    return tuple(branches)


def branch_capacity(
    topology: Topology, branch: Branch, nodes: Mapping[str, NodeObservation] | None = None
) -> float:
    """The branch's bottleneck in bytes per second of what enters it (``math.inf`` when
    nothing limits it).

    The minimum over its entry and chain links, the total of the links leaving its last
    node, and the processing capacity of its nodes: a node that can process only ``r``
    bytes per second narrows the path exactly like a link of bandwidth ``r``. A node's
    capacity is its declared emulation limit (``max_rate_mbps``) where one is set, else
    what ``nodes`` (the observation) measured it to be (``capacity_bps``: its true
    processing rate, balancer/capacity.py). Each is counted in the branch's input bytes:
    after a node that sends on a twentieth of what it takes in (its measured
    ``reduction``), a link carries twenty times its bandwidth of the branch's input.
    """
    shares_in, shares_out = topology.source_shares
    entering = shares_in[branch.nodes[0]]
    last = branch.nodes[-1]
    exits = [lk for lk in branch.links if lk[0] == last]
    path_links = [lk for lk in branch.links if lk[0] != last]
    limits = [
        _of_input(_bandwidth(topology, src, dst), shares_out[src], entering)
        for src, dst in path_links
    ]
    if exits:
        out = sum(_bandwidth(topology, src, dst) for src, dst in exits)
        limits.append(_of_input(out, shares_out[last], entering))
    limits.extend(
        _of_input(node_capacity(topology, n, nodes), shares_in[n], entering) for n in branch.nodes
    )
    return min(limits)


def node_capacity(
    topology: Topology, node: str, nodes: Mapping[str, NodeObservation] | None = None
) -> float:
    """Bytes per second of its input ``node`` can process: its declared emulation limit,
    else its measured capacity, else ``math.inf``."""
    declared = topology.node(node).max_rate_bps
    if declared:
        return declared
    observed = nodes.get(node) if nodes is not None else None
    return observed.capacity_bps if observed is not None else math.inf


def branch_resources(observation: Observation, branch: Branch) -> frozenset[str]:
    """What the branch's nodes run on (NodeObservation.resource). A branch with an
    emulation knob (a node rate or a link bandwidth) is bounded by it, a resource of
    its own, whatever its nodes run on."""
    topology = observation.topology
    if any(topology.node(n).max_rate_bps for n in branch.nodes) or any(
        topology.link(src, dst).bandwidth_bps for src, dst in branch.links
    ):
        return frozenset({f"emulated {branch.branch_node}->{branch.child}"})
    return frozenset(observation.nodes[n].resource for n in branch.nodes if n in observation.nodes)


def share_resources(observation: Observation, one: Branch, other: Branch) -> bool:
    """Whether two branches run (in part) on one resource: data moved from one to the
    other would be worked on by the same cores, so moving it relieves nothing."""
    return bool(branch_resources(observation, one) & branch_resources(observation, other))


def _of_input(capacity_bps: float, share: float, entering: float) -> float:
    """A capacity in bytes of the branch's input, where ``share`` of the source's bytes
    reach it and ``entering`` of them enter the branch."""
    return capacity_bps * entering / share if share > 0 else math.inf


def _bandwidth(topology: Topology, src: str, dst: str) -> float:
    return topology.link(src, dst).bandwidth_bps or math.inf


# --- the score ----------------------------------------------------------------------------


def pressure_score(
    queue_usage: float, rate_gap: float, bandwidth_ratio: float, alpha: float, beta: float
) -> float:
    """Branch pressure ``P = (alpha*Q + (1-alpha)*gap) / b**beta``, on normalised inputs.

    The published formula mixes units (a fraction, bytes per second, bits per second);
    the product normalises every input so that ``alpha`` really weighs queue usage
    against the rate gap (ADR: normalised pressure score):

    * ``queue_usage`` Q in [0, 1]: the fullest queue of the branch;
    * ``rate_gap`` in [-1, 1]: (bytes in - bytes out) per second divided by the branch's
      input capacity (the bandwidth of the link into the branch);
    * ``bandwidth_ratio`` b in (0, 1]: the branch's bottleneck divided by the largest
      bottleneck among the branches competing at the same branch node.

    The numerator is negative for a branch draining faster than it fills. Dividing a
    negative numerator by ``b**beta < 1`` would make a narrow draining branch look
    *lighter* than a wide one in the same state; so a negative numerator is multiplied by
    ``b**beta`` instead. The score is then non-decreasing in Q and in the gap and
    non-increasing in b for every input (strictly decreasing in b unless the numerator is
    0), and equals the published form whenever the branch is filling.
    """
    numerator = alpha * queue_usage + (1.0 - alpha) * rate_gap
    # typeshed types float ** float as Any (a negative base gives a complex); b > 0 here.
    factor: float = bandwidth_ratio**beta
    return numerator / factor if numerator >= 0 else numerator * factor


def score_branches(
    observation: Observation, branches: Iterable[Branch], policy: Policy
) -> dict[str, float]:
    """Pressure score of each branch, keyed by its first node (see :func:`pressure_score`).

    Unlimited bottlenecks count as the largest finite one among the competitors (or all
    as 1 when none is finite), so an unlimited branch gets ``b = 1``.
    """
    branches = tuple(branches)
    topology = observation.topology
    capacities = [branch_capacity(topology, b, observation.nodes) for b in branches]
    finite = [c for c in capacities if math.isfinite(c)]
    widest = max(finite, default=1.0)
    scores = {}
    for branch, capacity in zip(branches, capacities, strict=True):
        nodes = [observation.nodes[n] for n in branch.nodes]
        queue_usage = max(n.level for n in nodes)
        in_rate, out_rate = nodes[0].in_rate, nodes[-1].out_rate
        entry = topology.link(branch.branch_node, branch.child).bandwidth_bps
        # An unlimited entry link has no capacity to compare with: the larger of the two
        # rates then stands for it, which still keeps the gap within [-1, 1].
        scale = entry or max(in_rate, out_rate)
        gap = (in_rate - out_rate) / scale if scale > 0 else 0.0
        gap = min(1.0, max(-1.0, gap))
        ratio = (capacity if math.isfinite(capacity) else widest) / widest
        scores[branch.child] = pressure_score(queue_usage, gap, ratio, policy.alpha, policy.beta)
    return scores


# --- the published mechanism ----------------------------------------------------------------


def _pressure_step(
    observation: Observation, state: MigrationState, policy: Policy
) -> tuple[list[Action], MigrationState]:
    topology = observation.topology
    tick = state.tick + 1
    actions: list[Action] = []
    active = list(state.active)

    if tick % policy.recovery_check == 0:
        relieved = [
            m for m in active if observation.level(m.backpressure_node) < policy.recovery_threshold
        ]
        for m in relieved:
            level = observation.level(m.backpressure_node)
            actions.append(
                _stop(
                    m,
                    f"{m.backpressure_node} relieved: Q {level:.2f} < "
                    f"{policy.recovery_threshold:.2f}, default routing restored",
                )
            )
            active.remove(m)

    detected: list[tuple[str, str, tuple[str, ...]]] = []
    for node_id in topology.order:
        if is_backpressure_node(observation.nodes[node_id], policy):
            traced = trace_heavy_branch(topology, node_id)
            if traced is not None:
                detected.append((node_id, *traced))

    heavy = {(m.branch_node, m.heavy[0]) for m in active}
    heavy.update((b, path[0]) for _, b, path in detected)
    scored: dict[str, tuple[tuple[Branch, ...], dict[str, float]]] = {}

    for bp_node, branch_node, path in detected:
        if any(m.branch_node == branch_node and m.heavy[0] == path[0] for m in active):
            continue  # already relieving this branch: keep migrating, keep monitoring
        planned = _plan_light(observation, branch_node, heavy, policy, scored)
        if planned is None:
            continue
        light, scores = planned
        migration = Migration(branch_node, path, bp_node, light.nodes, policy.migration_share, {})
        active.append(migration)
        node = observation.nodes[bp_node]
        actions.append(
            _start(
                migration,
                scores,
                f"{bp_node} in backpressure (Q {node.level:.2f} > {policy.bp_threshold:.2f}, "
                f"in {node.in_rate:.0f} > out {node.out_rate:.0f} B/s): "
                f"{policy.migration_share:.0%} of {branch_node}->{path[0]} goes to "
                f"{light.child} (lowest pressure {scores[light.child]:.3f})",
            )
        )

    # A light branch that has since become heavy must not keep receiving the excess.
    for index, m in enumerate(active):
        if (m.branch_node, m.light[0]) not in heavy:
            continue
        planned = _plan_light(observation, m.branch_node, heavy, policy, scored)
        if planned is None:
            continue
        light, scores = planned
        moved = Migration(m.branch_node, m.heavy, m.backpressure_node, light.nodes, m.share, {})
        active[index] = moved
        actions.append(
            _start(
                moved,
                scores,
                f"light branch {m.light[0]} became heavy: {m.branch_node}->{m.heavy[0]} "
                f"now goes to {light.child} (lowest pressure {scores[light.child]:.3f})",
            )
        )

    return actions, MigrationState(tick=tick, active=tuple(active))


def _plan_light(
    observation: Observation,
    branch_node: str,
    heavy: set[tuple[str, str]],
    policy: Policy,
    scored: dict[str, tuple[tuple[Branch, ...], dict[str, float]]],
) -> tuple[Branch, dict[str, float]] | None:
    """The light branch of ``branch_node`` and every branch's score, or None if none is.

    ``scored`` keeps each branch node's branches and scores for the rest of the tick:
    many backpressure nodes under one branch node share one scoring.
    """
    topology = observation.topology
    if branch_node not in scored:
        branches = branches_of(topology, branch_node)
        scored[branch_node] = (branches, score_branches(observation, branches, policy))
    branches, scores = scored[branch_node]
    heavy_branches = [b for b in branches if (branch_node, b.child) in heavy]
    candidates = [
        b
        for b in branches
        if (branch_node, b.child) not in heavy
        and _mergeable(topology, b.nodes)
        and not any(share_resources(observation, b, h) for h in heavy_branches)
    ]
    if not candidates:
        return None
    # min() keeps the first of equal scores: ties go to the first downstream link.
    return min(candidates, key=lambda b: scores[b.child]), scores


def _mergeable(topology: Topology, nodes: Iterable[str]) -> bool:
    # A stage whose operator cannot merge partial results never takes migrated data.
    return all(topology.node(n).mergeable for n in nodes)


def _start(migration: Migration, scores: Mapping[str, float], reason: str) -> StartMigration:
    return StartMigration(
        reason=reason,
        branch_node=migration.branch_node,
        heavy=migration.heavy,
        light=migration.light,
        share=migration.share,
        backpressure_node=migration.backpressure_node,
        scores=dict(scores),
        targets=dict(migration.targets),
    )


def _stop(migration: Migration, reason: str) -> StopMigration:
    return StopMigration(
        reason=reason,
        branch_node=migration.branch_node,
        heavy=migration.heavy,
        backpressure_node=migration.backpressure_node,
    )


# --- ours: proportional migration -------------------------------------------------------------


@dataclass(frozen=True)
class BranchPlan:
    """How much of one branch's routed data moves, and where (see :func:`proportional_plan`)."""

    child: str
    share: float
    targets: Mapping[str, float]


def proportional_plan(
    demand: Mapping[str, float],
    capacity: Mapping[str, float],
    *,
    queued: Mapping[str, float],
    horizon_s: float,
) -> list[BranchPlan]:
    """Split the coming data of one branch node so that every branch stays busy, all
    would finish together, and as little data as possible leaves its branch.

    ``demand``: bytes per second the branch node is about to route into each branch by
    default (its data's tags); ``capacity``: each branch's bottleneck (bytes/s);
    ``queued``: bytes waiting in each branch's first queue.

    * Branch ``i`` is *offered* its part of the demand by capacity, ``c_i * D / C``,
      plus the correction that brings its queue to the common drain time ``Q / C``
      (``Q`` all queued bytes) within ``horizon_s``: ``(c_i * Q / C - q_i) / horizon_s``.
      The corrections sum to zero, so together the offers take exactly the demand.
      Equal drain *times*, not equal queue fractions: when the data runs out every
      branch empties at once, instead of a narrow branch working alone through a full
      queue while the wide ones idle.
    * What a branch is not offered moves to the branches offered more than their own
      demand, in proportion to that room. Since the offers sum to the demand, the room
      always covers the excess.

    A branch used to keep its own surplus up to a band (the published hysteresis) above
    the common drain time, so that a short surplus would wait instead of moving for
    good. Live, with one Spark worker for every branch, that surplus was what the hot
    branch was still working through when the others had finished: 1.34x the live
    bound, against 1.14x without it, and on the simulator's 5 GB table 1.005x against
    1.002x (docs/benchmarks.md, "ours without the band").
    """
    total_demand = sum(demand.values())
    total_capacity = sum(capacity.values())
    if total_demand <= 0 or total_capacity <= 0 or horizon_s <= 0:
        return []
    drain_s = sum(queued.values()) / total_capacity
    fair = {c: cap * total_demand / total_capacity for c, cap in capacity.items()}
    offered = {
        c: max(0.0, fair[c] + (cap * drain_s - queued[c]) / horizon_s)
        for c, cap in capacity.items()
    }
    # A queue far above its share can push its offer below zero; the clipped offers are
    # rescaled so that together they still take the whole demand.
    scale = total_demand / sum(offered.values())
    offered = {c: o * scale for c, o in offered.items()}
    excess = {c: max(0.0, demand.get(c, 0.0) - offered[c]) for c in capacity}
    room = {c: max(0.0, offered[c] - demand.get(c, 0.0)) for c in capacity}
    total_room = sum(room.values())
    if sum(excess.values()) <= 0 or total_room <= 0:
        return []
    targets = {c: r / total_room for c, r in room.items() if r > 0}
    return [BranchPlan(child, e / demand[child], targets) for child, e in excess.items() if e > 0]


def _proportional_step(
    observation: Observation, state: MigrationState, policy: Policy
) -> tuple[list[Action], MigrationState]:
    topology = observation.topology
    actions: list[Action] = []
    active: list[Migration] = []
    previous = {(m.branch_node, m.heavy[0]): m for m in state.active}

    for branch_node in topology.order:
        if len(topology.downstreams(branch_node)) < 2:
            continue
        branches = [
            b
            for b in branches_of(topology, branch_node)
            if _mergeable(topology, b.nodes) and not _shares_any(observation, b, branch_node)
        ]
        if len(branches) < 2:
            continue  # nothing to choose between
        plan = _plan_for(observation, branch_node, branches, policy)
        scores = score_branches(observation, branches, policy)
        by_child = {b.child: b for b in branches}
        for item in plan:
            key = (branch_node, item.child)
            # Whole percents: a plan that only wobbles in the estimate's noise is not
            # re-sent (and logged as an event) every tick.
            share = round(item.share, 2)
            targets = {c: round(f, 2) for c, f in item.targets.items()}
            if share <= 0:
                continue
            light = by_child[max(targets, key=lambda c: targets[c])].nodes
            migration = Migration(branch_node, (item.child,), item.child, light, share, targets)
            active.append(migration)
            old = previous.pop(key, None)
            if old is not None and (old.share, dict(old.targets)) == (share, targets):
                continue  # same plan as last tick: nothing for the router to change
            spread = ", ".join(f"{c} {f:.0%}" for c, f in targets.items())
            actions.append(
                _start(
                    migration,
                    scores,
                    f"predicted excess of {branch_node}->{item.child} over what it can "
                    f"take: {share:.0%} of it goes to {spread} by spare capacity",
                )
            )
    for m in previous.values():
        actions.append(_stop(m, f"{m.branch_node}->{m.heavy[0]} fits its capacity again"))
    return actions, MigrationState(tick=state.tick + 1, active=tuple(active))


def _shares_any(observation: Observation, branch: Branch, branch_node: str) -> bool:
    """Whether ``branch`` shares a resource with another branch of ``branch_node``: the
    plan's capacities would count that resource once per branch."""
    return any(
        other.child != branch.child and share_resources(observation, branch, other)
        for other in branches_of(observation.topology, branch_node)
    )


def _plan_for(
    observation: Observation, branch_node: str, branches: list[Branch], policy: Policy
) -> list[BranchPlan]:
    head = observation.nodes[branch_node].head_by_route
    topology = observation.topology
    capacity = {b.child: branch_capacity(topology, b, observation.nodes) for b in branches}
    if not all(map(math.isfinite, capacity.values())):
        return []
    # Times in seconds of the tightest queue (the one holding the fewest seconds of its
    # branch's work). Imbalances are corrected over the time it takes to drain from full
    # to the recovery threshold: slow enough not to swing a queue from full to relieved
    # on one noisy estimate, fast enough to act within a few ticks.
    total_capacity = sum(capacity.values())
    tightest_s = min(topology.node(c).capacity_bytes / capacity[c] for c in capacity)
    horizon_s = (1 - policy.recovery_threshold) * tightest_s
    # What is coming per branch: what arrives (last interval's rate) plus what is queued
    # at the head, spread over the horizon. The branch node cannot send more than the
    # branches take together, so the demand is that mix scaled to at most their total.
    arriving = observation.nodes[branch_node].in_rate_by_route
    coming = {c: arriving.get(c, 0.0) + head.get(c, 0.0) / horizon_s for c in capacity}
    total = sum(coming.values())
    if total <= 0:
        return []
    rate = min(total_capacity, total)
    demand = {c: rate * v / total for c, v in coming.items()}
    queued = {c: observation.nodes[c].buffered_bytes for c in capacity}
    return proportional_plan(demand, capacity, queued=queued, horizon_s=horizon_s)


def operator_migration(
    observation: Observation, node: str, policy: Policy, who: str
) -> StartMigration | None:
    """An operator's "migrate this branch's data now" for the branch holding ``node``.

    The light branch is chosen exactly as for a detected backpressure node (lowest
    pressure score among the other branches of the same branch node); None when ``node``
    sits on no branch (nothing to migrate away from).
    """
    traced = trace_heavy_branch(observation.topology, node)
    if traced is None:
        return None
    branch_node, heavy = traced
    others = [b for b in branches_of(observation.topology, branch_node) if b.nodes[0] != heavy[0]]
    if not others:
        return None
    scores = score_branches(observation, others, policy)
    light = min(others, key=lambda b: (scores[b.nodes[0]], b.nodes[0]))
    return StartMigration(
        reason=(
            f"operator {who} asked to migrate the data of branch {' > '.join(heavy)}; "
            f"lightest other branch {light.nodes[0]} (pressure {scores[light.nodes[0]]:.3f})"
        ),
        branch_node=branch_node,
        heavy=heavy,
        light=light.nodes,
        share=policy.migration_share,
        backpressure_node=node,
        scores=scores,
    )
