"""The simulator as a :class:`~balancer.runtime.Runtime`: the same contract as a live run.

Each controller gets its own runtime, measuring over its own period (the loop's tick,
the credit interval); stop/resume's instant reactions use one that only reads levels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from balancer.model import Action, Observation
from balancer.runtime import Measured, observe
from balancer.stepwise import TaskSpeed
from balancer.topology import Topology


class Engine(Protocol):
    """What the runtime needs of the simulator (balancer.sim.engine.Simulator)."""

    topology: Topology

    def flagged(self) -> frozenset[str]: ...

    def speeds(self) -> dict[str, TaskSpeed]: ...

    def apply(self, action: Action) -> None: ...


class SimRuntime:
    def __init__(self, engine: Engine, measure: Callable[[], Measured]) -> None:
        self.engine = engine
        self.measure = measure

    def observe(self) -> Observation:
        return observe(
            self.engine.topology,
            self.measure(),
            flagged=self.engine.flagged(),
            speeds=self.engine.speeds(),
        )

    def apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            self.engine.apply(action)
