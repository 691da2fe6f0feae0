"""How a live run carries out each decision: one handler per action type.

Flags and signals go to ZooKeeper (flags in one pipelined write per tick, by
orchestrator.run.flags), routing tables to the route store (written to ZooKeeper by the
reporter thread), pacing to the source's controls, a scale-out request to the hot
rescale control, as is a key-group move. Every action but the periodic credit grant
becomes an event on the node it concerns (``Action.subject``), with what it changed
and, for the balancer's, the observation it was decided on (orchestrator.run.evidence).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from balancer.forecast import Pacing
from balancer.model import (
    Action,
    BoundBatches,
    ClearFlag,
    MoveKeyGroups,
    MoveQueued,
    NodeState,
    ScaleOutRequest,
    SetCredits,
    SetFlag,
    SetRate,
    SetShares,
    SetSpeed,
    SetThresholds,
    StartMigration,
    StepwiseSignal,
    StopMigration,
)
from balancer.stepwise import TaskSpeed
from orchestrator.ledger.requeue import move_waiting
from orchestrator.pipeline.routes import Routes
from orchestrator.rescale.control import RescaleControl
from orchestrator.run.controls import Controls
from orchestrator.run.evidence import observed_for
from orchestrator.run.flags import Flags
from orchestrator.run.route_store import RouteStore
from orchestrator.run.timeline import Timeline
from orchestrator.zk.control_plane import ControlPlane

# Periodic grants and bounds: state, not events.
QUIET_KINDS = {"set_credits", "bound_batches"}

# A handler's return value is ignored except MoveQueued's (the action as carried out).
Handler = Callable[[Any], object]


class ActionTable:
    def __init__(
        self,
        control: ControlPlane,
        run_id: int,
        *,
        on_graph_change: Callable[[], None],
    ) -> None:
        """A table over the run's state the actions change: its flags, its routing
        tables, its nodes' pacing and speeds, and its timeline of events."""
        self.control, self.run_key = control, str(run_id)
        self.flags, self.controls = Flags(), Controls()
        self.routes = RouteStore(control, self.run_key)
        self.timeline = Timeline(run_id)
        self.on_graph_change = on_graph_change
        self.rescale: RescaleControl | None = None  # set once the run's graph is known
        # The most a node's next batch claims, in bytes, where the balancer bounds it
        # (BoundBatches; read by orchestrator/run/dispatch.py).
        self.batch_bounds: dict[str, float] = {}
        # Each node as the balancer saw it when it made this tick's decisions.
        self.seen: dict[str, NodeState] = {}
        self.handlers: dict[type[Action], Handler] = {
            SetFlag: lambda a: self.flags.set(a.node),
            ClearFlag: lambda a: self.flags.clear(a.node),
            # The balancer keeps a node's thresholds in its own state; the event shows them.
            SetThresholds: lambda a: None,
            SetRate: self._set_rate,
            StepwiseSignal: lambda a: control.put_signal(self.run_key, a.to_json()),
            SetSpeed: self._set_speed,
            SetCredits: self._set_credits,
            SetShares: self._set_shares,
            StartMigration: self._start_migration,
            StopMigration: self._stop_migration,
            ScaleOutRequest: self._scale_out,
            MoveKeyGroups: self._move_key_groups,
            MoveQueued: self._move_queued,
            BoundBatches: self._bound_batches,
        }

    def pacing(self, nodes: Iterable[str]) -> dict[str, Pacing]:
        """Each node's rate coefficient and explicit shares as the actions left them."""
        return {
            node: Pacing(self.controls.of(node).coefficient, self.routes.get(node).shares)
            for node in nodes
        }

    def apply(self, action: Action, actor: str = "balancer") -> None:
        done = self.handlers[type(action)](action)
        if isinstance(action, MoveQueued):
            if not isinstance(done, MoveQueued):
                return  # nothing waiting moved: no event
            action = done
        if action.kind not in QUIET_KINDS:
            data = action.to_json()
            if actor == "balancer":
                data["observed"] = observed_for(data, self.seen)
            self.timeline.add(
                action.kind, action.reason, node=action.subject, actor=actor, data=data
            )

    def _set_rate(self, action: SetRate) -> None:
        self.controls.of(action.node).coefficient = action.coefficient

    def _set_speed(self, action: SetSpeed) -> None:
        """A task applied a stepwise signal: its new state, for the pacing and for the
        balancer's next observation, and in ZooKeeper for its neighbours."""
        self.controls.of(action.node).speed = TaskSpeed(
            action.speed, action.origin_speed, action.in_backpressure
        )
        self.control.write_task_state(self.run_key, action.node, action.to_json())

    def _set_credits(self, action: SetCredits) -> None:
        self.controls.of(action.upstream).credits = dict(action.credits)

    def _set_shares(self, action: SetShares) -> None:
        old = self.routes.get(action.upstream)
        self.routes.set(action.upstream, Routes(dict(action.shares), old.migrations))

    def _start_migration(self, action: StartMigration) -> None:
        old = self.routes.get(action.branch_node)
        targets = dict(action.targets) or {action.light[0]: 1.0}
        moves = {light: share * action.share for light, share in targets.items()}
        migrations = {**old.migrations, action.heavy[0]: moves}
        self.routes.set(action.branch_node, Routes(old.shares, migrations))

    def _stop_migration(self, action: StopMigration) -> None:
        old = self.routes.get(action.branch_node)
        migrations = {k: v for k, v in old.migrations.items() if k != action.heavy[0]}
        self.routes.set(action.branch_node, Routes(old.shares, migrations))

    def _move_queued(self, action: MoveQueued) -> MoveQueued | None:
        """Move the waiting data the action names (orchestrator.ledger.requeue), none
        while an adjustment changes the graph; the action as carried out, with the
        bytes that did move (whole segments), or None when none did."""
        if self.rescale is not None and self.rescale.current is not None:
            return None
        moved = {
            to: float(move_waiting(int(self.run_key), action.node, to, size))
            for to, size in action.moves.items()
        }
        moved = {to: size for to, size in moved.items() if size > 0}
        if not moved:
            return None
        spread = ", ".join(f"{to} {size / 2**20:.1f} MB" for to, size in moved.items())
        return replace(action, moves=moved, reason=f"{action.reason}: moved {spread}")

    def _bound_batches(self, action: BoundBatches) -> None:
        for member in action.members:
            self.batch_bounds.pop(member, None)
        self.batch_bounds.update(action.bounds)

    def _move_key_groups(self, action: MoveKeyGroups) -> None:
        if self.rescale is not None and self.rescale.move_key_groups(
            action.stage, action.groups, action.reason, time.monotonic()
        ):
            self.on_graph_change()

    def _scale_out(self, action: ScaleOutRequest) -> None:
        if self.rescale is not None and self.rescale.scale_out(action, time.monotonic()):
            # The request is recorded as an event; the hot rescale records its own steps.
            self.on_graph_change()
