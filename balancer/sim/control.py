"""The policies of the benchmark and the controllers that run their real decisions.

Every policy is a :class:`~balancer.policy.Policy`; the simulator runs it through the
same code as a live run:

* :class:`LoopController` calls :func:`balancer.loop.step` every ``tick_ms``: watermark
  flags and rate coefficient, stepwise signals, water-level shares and migration.
* :class:`CreditController` calls :func:`balancer.credit.credit_step` every
  ``credit_interval_ms`` (finer than the tick, as credit-based flow control needs).
* Stop/resume and adaptive windows react to single events (a queue filling, a batch
  acked), so the engine calls :func:`balancer.credit.stop_resume_step` and
  :mod:`balancer.window` itself at those instants; the loop then runs with throttling
  ``none`` so the same layer is not decided twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from balancer.credit import CreditState, credit_step
from balancer.loop import BalancerState, step
from balancer.model import Action, Observation
from balancer.policy import Policy
from balancer.sim.engine import Controller

# Throttling modes the engine runs at their own events rather than at the loop's tick.
_EVENT_THROTTLING = frozenset({"stop_resume", "credit", "window"})


class LoopController:
    """The balancer loop, one call per tick; it holds the loop's (immutable) state."""

    def __init__(self, policy: Policy) -> None:
        self.period_s = policy.tick_ms / 1000
        self.policy = (
            policy.replace(throttling="none") if policy.throttling in _EVENT_THROTTLING else policy
        )
        self.state = BalancerState()

    def decide(self, observation: Observation) -> list[Action]:
        decision = step(observation, self.state, self.policy)
        self.state = decision.state
        return decision.actions


class CreditController:
    """Credit grants, one call per credit interval."""

    def __init__(self, policy: Policy) -> None:
        self.period_s = policy.credit_interval_ms / 1000
        self.policy = policy
        self.state = CreditState()

    def decide(self, observation: Observation) -> list[Action]:
        actions, self.state = credit_step(observation, self.state, self.policy)
        return actions


def controllers_for(policy: Policy) -> list[Controller]:
    controllers: list[Controller] = [LoopController(policy)]
    if policy.throttling == "credit":
        controllers.append(CreditController(policy))
    return controllers


@dataclass(frozen=True)
class BenchmarkPolicy:
    """One arm of the benchmark: a name, what it is, and its Policy values."""

    name: str
    label: str
    description: str
    values: Mapping[str, object]

    def policy(self, **overrides: object) -> Policy:
        return Policy.from_mapping({**self.values, **overrides})


_STATIC = {"routing": "static", "migration": "off"}

BENCHMARK_POLICIES: Mapping[str, BenchmarkPolicy] = {
    p.name: p
    for p in (
        BenchmarkPolicy(
            "stop_resume",
            "stop/resume",
            "Fixed-length queues only: a full queue stops its upstream, 50% resumes it.",
            {**_STATIC, "throttling": "stop_resume"},
        ),
        BenchmarkPolicy(
            "credit",
            "credit-based",
            "The published baseline: upstreams send only the free space downstreams grant "
            "every credit interval.",
            {**_STATIC, "throttling": "credit"},
        ),
        BenchmarkPolicy(
            "watermark",
            "watermark + rate",
            "Adaptive high/low watermark flags, the upstream rate coefficient on flag "
            "changes, and water-level shares among the branches (one stage).",
            {"throttling": "watermark", "routing": "water_level", "migration": "off"},
        ),
        BenchmarkPolicy(
            "stepwise",
            "stepwise",
            "A task buffering 50 MB or more halves its direct upstream's speed; the speed "
            "doubles back once the task stays under 500 KB for 2 s.",
            {**_STATIC, "throttling": "stepwise"},
        ),
        BenchmarkPolicy(
            "window",
            "adaptive window",
            "The source dispatches packets as batches to the branch with the most idle "
            "send window (ack round trip <= 2 s grows it); tags are not consulted.",
            {**_STATIC, "throttling": "window"},
        ),
        BenchmarkPolicy(
            "pressure",
            "migration (published)",
            "Stop/resume queues plus pressure migration as published: detect at Q > 0.8, "
            "move all of the heavy branch's data to the lowest-pressure branch "
            "(alpha 0.3, beta 0.5), recover below 0.5.",
            {
                "throttling": "stop_resume",
                "routing": "static",
                "migration": "pressure",
                "alpha": 0.3,
                "beta": 0.5,
            },
        ),
        BenchmarkPolicy(
            "ours",
            "ours (proportional)",
            "Credit-based flow control plus proportional migration: every tick, from the "
            "tags arriving and at the head of the source's queue, only what a branch "
            "cannot take at its capacity moves, spread over every branch with room; queues "
            "are kept at equal drain times so that all branches finish together; a "
            "stream whose arrival outgrows a stage's measured capacity scales it out.",
            {
                "throttling": "credit",
                "routing": "static",
                "migration": "proportional",
                "scale_out": "measured",
            },
        ),
    )
}
