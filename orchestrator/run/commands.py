"""What reaches a running driver through ZooKeeper's queues: operators' commands from
the console, and the stepwise signals the balancer sent to tasks.

Queues are read only after a watch said they hold something: no round trip to
ZooKeeper on the (usual) ticks without signals or commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError

from balancer.model import Observation, StepwiseSignal, StopMigration
from balancer.policy import Policy
from balancer.pressure import operator_migration
from balancer.stepwise import apply_signal
from balancer.topology import Topology
from orchestrator.rescale.control import COMMANDS
from orchestrator.run.actions import ActionTable
from orchestrator.zk.control_plane import Subscription


class _Queue:
    """A run's queue in ZooKeeper, with how many entries its watch last saw."""

    def __init__(self, table: ActionTable, policy: Policy) -> None:
        self.table, self.policy = table, policy
        self.control, self.run_key = table.control, table.run_key
        self.pending = 0

    def _note(self, pending: int) -> None:
        self.pending = pending


class SignalQueue(_Queue):
    """The stepwise queue's handler: each signal applied to its target, in order."""

    def watch(self) -> Subscription:
        return self.control.watch_signals(self.run_key, self._note)

    def handle(self, *, now: bool = False) -> None:
        """Apply what is queued: when the watch saw signals, or ``now`` (the loop has
        just sent some, and their effect belongs in the next observation)."""
        if not (now or self.pending):
            return
        for message in self.control.take_signals(self.run_key):
            signal = StepwiseSignal(
                reason=message.get("reason", ""),
                signal=message["signal"],
                target=message["target"],
                origin=message.get("origin", ""),
            )
            speed = self.table.controls.of(signal.target).speed
            change, _ = apply_signal(signal, speed, self.policy)
            if change is not None:
                self.table.apply(change)


class OperatorCommands(_Queue):
    """Operators' requests: migrate a branch now or stop, and the hot rescale's."""

    def watch(self) -> Subscription:
        return self.control.watch_commands(self.run_key, self._note)

    def handle(self, observation: Observation) -> None:
        if not self.pending:
            return
        commands = self.control.take_commands(self.run_key)
        for done, command in enumerate(commands):
            try:
                self._carry_out(observation, command)
            except DatabaseError:
                # The driver starts again from the ledger (a deadlock, the database
                # restarting): the commands it had not carried out wait for it in the
                # queue, this one with them (an adjustment's start is one transaction).
                for left in commands[done:]:
                    self.control.put_command(self.run_key, left)
                raise

    def _carry_out(self, observation: Observation, command: Mapping[str, Any]) -> None:
        topology = observation.topology
        node, who = command.get("node", ""), command.get("user", "an operator")
        if command.get("command") in COMMANDS:
            rescale = self.table.rescale
            if rescale is not None and rescale.command(command):
                self.table.on_graph_change()
            return
        if not topology.has_node(node):
            return  # validated by the console; a stale command is dropped
        if command.get("command") == "migrate":
            self._migrate(observation, node, who, command)
        elif command.get("command") == "stop_migrating":
            self._stop_migrating(topology, node, who)

    def _migrate(
        self, observation: Observation, node: str, who: str, command: Mapping[str, Any]
    ) -> None:
        action = operator_migration(observation, node, self.policy, who)
        if action is None:
            self.table.timeline.add(
                "operator_refused",
                f"{node} is on no branch with another branch to take its data",
                node=node,
                actor="user",
                data=dict(command),
            )
            return
        self.table.routes.pinned.add(action.heavy[0])
        self.table.apply(action, actor="user")

    def _stop_migrating(self, topology: Topology, node: str, who: str) -> None:
        for branch_node, routes in list(self.table.routes.routes.items()):
            for heavy in list(routes.migrations):
                if heavy == node or node in branch_nodes(topology, heavy):
                    self.table.routes.pinned.discard(heavy)
                    self.table.apply(
                        StopMigration(
                            reason=f"operator {who} stopped migrating from {heavy}",
                            branch_node=branch_node,
                            heavy=(heavy,),
                            backpressure_node=node,
                        ),
                        actor="user",
                    )


def branch_nodes(topology: Topology, first: str) -> set[str]:
    """``first`` and every node below it until the branch merges again."""
    seen, frontier = {first}, [first]
    while frontier:
        for nxt in topology.downstreams(frontier.pop()):
            if len(topology.upstreams(nxt)) == 1 and nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen
