"""Dynamic stepwise backpressure of direct upstreams (docs/spec/stepwise-backpressure.md).

The balancer evaluates every task at most once per sensitivity period and emits
:class:`~balancer.model.StepwiseSignal` messages for the task-message queue; the handler
that consumes a message applies it to its target with :func:`apply_signal` and writes the
target's new task state, which comes back in the next observation
(``NodeObservation.speed``, ``origin_speed``, ``in_backpressure``)::

    task t overloaded (buffer >= overload)        -> "slow" to each direct upstream u
    t underloaded for >= sensitivity              -> "restore" to each u in backpressure
    target u, on "slow":    origin_v = speed if not yet in backpressure;
                            speed = max(floor, v * speed); in backpressure
    target u, on "restore": speed = min(origin_v, speed / v); out of backpressure at origin_v

A target with a signal still in flight gets no new one: the spec's "slow-down pending"
rule, extended to restores so that at most one signal per target is in flight and two
contradicting signals cannot cross. A signal counts as in flight until the target's
reported state changes (every applied signal changes it) or one sensitivity period has
passed (the message was lost; a late one still keeps speeds within bounds).

The spec names no speed floor; repeated halving would reach zero, so a task never goes
below ``rate_floor * origin_v`` (the same floor the rate coefficient keeps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from balancer.model import NodeObservation, Observation, SetSpeed, StepwiseSignal
from balancer.policy import Policy
from balancer.units import MB

# See balancer.watermark: float tick times may land a hair before a period boundary.
_TIME_SLACK_S = 1e-9
# Speeds are compared after multiplying and dividing by v; restore must land exactly on
# origin_v even when (origin * v) / v is off in the last bit.
_SPEED_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class TaskSpeed:
    """The state a task keeps locally and writes for its neighbours."""

    speed: float = 1.0
    origin_speed: float = 1.0
    in_backpressure: bool = False

    @classmethod
    def of(cls, node: NodeObservation) -> TaskSpeed:
        return cls(node.speed, node.origin_speed, node.in_backpressure)


@dataclass(frozen=True, slots=True)
class PendingSignal:
    """A signal sent to a target and not yet seen applied."""

    signal: Literal["slow", "restore"]
    sent_s: float
    seen: TaskSpeed  # the target's reported state when the signal was sent


@dataclass(frozen=True)
class StepwiseState:
    """When each task was last evaluated, since when it has been underloaded, and the
    signals still on their way, by target."""

    last_eval_s: Mapping[str, float] = field(default_factory=dict)
    underload_since_s: Mapping[str, float] = field(default_factory=dict)
    in_flight: Mapping[str, PendingSignal] = field(default_factory=dict)


def speed_floor(origin_speed: float, policy: Policy) -> float:
    return policy.rate_floor * origin_speed


def stepwise_step(
    observation: Observation,
    state: StepwiseState,
    policy: Policy,
) -> tuple[list[StepwiseSignal], StepwiseState]:
    """Evaluate every task that is due and signal its direct upstreams."""
    now, nodes, topology = observation.time_s, observation.nodes, observation.topology
    sensitivity_s = policy.sensitivity_ms / 1000
    in_flight = {
        target: sent
        for target, sent in state.in_flight.items()
        if target in nodes
        and TaskSpeed.of(nodes[target]) == sent.seen
        and now - sent.sent_s < sensitivity_s - _TIME_SLACK_S
    }
    underload_since = {
        node_id: state.underload_since_s.get(node_id, now)
        for node_id, node in nodes.items()
        if node.buffered_bytes <= policy.underload_bytes
    }
    due = [
        t
        for t in topology.order
        if t in nodes
        and topology.upstreams(t)
        and now - state.last_eval_s.get(t, -float("inf")) >= sensitivity_s - _TIME_SLACK_S
    ]
    overloaded = [t for t in due if nodes[t].buffered_bytes >= policy.overload_bytes]
    relieved = [
        t
        for t in due
        if t in underload_since and now - underload_since[t] >= sensitivity_s - _TIME_SLACK_S
    ]

    # Slow-downs first: a restore must not race a slow-down decided in the same round.
    signals: list[StepwiseSignal] = []
    for t in overloaded:
        for u in topology.upstreams(t):
            if u not in nodes or u in in_flight or _at_floor(nodes[u], policy):
                continue
            signals.append(
                StepwiseSignal(
                    reason=(
                        f"{t} buffers {nodes[t].buffered_bytes / MB:.1f} MB >= overload "
                        f"{policy.overload_mb:.1f} MB: slow direct upstream {u} by "
                        f"{policy.backpressure_step:g}"
                    ),
                    signal="slow",
                    target=u,
                    origin=t,
                )
            )
            in_flight[u] = PendingSignal("slow", now, TaskSpeed.of(nodes[u]))
    for t in relieved:
        for u in topology.upstreams(t):
            if u not in nodes or u in in_flight or not nodes[u].in_backpressure:
                continue
            signals.append(
                StepwiseSignal(
                    reason=(
                        f"{t} at or below underload {policy.underload_kb:g} KB for "
                        f"{now - underload_since[t]:.1f} s >= sensitivity "
                        f"{sensitivity_s:g} s: restore direct upstream {u}"
                    ),
                    signal="restore",
                    target=u,
                    origin=t,
                )
            )
            in_flight[u] = PendingSignal("restore", now, TaskSpeed.of(nodes[u]))

    last_eval = {t: s for t, s in state.last_eval_s.items() if t in nodes}
    last_eval.update(dict.fromkeys(due, now))
    return signals, StepwiseState(last_eval, underload_since, in_flight)


def apply_signal(
    signal: StepwiseSignal,
    current: TaskSpeed,
    policy: Policy,
) -> tuple[SetSpeed | None, TaskSpeed]:
    """What the target ``signal.target`` does on receipt; None when nothing changes.

    Pure, so the queue handler (orchestrator) and the simulator apply signals alike.
    A restore reaching a task no longer in backpressure (stale) is ignored.
    """
    v = policy.backpressure_step
    if signal.signal == "slow":
        origin = current.origin_speed if current.in_backpressure else current.speed
        floor = speed_floor(origin, policy)
        speed = min(origin, max(floor, v * current.speed))
        new = TaskSpeed(speed, origin, in_backpressure=True)
        why = f"slow from {signal.origin}: speed {current.speed:.3g} -> {speed:.3g}"
        extra = f" (origin {origin:.3g}, floor {floor:.3g})"
    else:
        if not current.in_backpressure:
            return None, current
        origin = current.origin_speed
        speed = min(origin, current.speed / v)
        recovered = speed >= origin - _SPEED_EPSILON
        new = TaskSpeed(origin if recovered else speed, origin, in_backpressure=not recovered)
        why = f"restore from {signal.origin}: speed {current.speed:.3g} -> {new.speed:.3g}"
        extra = " (back at origin, out of backpressure)" if recovered else f" (origin {origin:.3g})"
    return (
        SetSpeed(
            reason=why + extra,
            node=signal.target,
            speed=new.speed,
            origin_speed=new.origin_speed,
            in_backpressure=new.in_backpressure,
        ),
        new,
    )


def _at_floor(node: NodeObservation, policy: Policy) -> bool:
    # Only a task already in backpressure can sit at its floor; a slow-down there would
    # change nothing and, never seen applied, would look lost.
    return (
        node.in_backpressure
        and node.speed <= speed_floor(node.origin_speed, policy) + _SPEED_EPSILON
    )
