"""A live run as a :class:`balancer.runtime.Runtime`: the contract the simulator
implements too.

It observes through the ledger and the source (orchestrator.run.observer) plus the
flags and task speeds the balancer set, built by the same function as the simulator's
observations; it applies through the action table. A stepwise signal it sends is
handled before the next observation, as the simulator's target applies it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from balancer.model import Action, Observation, StepwiseSignal, StopMigration
from balancer.runtime import Measured, observe
from balancer.topology import Topology
from orchestrator.run.actions import ActionTable
from orchestrator.run.commands import SignalQueue


class LiveRuntime:
    def __init__(
        self,
        topology: Topology,
        measure: Callable[[Topology], Measured],
        table: ActionTable,
        signals: SignalQueue,
    ) -> None:
        self.topology = topology  # replaced when a hot rescale changes the graph
        self.measure = measure
        self.table, self.signals = table, signals

    def observe(self) -> Observation:
        return observe(
            self.topology,
            self.measure(self.topology),
            flagged=self.table.flags.flagged,
            speeds=self.table.controls.speeds(),
        )

    def apply(self, actions: Sequence[Action]) -> None:
        signalled = False
        for action in actions:
            if isinstance(action, StopMigration) and action.heavy[0] in self.table.routes.pinned:
                continue  # an operator's migration lasts until the operator stops it
            self.table.apply(action)
            signalled = signalled or isinstance(action, StepwiseSignal)
        self.signals.handle(now=signalled)
