"""The two flow-control baselines of the reference experiment (pressure-migration.md).

Credit-based flow control (as in Flink): every credit interval each downstream's free
queue space becomes its upstreams' credit, split evenly when several upstreams share the
queue, so together they can never overfill it. An upstream sends only what its credit
allows until the next grant (a grant replaces the previous one; credit does not pile up).

    b1: capacity 8 MB, queued 2 MB, upstreams a1, a2  ->  a1 may send 3 MB, a2 3 MB

Stop/resume: a node whose queue is full stops its upstreams (SetRate 0); once it has
drained to 50% it lets them resume (SetRate 1). An upstream stays stopped while any of
its downstreams is still full or draining.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from balancer.model import Action, Observation, SetCredits, SetRate
from balancer.policy import Policy
from balancer.topology import Topology
from balancer.units import MB

# The experiment's resume point. Not (yet) a Policy field: see docs/balancing.md.
RESUME_LEVEL = 0.5

# See balancer.watermark: float tick times may land a hair before a period boundary.
_TIME_SLACK_S = 1e-9


@dataclass(frozen=True)
class CreditState:
    """When credit was last granted (grants are paced by the credit interval)."""

    last_grant_s: float | None = None


@dataclass(frozen=True)
class StopResumeState:
    """Nodes that filled up and have not yet drained to :data:`RESUME_LEVEL`."""

    holding: frozenset[str] = frozenset()


def credit_step(
    observation: Observation, state: CreditState, policy: Policy
) -> tuple[list[Action], CreditState]:
    """Grant every upstream its credit per downstream, once per credit interval.

    A downstream missing from the observation grants nothing: without its queue size
    any credit could overfill it.
    """
    now = observation.time_s
    if (
        state.last_grant_s is not None
        and now - state.last_grant_s < policy.credit_interval_ms / 1000 - _TIME_SLACK_S
    ):
        return [], state
    buffered = {node_id: node.buffered_bytes for node_id, node in observation.nodes.items()}
    return list(credit_grants(observation.topology, buffered)), CreditState(now)


def credit_grants(topology: Topology, buffered: Mapping[str, float]) -> list[SetCredits]:
    """Every upstream's credit per downstream from the bytes each queue holds now
    (``buffered``; a downstream missing from it grants nothing): its free space, split
    evenly among the upstreams that share it. A runtime whose queues free up between
    two of the balancer's ticks grants at the credit interval with this alone, as the
    simulator's credit controller does."""
    share_of_free = {
        node_id: max(0.0, topology.node(node_id).capacity_bytes - queued)
        / (len(topology.upstreams(node_id)) or 1)
        for node_id, queued in buffered.items()
    }
    # Upstreams of one shuffle feed the same downstreams and so get the same credits:
    # build each distinct grant once and share it (actions are read-only).
    grants: dict[tuple[str, ...], tuple[Mapping[str, float], str]] = {}
    actions: list[SetCredits] = []
    for upstream in topology.order:
        downstreams = topology.downstreams(upstream)
        if not downstreams:
            continue
        if downstreams not in grants:
            grant = MappingProxyType({d: share_of_free.get(d, 0.0) for d in downstreams})
            tightest = min(grant, key=grant.__getitem__)
            grants[downstreams] = (
                grant,
                f"free queue space of {len(grant)} downstream(s), shared with their "
                f"other upstreams: {sum(grant.values()) / MB:.2f} MB in all, "
                f"least {grant[tightest] / MB:.2f} MB to {tightest}",
            )
        credits, reason = grants[downstreams]
        actions.append(SetCredits(reason=reason, upstream=upstream, credits=credits))
    return actions


def stop_resume_step(
    observation: Observation, state: StopResumeState
) -> tuple[list[Action], StopResumeState]:
    """Stop the upstreams of full queues; resume them once those drained to 50%."""
    nodes, topology = observation.nodes, observation.topology
    holding = frozenset(
        node_id
        for node_id, node in nodes.items()
        if node.level >= 1.0 or (node_id in state.holding and node.level > RESUME_LEVEL)
    )
    actions: list[Action] = []
    for upstream in topology.order:
        downstreams = topology.downstreams(upstream)
        was = [d for d in downstreams if d in state.holding]
        now = [d for d in downstreams if d in holding]
        if now and not was:
            levels = ", ".join(f"{d} {nodes[d].level:.2f}" for d in now)
            actions.append(
                SetRate(
                    reason=f"queue full ({levels}): upstream {upstream} stopped",
                    node=upstream,
                    coefficient=0.0,
                )
            )
        elif was and not now:
            actions.append(
                SetRate(
                    reason=(
                        f"{', '.join(was)} drained to {RESUME_LEVEL:.0%} or less: "
                        f"upstream {upstream} resumed"
                    ),
                    node=upstream,
                    coefficient=1.0,
                )
            )
    return actions, StopResumeState(holding)
