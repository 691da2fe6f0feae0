"""Adaptive high/low watermarks and backpressure flags (docs/spec/watermark-flags.md).

One small state machine per compute node, advanced once per sampling period:

    level >= H  -> flag set; if the duty over the window >= D, raise H and W one step
    level <= W  -> flag cleared; if H is raised (above its range minimum), lower H and W
    otherwise   -> nothing

H and W always move together by one step, each clamped to its own declared range, and
every move empties the duty window.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from balancer.model import Action, ClearFlag, NodeObservation, Observation, SetFlag, SetThresholds
from balancer.policy import PARAMETERS_BY_NAME, Policy


def _declared_range(name: str) -> tuple[float, float]:
    param = PARAMETERS_BY_NAME[name]
    if param.minimum is None or param.maximum is None:
        raise TypeError(f"{name} must declare a closed range to adapt within")
    return param.minimum, param.maximum


HIGH_RANGE = _declared_range("high_water")
LOW_RANGE = _declared_range("low_water")

# Callers pass times as floats accumulated from ticks (0.1 + 0.2 ...); a sample that is
# due up to this much early still counts as due, so sampling stays uniform.
_TIME_SLACK_S = 1e-9


@dataclass(frozen=True, slots=True)
class WatermarkState:
    """One node's thresholds and the samples taken since the last window reset.

    ``sample_times`` (ascending) and ``sample_above`` (level >= H) describe the samples no
    older than the window T, as two parallel tuples so that trimming and counting run at
    C speed over 1,000 nodes. H does not change between resets, so every stored verdict
    is against the current H.
    """

    high_water: float
    low_water: float
    sample_times: tuple[float, ...] = ()
    sample_above: tuple[bool, ...] = ()
    last_sample_s: float | None = None  # kept across resets: sampling stays uniform

    @classmethod
    def initial(cls, policy: Policy) -> WatermarkState:
        return cls(high_water=policy.high_water, low_water=policy.low_water)

    @property
    def duty(self) -> float:
        """Share of the window's samples at or above H (0 for an empty window)."""
        if not self.sample_above:
            return 0.0
        return sum(self.sample_above) / len(self.sample_above)


def watermark_step(
    node: NodeObservation,
    time_s: float,
    state: WatermarkState,
    policy: Policy,
) -> tuple[list[Action], WatermarkState]:
    """Sample ``node`` at ``time_s`` and decide its flag and thresholds.

    The flag the node has now is ``node.flagged`` (what ZooKeeper holds), so flag actions
    are emitted only when they change something and a flag lost elsewhere is restored.
    A call less than one sampling period after the previous sample is ignored: the duty
    is a fraction of uniformly spaced samples.
    """
    if (
        state.last_sample_s is not None
        and time_s - state.last_sample_s < policy.sampling_period_s - _TIME_SLACK_S
    ):
        return [], state

    level, high, low = node.level, state.high_water, state.low_water
    kept = bisect_right(state.sample_times, time_s - policy.bp_window_s)
    sampled = WatermarkState(
        high,
        low,
        (*state.sample_times[kept:], time_s),
        (*state.sample_above[kept:], level >= high),
        time_s,
    )
    actions: list[Action] = []

    if level >= high:
        duty = sampled.duty
        if duty >= policy.duty_ratio:
            new_high, new_low = _move(high, low, +policy.watermark_step)
            sampled = WatermarkState(new_high, new_low, last_sample_s=time_s)
            if (new_high, new_low) != (high, low):
                actions.append(
                    SetThresholds(
                        reason=(
                            f"level {level:.2f} >= high water {high:.2f} "
                            f"(duty {duty:.2f} >= {policy.duty_ratio:.2f}): "
                            f"thresholds raised to {new_high:.2f}/{new_low:.2f}"
                        ),
                        node=node.node,
                        high_water=new_high,
                        low_water=new_low,
                    )
                )
        if not node.flagged:
            actions.append(
                SetFlag(
                    reason=f"level {level:.2f} >= high water {high:.2f}: flag set",
                    node=node.node,
                )
            )
    elif level <= low:
        if high > HIGH_RANGE[0]:
            new_high, new_low = _move(high, low, -policy.watermark_step)
            sampled = WatermarkState(new_high, new_low, last_sample_s=time_s)
            actions.append(
                SetThresholds(
                    reason=(
                        f"level {level:.2f} <= low water {low:.2f} and high water "
                        f"{high:.2f} is raised: thresholds lowered to "
                        f"{new_high:.2f}/{new_low:.2f}"
                    ),
                    node=node.node,
                    high_water=new_high,
                    low_water=new_low,
                )
            )
        if node.flagged:
            actions.append(
                ClearFlag(
                    reason=f"level {level:.2f} <= low water {low:.2f}: flag cleared",
                    node=node.node,
                )
            )
    return actions, sampled


def watermark_tick(
    observation: Observation,
    states: Mapping[str, WatermarkState],
    policy: Policy,
) -> tuple[list[Action], dict[str, WatermarkState]]:
    """:func:`watermark_step` for every observed compute node (sources have no pool).

    Nodes seen for the first time start from the policy's thresholds; nodes no longer
    observed (removed by a rescale) drop out of the returned states.
    """
    actions: list[Action] = []
    new_states: dict[str, WatermarkState] = {}
    sources = {n.id for n in observation.topology.nodes if n.kind == "source"}
    for node_id, node in observation.nodes.items():
        if node_id in sources:
            continue
        state = states.get(node_id) or WatermarkState.initial(policy)
        node_actions, new_states[node_id] = watermark_step(node, observation.time_s, state, policy)
        actions.extend(node_actions)
    return actions, new_states


def flags_after(observation: Observation, actions: list[Action]) -> frozenset[str]:
    """The flagged nodes once ``actions`` are applied to the observed flags."""
    flagged = {node_id for node_id, node in observation.nodes.items() if node.flagged}
    for action in actions:
        if isinstance(action, SetFlag):
            flagged.add(action.node)
        elif isinstance(action, ClearFlag):
            flagged.discard(action.node)
    return frozenset(flagged)


def _move(high: float, low: float, step: float) -> tuple[float, float]:
    # Rounding keeps repeated 0.1 steps on the decimal grid the operator configured
    # (0.7 + 0.1 must read back as 0.8, not 0.7999999999999999).
    return (
        round(_clamp(high + step, *HIGH_RANGE), 9),
        round(_clamp(low + step, *LOW_RANGE), 9),
    )


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, value))
