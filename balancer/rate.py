"""Upstream rate coefficient k and the scale-out trigger (docs/spec/watermark-flags.md).

Every upstream sends at ``k * r_max``. At each check it counts the flags of its direct
downstreams and compares with the previous count; a check that finds a new count acts on
it and is the last one for a sampling period, so k moves at most once per period:

    fewer flags  -> k = min(1, k + step)
    more flags   -> k >= k_min and above the floor: k = max(floor, k - step)
                    otherwise: one more instance for every downstream stage whose
                    flagged share is >= S (a hot scale-out, hot-rescale.md)
    same count   -> nothing

The spec puts no floor under k; we keep ``rate_floor`` so data never stops flowing. An
upstream already at the floor cannot slow down any further, so it takes the scale-out
branch even when the floor equals k_min (otherwise that policy could never scale out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from balancer.model import Action, Observation, ScaleOutRequest, SetRate
from balancer.policy import Policy
from balancer.topology import Topology

# How a request's reason ends; a request sized from measured rates says its own count.
ONE_MORE = "one more instance requested"

# See balancer.watermark: float tick times may land a hair before a period boundary.
_TIME_SLACK_S = 1e-9


@dataclass(frozen=True, slots=True)
class RateState:
    """One upstream's coefficient and the flag count it saw at its last check."""

    coefficient: float
    flagged_count: int = 0
    last_check_s: float | None = None

    @classmethod
    def initial(cls, policy: Policy) -> RateState:
        return cls(coefficient=policy.rate_initial)


def rate_step(
    upstream: str,
    flagged: frozenset[str],
    topology: Topology,
    *,
    time_s: float,
    state: RateState,
    policy: Policy,
) -> tuple[list[Action], RateState]:
    """Check ``upstream`` against the currently ``flagged`` nodes at ``time_s``."""
    if (
        state.last_check_s is not None
        and time_s - state.last_check_s < policy.sampling_period_s - _TIME_SLACK_S
    ):
        return [], state

    downstreams = topology.downstreams(upstream)
    count = len(flagged.intersection(downstreams))
    previous, k = state.flagged_count, state.coefficient
    if count == previous:
        # No flag event for this upstream: nothing to pace, nothing to remember.
        return [], state
    change = f"flagged downstreams {previous} -> {count}"
    actions: list[Action] = []
    new_k = k
    if count < previous:
        new_k = round(min(1.0, k + policy.rate_step), 9)
        if new_k != k:
            actions.append(
                SetRate(
                    reason=f"{change}: rate coefficient raised {k:.2f} -> {new_k:.2f}",
                    node=upstream,
                    coefficient=new_k,
                )
            )
    elif policy.rate_min <= k and k > policy.rate_floor:  # more flags, room to slow down
        new_k = round(max(policy.rate_floor, k - policy.rate_step), 9)
        actions.append(
            SetRate(
                reason=f"{change}: rate coefficient lowered {k:.2f} -> {new_k:.2f}",
                node=upstream,
                coefficient=new_k,
            )
        )
    else:  # more flags, and k is below k_min or at its floor
        flagged_down = [d for d in downstreams if d in flagged]
        actions.extend(_scale_out_requests(upstream, flagged_down, topology, k, policy))
    return actions, RateState(new_k, count, time_s)


def rate_tick(
    observation: Observation,
    flagged: frozenset[str],
    states: Mapping[str, RateState],
    policy: Policy,
) -> tuple[list[Action], dict[str, RateState]]:
    """:func:`rate_step` for every node that has direct downstreams."""
    topology = observation.topology
    actions: list[Action] = []
    new_states: dict[str, RateState] = {}
    for node_id in topology.order:
        if not topology.downstreams(node_id):
            continue
        state = states.get(node_id) or RateState.initial(policy)
        node_actions, new_states[node_id] = rate_step(
            node_id, flagged, topology, time_s=observation.time_s, state=state, policy=policy
        )
        actions.extend(node_actions)
    return actions, new_states


def _scale_out_requests(
    upstream: str,
    flagged_down: list[str],
    topology: Topology,
    k: float,
    policy: Policy,
) -> list[Action]:
    flagged_by_stage: dict[str, int] = {}
    for node_id in flagged_down:
        stage = topology.node(node_id).stage_name
        flagged_by_stage[stage] = flagged_by_stage.get(stage, 0) + 1
    why = (
        f"rate coefficient {k:.2f} < k_min {policy.rate_min:.2f}"
        if k < policy.rate_min
        else f"rate coefficient {k:.2f} is at the floor {policy.rate_floor:.2f}"
    )
    requests: list[Action] = []
    for stage, flagged_count in flagged_by_stage.items():
        members = len(topology.stage_members(stage))
        if flagged_count / members >= policy.scale_out_ratio:
            requests.append(
                ScaleOutRequest(
                    reason=(
                        f"{why} and {flagged_count}/{members} of stage {stage} flagged "
                        f">= {policy.scale_out_ratio:.2f}: {ONE_MORE}"
                    ),
                    stage=stage,
                    upstream=upstream,
                )
            )
    return requests
