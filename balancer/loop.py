"""One balancer tick: the policy's layers composed into a single decision.

::

    observation ──► throttling ──► scale-out ──► routing ──► migration ──► key moves ──► actions
                    (one of)       (one of)      (one of)    (one of)      (one of)
                    none           flags         static      off           off
                    stop_resume    measured      water_level pressure      auto
                    credit         off           measured    proportional
                    watermark (flags, then the rate coefficient on the new flags)
                    stepwise
                    window

The layers are independent: throttling slows upstreams, routing splits an upstream's
traffic inside a stage, migration reroutes a heavy branch's data through light branches,
key moves cut a keyed stage's key space again when a hot key group backpressures it.
Scale-out asks for more instances, sized from measured rates (:mod:`balancer.sizing`):
on the flags the watermark layer raised (``flags``), or when a stage's measured
capacity falls short of its input for some ticks (``measured``).
Each keeps its own state in :class:`BalancerState`, carried over while the layer is off.

``window`` has no tick-level decision: its state machine (:mod:`balancer.window`) runs
per batch in the dispatcher, driven by sends, acks and timeouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from balancer.credit import CreditState, StopResumeState, credit_step, stop_resume_step
from balancer.model import Action, Observation, ScaleOutRequest
from balancer.policy import Policy
from balancer.queued import batch_bounds, queued_moves
from balancer.rate import RateState, rate_tick
from balancer.shares import GroupKey, measured_tick, shares_tick
from balancer.sizing import ScalingState, scaling_step, sized
from balancer.stepwise import StepwiseState, stepwise_step
from balancer.watermark import WatermarkState, flags_after, watermark_tick

if TYPE_CHECKING:
    from balancer.pressure import MigrationState

_V = TypeVar("_V")


@dataclass(frozen=True)
class BalancerState:
    """Everything the loop remembers between ticks; ``BalancerState()`` to start."""

    watermarks: Mapping[str, WatermarkState] = field(default_factory=dict)
    rates: Mapping[str, RateState] = field(default_factory=dict)
    shares: Mapping[GroupKey, Mapping[str, float]] = field(default_factory=dict)
    stepwise: StepwiseState = field(default_factory=StepwiseState)
    credit: CreditState = field(default_factory=CreditState)
    stop_resume: StopResumeState = field(default_factory=StopResumeState)
    scaling: ScalingState = field(default_factory=ScalingState)
    # None until migration first runs: balancer.pressure is only imported when needed.
    migration: MigrationState | None = None


@dataclass(frozen=True)
class Decision:
    actions: list[Action]
    state: BalancerState


def forget(state: BalancerState, nodes: frozenset[str] | set[str]) -> BalancerState:
    """The state for a graph whose nodes are now ``nodes`` (a hot rescale retired some):
    what refers to a node no longer there is dropped, so no layer decides about it; a
    migration that involved one is dropped whole and decided again on the next tick."""

    def keep(mapping: Mapping[str, _V]) -> dict[str, _V]:
        return {k: v for k, v in mapping.items() if k in nodes}

    shares = {
        group: {n: v for n, v in values.items() if n in nodes}
        for group, values in state.shares.items()
        if group[0] in nodes
    }
    stepwise = replace(
        state.stepwise,
        last_eval_s=keep(state.stepwise.last_eval_s),
        underload_since_s=keep(state.stepwise.underload_since_s),
        in_flight=keep(state.stepwise.in_flight),
    )
    migration = state.migration
    if migration is not None:
        active = tuple(
            m
            for m in migration.active
            if {m.branch_node, m.backpressure_node, *m.heavy, *m.light} <= nodes
        )
        migration = replace(migration, active=active)
    return replace(
        state,
        watermarks=keep(state.watermarks),
        rates=keep(state.rates),
        shares=shares,
        stepwise=stepwise,
        stop_resume=replace(state.stop_resume, holding=state.stop_resume.holding & nodes),
        migration=migration,
    )


def step(observation: Observation, state: BalancerState, policy: Policy) -> Decision:
    """Decide one tick: throttling actions first, then scale-out, routing, migration
    (with moves of waiting data, balancer/queued.py) and key moves."""
    actions, state = _throttle(observation, state, policy)
    actions, state = _scale_out(observation, actions, state, policy)

    if policy.routing in ("water_level", "measured"):
        tick = shares_tick if policy.routing == "water_level" else measured_tick
        share_actions, shares = tick(observation, state.shares, policy)
        actions.extend(share_actions)
        state = replace(state, shares=shares)

    # "off" still runs once there is migration state, so migrations under way are
    # stopped when an operator turns migration off.
    if policy.migration != "off" or state.migration is not None:
        from balancer.pressure import MigrationState, migration_step

        current = state.migration if state.migration is not None else MigrationState()
        migration_actions, migration = migration_step(observation, current, policy)
        actions.extend(migration_actions)
        state = replace(state, migration=migration)

    if policy.migration == "proportional":
        actions.extend(queued_moves(observation, policy))
        actions.extend(batch_bounds(observation))

    if policy.key_moves == "auto" and observation.key_loads:
        from balancer.key_moves import key_move_step

        actions.extend(key_move_step(observation, policy))
    return Decision(actions, state)


def _scale_out(
    observation: Observation, actions: list[Action], state: BalancerState, policy: Policy
) -> tuple[list[Action], BalancerState]:
    """The throttling layer's scale-out requests sized from measured rates (``flags``),
    or replaced by the measured trigger's (``measured``), or dropped (``off``)."""
    others = [a for a in actions if not isinstance(a, ScaleOutRequest)]
    if policy.scale_out == "flags":
        requests = [a for a in actions if isinstance(a, ScaleOutRequest)]
        return others + [sized(r, observation, policy) for r in requests], state
    if policy.scale_out == "measured":
        measured, scaling = scaling_step(observation, state.scaling, policy)
        return [*others, *measured], replace(state, scaling=scaling)
    return others, state


def _throttle(
    observation: Observation, state: BalancerState, policy: Policy
) -> tuple[list[Action], BalancerState]:
    if policy.throttling == "watermark":
        flag_actions, watermarks = watermark_tick(observation, state.watermarks, policy)
        flagged = flags_after(observation, flag_actions)
        rate_actions, rates = rate_tick(observation, flagged, state.rates, policy)
        return flag_actions + rate_actions, replace(state, watermarks=watermarks, rates=rates)
    if policy.throttling == "stepwise":
        signals, stepwise = stepwise_step(observation, state.stepwise, policy)
        return list(signals), replace(state, stepwise=stepwise)
    if policy.throttling == "credit":
        credit_actions, credit = credit_step(observation, state.credit, policy)
        return credit_actions, replace(state, credit=credit)
    if policy.throttling == "stop_resume":
        stop_actions, stop_resume = stop_resume_step(observation, state.stop_resume)
        return stop_actions, replace(state, stop_resume=stop_resume)
    return [], state
