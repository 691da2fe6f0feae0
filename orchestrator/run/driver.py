"""The run driver: the source, batch dispatch and the load-balance loop of one run.

Exactly one driver per run holds the run's ZooKeeper lock; taking it bumps the run's
epoch, which fences any older owner out of the ledger. The driver pauses while its
ZooKeeper session is SUSPENDED and stops on LOST (its lock is gone; the watchdog starts
a new driver elsewhere, which resumes from the ledger).

Each loop the driver:
1. emits source chunks, paced by the source's rate coefficient / speed / credits and
   never into a full pool (the per-node stop of the reference experiment);
2. dispatches a batch task for every node with arrived data and no batch in flight;
3. every tick: observes every node from the ledger, asks ``balancer.loop.step``, applies
   the actions (flags, thresholds, rates, signals, shares, migrations) to ZooKeeper and
   to its own pacing, records them as events and publishes the run's snapshot;
4. finishes the run when the source is exhausted, nothing is left in flight and the sink
   has merged every chunk exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from balancer.loop import BalancerState, forget, step
from balancer.model import (
    Action,
    ClearFlag,
    NodeObservation,
    Observation,
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
from balancer.policy import Policy
from balancer.pressure import operator_migration
from balancer.stepwise import TaskSpeed, apply_signal
from orchestrator.ledger import segments
from orchestrator.ledger.events import record_event
from orchestrator.models import Event, Instance, Run
from orchestrator.pipeline.graph import balancer_topology, bandwidth, downstreams_of, input_extent
from orchestrator.pipeline.inputs import Chunk, chunks, resolve_inputs, write_chunk
from orchestrator.pipeline.routes import Routes, tagged_route
from orchestrator.rescale.control import COMMANDS, RescaleControl
from orchestrator.rescale.plan import copy_id, targets, topology_at
from orchestrator.rescale.start import ensure_instances
from orchestrator.run import generation
from orchestrator.run.reporter import Report, Reporter
from orchestrator.run.snapshot import build_snapshot
from orchestrator.worker.batch import segment_path
from orchestrator.zk.control_plane import ControlPlane, StaleEpochError
from sparkjobs.keygroups import KeyGroup

log = logging.getLogger(__name__)

LOOP_S = 0.1
READ_AHEAD_CHUNKS = 32
READ_AHEAD_BYTES = 32 * 1024 * 1024
MB = 1024 * 1024
QUIET_KINDS = {"set_credits"}  # periodic grants: state, not events
# What a snapshot shows of the run row (the topology and policy never change mid-run).
SNAPSHOT_FIELDS = [
    "status",
    "epoch",
    "chunks_total",
    "input_bytes",
    "started_at",
    "finished_at",
    "error",
]


@dataclass
class NodeControl:
    """What the balancer has set for one node, as the driver applies it."""

    coefficient: float = 1.0
    speed: TaskSpeed = field(default_factory=lambda: TaskSpeed(1.0, 1.0, in_backpressure=False))
    high_water: float = 0.0
    low_water: float = 0.0
    credits: dict[str, float] | None = None


@dataclass
class Dispatch:
    started: float
    handle: Any

    def may_complete(self, now: float, *, held: bool = False) -> bool:
        """The batch has not reported yet and still can: it was sent less than a lease
        ago (it may be waiting in its queue), or its node's segments are under a live
        lease (its worker renews it while the batch runs). One silent for a lease with
        nothing held cannot: e.g. sent to the queue of a worker that died."""
        ready = getattr(self.handle, "ready", None)
        finished = True if ready is None else bool(ready())
        return not finished and (held or now - self.started < settings.BPCONSOLE_LEASE_S)


Dispatcher = Callable[[int, str, dict[str, Any], Any], Any]
Publisher = Callable[[int, dict[str, Any]], None]


class RunDriver:
    def __init__(
        self,
        run_id: int,
        control: ControlPlane,
        identity: str,
        *,
        dispatch: Dispatcher,
        publish: Publisher,
    ) -> None:
        self.run_id = run_id
        self.key = str(run_id)
        self.control = control
        self.identity = identity
        self.dispatch = dispatch
        self.publish = publish
        self.in_flight: dict[str, Dispatch] = {}
        self.controls: dict[str, NodeControl] = {}
        self.routes: dict[str, Routes] = {}
        self.flags: set[str] = set()
        self.state = BalancerState()
        self.ahead: deque[Chunk] = deque()
        self.sent_by_route: dict[str, int] = {}
        self.source_iter: Iterator[Chunk] | None = None
        self.source_done = False
        self.emitted_bytes = 0
        self.tokens = 0.0
        self.last_refill = time.monotonic()
        self.measured_rate = 0.0
        self.pool: dict[str, int] = {}
        self.pinned: set[str] = set()
        self.tick_seconds: list[float] = []
        self.phase_seconds: dict[str, float] = {}
        self.events: list[Event] = []
        self.pending_signals = 0
        self.superseded = False
        self.stored_routes: dict[str, dict[str, Any]] = {}
        self.pending_commands = 0
        self.subscriptions: list[Any] = []
        self.flags_to_set: set[str] = set()
        self.flags_to_clear: set[str] = set()
        self.blocked: dict[str, int] = {}
        self.node_states: dict[str, dict[str, Any]] = {}
        self.lost = False
        self.adjuster: RescaleControl | None = None
        self.source_config = 0

    # -- lifecycle --------------------------------------------------------------------

    def drive(self, lock_timeout_s: float = 2.0) -> str:
        lock = self.control.driver_lock(self.key, self.identity)
        if not lock.acquire(timeout=lock_timeout_s):
            return "another driver holds this run"
        callback = self.control.session.on_lost(self._on_lost)
        self.reporter = Reporter(self._store, self._report)
        self.reporter.start()
        try:
            return self._drive()
        finally:
            self.reporter.stop()
            if self.adjuster is not None:
                self.adjuster.close()
            for subscription in self.subscriptions:
                subscription.cancel()
            self.control.session.remove(callback)
            if not self.lost:
                lock.release()

    def _note_signals(self, pending: int) -> None:
        self.pending_signals = pending

    def _note_commands(self, pending: int) -> None:
        self.pending_commands = pending

    def _on_lost(self) -> None:
        # Runs in kazoo's thread: only note it; the loop gives the run up.
        self.lost = True

    def _drive(self) -> str:
        self.epoch = segments.bump_epoch(self.run_id)
        # ZooKeeper's fence follows the ledger's: older owners' routes writes are refused.
        self.control.raise_epoch(self.key, self.epoch)
        run = Run.objects.get(pk=self.run_id)
        self.policy = Policy.from_mapping(run.policy)
        self.source = next(n for n in run.topology["nodes"] if n["kind"] == "source")
        ensure_instances(run)
        self._reload_topology()
        if generation.needs_input(run):  # written here, on a worker, never in a request
            outcome = generation.prepare_input(
                run,
                self.epoch,
                alive=lambda: not self.lost,
                publish=lambda final: self._publish(run, final=final),
            )
            if outcome is not None:
                return outcome
        self._open_source(run)
        self._restore_routes()
        self.adjuster = RescaleControl(
            self.run_id,
            self.control,
            epoch=self.epoch,
            source=self.source["name"],
            timeout_s=self.policy.adjust_timeout_s,
        )
        # Queues are read only when a watch says they hold something: no round trip
        # to ZooKeeper on the (usual) ticks without signals or commands.
        self.subscriptions = [
            self.control.watch_signals(self.key, self._note_signals),
            self.control.watch_commands(self.key, self._note_commands),
        ]
        if run.status == Run.Status.PENDING:
            Run.objects.filter(pk=self.run_id).update(
                status=Run.Status.RUNNING, started_at=timezone.now()
            )
        record_event(self.run_id, "driver", f"driver {self.identity} took over, epoch {self.epoch}")
        tick_s = self.policy.tick_ms / 1000
        next_tick = time.monotonic()
        self.last_tick_wall = timezone.now()
        while True:
            if self.lost:
                log.warning("run %s: ZooKeeper session lost; giving up the run", self.run_id)
                return "lost"
            if self.control.session.is_suspended:
                time.sleep(LOOP_S)
                continue
            run.refresh_from_db(fields=["status", "epoch"])
            if run.epoch != self.epoch or self.superseded:
                return "superseded by a newer driver"
            if run.status in (Run.Status.CANCELLED, Run.Status.FAILED):
                # Stopped by an operator, or failed by a batch (orchestrator/ledger/failures.py).
                self._publish(run, final=True)
                return str(run.status)
            now = time.monotonic()
            sending = False
            if run.status == Run.Status.RUNNING:
                try:
                    sending = self._emit(now)
                except segments.StaleEpochError:
                    return "superseded by a newer driver"
                self._dispatch_ready(now)
                if self.adjuster is not None and self.adjuster.poll():
                    self._reload_topology()
            if now >= next_tick:
                began = time.perf_counter()
                self._tick(run, tick_s)
                self.tick_seconds.append(time.perf_counter() - began)
                next_tick = now + tick_s
                if self._finished(run):
                    return run.status
            if not sending:  # a source with more to send now goes on at once
                time.sleep(LOOP_S)

    # -- source -----------------------------------------------------------------------

    def _open_source(self, run: Run) -> None:
        spec = run.input_spec
        params = self.source.get("params") or {}
        self.files = resolve_inputs(spec["paths"], spec.get("format", "jsonl"))
        position = run.source_position or {}
        self.next_index = int(position.get("chunk", 0))
        self.emitted_bytes = int(run.input_bytes)
        if run.chunks_total is not None:
            self.source_done = True
            return
        self.source_iter = chunks(
            self.files,
            spec.get("format", "jsonl"),
            segment_bytes=max(1, int(float(params.get("segment_mb", 1.0)) * MB)),
            route_by=params.get("route_by", "key"),
            start_file=int(position.get("file", 0)),
            start_offset=position.get("offset"),
            start_index=self.next_index,
        )

    def _source_rate(self) -> float | None:
        """Bytes per second the source may send now; None means unlimited."""
        name = self.source["name"]
        control = self.controls.setdefault(name, NodeControl())
        factor = control.coefficient * control.speed.speed
        limit = float(self.source.get("max_rate_mbps", 0.0)) * segments.MEGABIT
        if limit <= 0:
            if factor >= 1.0:
                return None
            # k is a fraction of the maximum rate; unlimited sources use the rate they
            # were measured to reach while unthrottled.
            limit = max(self.measured_rate, MB)
        return factor * limit

    def _emit(self, now: float) -> bool:
        """Send what the source may for up to 0.2 s; True when it could send more now."""
        if self.source_done:
            return False
        rate = self._source_rate()
        elapsed = now - self.last_refill
        self.last_refill = now
        if rate is not None:
            self.tokens = min(self.tokens + rate * elapsed, max(rate, 4 * MB))
        began, sent = now, 0
        while time.monotonic() - began < 0.2:
            self._read_ahead()
            if not self.ahead:  # the input is exhausted and everything was sent
                segments.finish_source(self.run_id, self.epoch, self.next_index)
                self.source_done = True
                record_event(
                    self.run_id,
                    "source_done",
                    f"source read all {self.next_index} chunks",
                    node=self.source["name"],
                )
                return False
            chunk = self.ahead[0]
            seg_id = f"r{self.run_id}.c{chunk.index:07d}"
            source_routes = self.routes.get(self.source["name"], Routes())
            copies = targets(
                self.source_doc,
                self.source["name"],
                seg_id,
                tag=chunk.tag,
                routes=source_routes,
                slots=KeyGroup(),
            )
            target = copies[0][0]
            if not self._may_send(target, chunk.size, rate):
                if self._pool_full(target, chunk.size):
                    # Demand the node could not take: part of its input rate, so a full
                    # pool still reads as "input faster than output".
                    self.blocked[target] = chunk.size
                self._measure_rate(rate, began, sent)
                return False
            path = segment_path(self.run_id, seg_id)
            write_chunk(path, chunk)
            next_pos = self._position_after(chunk)
            segments.emit_chunk(
                self.run_id,
                self.epoch,
                [
                    segments.NewSegment(
                        id=copy_id(seg_id, node, slots, len(copies)),
                        chunk=chunk.index,
                        origin_file=chunk.file_index,
                        origin_offset=chunk.offset,
                        origin_length=chunk.length,
                        node=node,
                        upstream=self.source["name"],
                        tag=chunk.tag,
                        path=str(path),
                        bytes=chunk.size,
                        migrated_from=migrated_from,
                        link_mbps=bandwidth(self.source_doc, self.source["name"], node),
                        config=self.source_config,
                        slots_from=slots.low,
                        slots_to=slots.high,
                    )
                    for node, migrated_from, slots in copies
                ],
                next_pos,
                self.emitted_bytes + chunk.size,
            )
            self.emitted_bytes += chunk.size
            for node, _, _ in copies:
                self.pool[node] = self.pool.get(node, 0) + chunk.size
            if rate is not None:
                self.tokens -= chunk.size
            credits = self.controls[self.source["name"]].credits
            if credits is not None:
                credits[target] = credits.get(target, 0.0) - chunk.size
            self.next_index = chunk.index + 1
            self.ahead.popleft()
            tagged = tagged_route(chunk.tag, self.downstream_of_source, source_routes)
            self.sent_by_route[tagged] = self.sent_by_route.get(tagged, 0) + chunk.size
            sent += chunk.size
        self._measure_rate(rate, began, sent)
        return True

    def _measure_rate(self, rate: float | None, began: float, sent: int) -> None:
        """What an unlimited source reaches: a rate coefficient below 1 is a share of it."""
        if rate is None and sent:
            spent = max(time.monotonic() - began, 1e-3)
            self.measured_rate = max(self.measured_rate * 0.8, sent / spent)

    def _read_ahead(self) -> None:
        """Keep the next chunks read: the source's queue, whose mix of routes the
        balancer sees (what is about to leave, per branch)."""
        ahead_bytes = sum(c.size for c in self.ahead)
        while self.source_iter is not None and (
            len(self.ahead) < READ_AHEAD_CHUNKS and ahead_bytes < READ_AHEAD_BYTES
        ):
            chunk = next(self.source_iter, None)
            if chunk is None:
                self.source_iter = None
                break
            self.ahead.append(chunk)
            ahead_bytes += chunk.size

    def _position_after(self, chunk: Chunk) -> dict[str, int]:
        return {
            "chunk": chunk.index + 1,
            "file": chunk.file_index,
            "offset": chunk.offset + chunk.length,
        }

    def _pool_full(self, target: str, size: int) -> bool:
        queued = self.pool.get(target, 0)
        return queued > 0 and queued + size > self.topology.node(target).capacity_bytes

    def _may_send(self, target: str, size: int, rate: float | None) -> bool:
        if rate is not None and self.tokens < min(size, max(rate, 1.0)):
            return False
        if self._pool_full(target, size):
            return False  # a full pool stops its upstream (reference experiment)
        credits = self.controls.setdefault(self.source["name"], NodeControl()).credits
        return credits is None or credits.get(target, 0.0) >= size

    # -- dispatch ---------------------------------------------------------------------

    def _dispatch_ready(self, now: float) -> None:
        flows = segments.node_flows(self.run_id, timezone.now() - timedelta(seconds=1))
        self.pool = {node: flow.queued_bytes for node, flow in flows.items()}
        for node, flow in flows.items():
            if node == self.source["name"] or flow.arrived_waiting == 0:
                continue
            current = self.in_flight.get(node)
            # One batch at a time per node (an operator instance). A task that never
            # reports (its worker died before running it) is replaced after a lease.
            if current is not None and current.may_complete(now, held=flow.held > 0):
                continue
            routes = self.routes.get(node, Routes())
            queue = self._queue_for(node)
            self.in_flight[node] = Dispatch(
                now, self.dispatch(self.run_id, node, routes.to_json(), queue)
            )

    def _queue_for(self, node: str) -> Any:
        """A placed instance's worker queue; the sink's merge (a fold of small partials
        into PostgreSQL, no Spark job) on the control workers, so the output never
        waits behind a Spark job; anything else on any Spark worker."""
        placed = self.adjuster.queue_for(node) if self.adjuster is not None else None
        if placed is not None:
            return placed
        if self.topology.has_node(node) and self.topology.node(node).kind == "sink":
            return "control"
        return None

    # -- balance loop -----------------------------------------------------------------

    def _observe(self, interval_s: float) -> Observation:
        since = timezone.now() - timedelta(seconds=interval_s)
        flows = segments.node_flows(self.run_id, since)
        nodes = {}
        for node_id in self.topology.order:
            spec = self.topology.node(node_id)
            flow = flows.get(node_id)
            head: dict[str, float] = {}
            arriving: dict[str, float] = {}
            if spec.kind == "source":
                source_routes = self.routes.get(node_id, Routes())
                for chunk in self.ahead:
                    tagged = tagged_route(chunk.tag, self.downstream_of_source, source_routes)
                    head[tagged] = head.get(tagged, 0.0) + chunk.size
                queued = int(sum(head.values()))
                arriving = {r: b / interval_s for r, b in self.sent_by_route.items()}
                self.sent_by_route.clear()
                in_rate = out_rate = sum(arriving.values())
            else:
                queued = flow.queued_bytes if flow else 0
                offered = (flow.arrived_bytes if flow else 0) + self.blocked.get(node_id, 0)
                in_rate = offered / interval_s
                out_rate = (flow.done_bytes if flow else 0) / interval_s
            nodes[node_id] = NodeObservation(
                node=node_id,
                level=min(1.0, queued / spec.capacity_bytes),
                buffered_bytes=float(queued),
                in_rate=in_rate,
                out_rate=out_rate,
                flagged=node_id in self.flags,
                head_by_route=head,
                in_rate_by_route=arriving,
            )
        return Observation(time.monotonic(), interval_s, self.topology, nodes)

    def _tick(self, run: Run, tick_s: float) -> None:
        with self._phase("observe"):
            observation = self._observe(max(tick_s, 0.1))
            self.blocked.clear()
        with self._phase("decide"):
            decision = step(observation, self.state, self.policy)
            self.state = decision.state
        with self._phase("apply"):
            for action in decision.actions:
                if isinstance(action, StopMigration) and action.heavy[0] in self.pinned:
                    continue  # an operator's migration lasts until the operator stops it
                self._apply(action)
            self._handle_commands(observation)
            self._handle_signals()
            with self._phase("adjust"):
                if self.adjuster is not None and self.adjuster.tick():
                    self._reload_topology()
            with self._phase("flags"):
                self._flush_flags()
            with self._phase("events"):
                self._flush_events()
        with self._phase("report"):
            self.node_states = self._node_states(observation)
            self.reporter.submit(
                Report(self.node_states, {k: v.to_json() for k, v in self.routes.items()})
            )

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + (
                time.perf_counter() - began
            )

    def _event(
        self,
        kind: str,
        reason: str,
        *,
        node: str = "",
        actor: str = "balancer",
        data: dict[str, Any] | None = None,
    ) -> None:
        """Queue an event; a tick writes its events in one statement."""
        self.events.append(
            Event(
                run_id=self.run_id,
                kind=kind,
                reason=reason,
                node=node[:100],
                actor=actor,
                data=data or {},
            )
        )

    def _flush_events(self) -> None:
        if self.events:
            self.reporter.add_events(self.events)
            self.events = []

    def _flush_flags(self) -> None:
        if self.flags_to_set or self.flags_to_clear:
            self.control.update_flags(self.key, self.flags_to_set, self.flags_to_clear)
            self.flags_to_set.clear()
            self.flags_to_clear.clear()

    def _apply(self, action: Action, actor: str = "balancer") -> None:
        if isinstance(action, SetFlag):
            self.flags.add(action.node)
            self.flags_to_clear.discard(action.node)
            self.flags_to_set.add(action.node)
        elif isinstance(action, ClearFlag):
            self.flags.discard(action.node)
            self.flags_to_set.discard(action.node)
            self.flags_to_clear.add(action.node)
        elif isinstance(action, SetThresholds):
            control = self.controls.setdefault(action.node, NodeControl())
            control.high_water, control.low_water = action.high_water, action.low_water
        elif isinstance(action, SetRate):
            self.controls.setdefault(action.node, NodeControl()).coefficient = action.coefficient
        elif isinstance(action, StepwiseSignal):
            self.control.put_signal(self.key, action.to_json())
        elif isinstance(action, SetCredits):
            self.controls.setdefault(action.upstream, NodeControl()).credits = dict(action.credits)
        elif isinstance(action, SetShares):
            old = self.routes.get(action.upstream, Routes())
            self._set_routes(action.upstream, Routes(dict(action.shares), old.migrations))
        elif isinstance(action, StartMigration):
            old = self.routes.get(action.branch_node, Routes())
            targets = dict(action.targets) or {action.light[0]: 1.0}
            moves = {light: share * action.share for light, share in targets.items()}
            migrations = {**old.migrations, action.heavy[0]: moves}
            self._set_routes(action.branch_node, Routes(old.shares, migrations))
        elif isinstance(action, StopMigration):
            old = self.routes.get(action.branch_node, Routes())
            migrations = {k: v for k, v in old.migrations.items() if k != action.heavy[0]}
            self._set_routes(action.branch_node, Routes(old.shares, migrations))
        elif (
            isinstance(action, ScaleOutRequest)
            and self.adjuster is not None
            and self.adjuster.scale_out(action.stage, action.reason, time.monotonic())
        ):
            # The request is recorded below; the hot rescale it starts records its steps.
            self._reload_topology()
        if action.kind not in QUIET_KINDS:
            node = (
                getattr(action, "node", "")
                or getattr(action, "upstream", "")
                or getattr(action, "branch_node", "")
                or getattr(action, "target", "")
            )
            self._event(action.kind, action.reason, node=node, actor=actor, data=action.to_json())

    def _handle_commands(self, observation: Observation) -> None:
        """Operators' requests from the console: migrate a branch now, or stop."""
        if not self.pending_commands:
            return
        for command in self.control.take_commands(self.key):
            node, who = command.get("node", ""), command.get("user", "an operator")
            if command.get("command") in COMMANDS:
                if self.adjuster is not None and self.adjuster.command(command):
                    self._reload_topology()
                continue
            if not self.topology.has_node(node):
                continue  # validated by the console; a stale command is dropped
            if command.get("command") == "migrate":
                action = operator_migration(observation, node, self.policy, who)
                if action is None:
                    self._event(
                        "operator_refused",
                        f"{node} is on no branch with another branch to take its data",
                        node=node,
                        actor="user",
                        data=command,
                    )
                    continue
                self.pinned.add(action.heavy[0])
                self._apply(action, actor="user")
            elif command.get("command") == "stop_migrating":
                for branch_node, routes in list(self.routes.items()):
                    for heavy in list(routes.migrations):
                        if heavy == node or node in self._branch_nodes(heavy):
                            self.pinned.discard(heavy)
                            self._apply(
                                StopMigration(
                                    reason=f"operator {who} stopped migrating from {heavy}",
                                    branch_node=branch_node,
                                    heavy=(heavy,),
                                    backpressure_node=node,
                                ),
                                actor="user",
                            )

    def _branch_nodes(self, first: str) -> set[str]:
        """``first`` and every node below it until the branch merges again."""
        seen, frontier = {first}, [first]
        while frontier:
            for nxt in self.topology.downstreams(frontier.pop()):
                if len(self.topology.upstreams(nxt)) == 1 and nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        return seen

    def _reload_topology(self) -> None:
        """The run's graph after an adjustment began, completed or rolled back: what
        the balancer observes, and what the source routes with."""
        run = Run.objects.only("topology", "config_version").get(pk=self.run_id)
        self.topology_doc = run.topology
        self.topology = balancer_topology(run.topology)
        self.state = forget(self.state, frozenset(self.topology.order))
        for gone in sorted(self.flags - set(self.topology.order)):
            self._apply(ClearFlag(reason=f"{gone} was retired by a hot rescale", node=gone))
        name = self.source["name"]
        self.source_config = Instance.objects.get(run_id=self.run_id, name=name).config
        self.source_doc = topology_at(run, self.source_config, name)
        self.downstream_of_source = downstreams_of(self.source_doc, name)
        for node, routes in list(self.routes.items()):
            if not self.topology.has_node(node):
                del self.routes[node]
                continue
            live = set(self.topology.downstreams(node))
            shares = {k: v for k, v in (routes.shares or {}).items() if k in live}
            migrations = {
                heavy: {light: s for light, s in moves.items() if light in live}
                for heavy, moves in routes.migrations.items()
                if heavy in live
            }
            self.routes[node] = Routes(shares or None, migrations)

    def _set_routes(self, node: str, routes: Routes) -> None:
        # Applied at once here (the source and dispatch read self.routes); the reporter
        # stores it in ZooKeeper, fenced by the epoch, right after the tick.
        self.routes[node] = routes

    def _store_routes(self, routes: dict[str, dict[str, Any]]) -> None:
        """In the reporter thread: write the routes that changed since the last write."""
        for node, table in routes.items():
            if self.stored_routes.get(node) == table:
                continue
            try:
                self.control.write_routes(self.key, node, table, self.epoch)
            except StaleEpochError:
                self.superseded = True  # a newer driver owns the run; the loop stops
                return
            self.stored_routes[node] = table

    def _restore_routes(self) -> None:
        for node_id in self.topology.order:
            stored = self.control.read_routes(self.key, node_id)
            if stored is not None:
                self.routes[node_id] = Routes.from_json(stored[0])
        self.flags = set(self.control.flags(self.key))

    def _handle_signals(self) -> None:
        """The stepwise queue's handler: apply each signal to its target, in order."""
        if not self.pending_signals:
            return
        for message in self.control.take_signals(self.key):
            signal = StepwiseSignal(
                reason=message.get("reason", ""),
                signal=message["signal"],
                target=message["target"],
                origin=message.get("origin", ""),
            )
            control = self.controls.setdefault(signal.target, NodeControl())
            change, control.speed = apply_signal(signal, control.speed, self.policy)
            if isinstance(change, SetSpeed):
                self.control.write_task_state(self.key, signal.target, change.to_json())
                self._event(change.kind, change.reason, node=signal.target, data=change.to_json())

    def _node_states(self, observation: Observation) -> dict[str, dict[str, Any]]:
        return {
            node_id: self._node_state(
                node_id, obs, self.controls.setdefault(node_id, NodeControl())
            )
            for node_id, obs in observation.nodes.items()
        }

    def _store(self, report: Report) -> None:
        self._store_routes(report.routes)
        self.control.write_states(self.key, report.node_states)

    def _report(self, report: Report) -> None:
        """In the reporter thread: build and publish the snapshot of one tick."""
        run = Run.objects.only(
            *SNAPSHOT_FIELDS, "topology", "policy", "input_spec", "pipeline_name"
        ).get(pk=self.run_id)
        self.publish(
            self.run_id, build_snapshot(run, node_states=report.node_states, routes=report.routes)
        )

    def _node_state(
        self, node_id: str, obs: NodeObservation, control: NodeControl
    ) -> dict[str, Any]:
        watermark = self.state.watermarks.get(node_id)
        high = watermark.high_water if watermark else self.policy.high_water
        low = watermark.low_water if watermark else self.policy.low_water
        return {
            "level": round(obs.level, 4),
            "buffered_bytes": int(obs.buffered_bytes),
            "in_rate": round(obs.in_rate, 1),
            "out_rate": round(obs.out_rate, 1),
            "high_water": round(high, 3),
            "low_water": round(low, 3),
            "flagged": node_id in self.flags,
            "rate_coefficient": round(control.coefficient, 3),
            "speed": round(control.speed.speed, 4),
            "origin_speed": round(control.speed.origin_speed, 4),
            "in_backpressure": control.speed.in_backpressure,
        }

    def _publish(self, run: Run, *, final: bool = False) -> None:
        run.refresh_from_db(fields=SNAPSHOT_FIELDS)
        snapshot = build_snapshot(
            run,
            node_states=self.node_states,
            routes={k: v.to_json() for k, v in self.routes.items()},
            final=final,
        )
        self.publish(self.run_id, snapshot)

    # -- completion -------------------------------------------------------------------

    def _finished(self, run: Run) -> bool:
        if not self.source_done or self.in_flight_running():
            return False
        if self.adjuster is not None and self.adjuster.current is not None:
            return False
        if segments.unfinished(self.run_id):
            return False
        run.refresh_from_db()
        result = segments.coverage(run, input_extent(self.files))
        # Every pool is empty now: no node is backpressured any more.
        for node in sorted(self.flags):
            self._apply(ClearFlag(reason="run finished: every pool is empty", node=node))
        self._flush_flags()
        self._flush_events()
        self.reporter.write_events()  # the timeline ends with the run's own last events
        status = Run.Status.COMPLETED if result.exact else Run.Status.FAILED
        error = "" if result.exact else f"coverage incomplete: {result.to_json()}"
        Run.objects.filter(pk=self.run_id, epoch=self.epoch).update(
            status=status, finished_at=timezone.now(), error=error
        )
        summary = result.to_json()
        record_event(
            self.run_id,
            "run_" + status,
            f"run {status}: coverage {summary['status']}",
            data=summary,
        )
        record_event(self.run_id, "driver_stats", self._tick_stats_text(), data=self._tick_stats())
        run.refresh_from_db()
        self._publish(run, final=True)
        return True

    def _tick_stats(self) -> dict[str, float]:
        ticks = sorted(self.tick_seconds)
        if not ticks:
            return {"ticks": 0}
        return {
            "ticks": len(ticks),
            "p50_ms": 1000 * ticks[len(ticks) // 2],
            "p99_ms": 1000 * ticks[min(len(ticks) - 1, int(len(ticks) * 0.99))],
            "max_ms": 1000 * ticks[-1],
            **{f"{k}_ms_per_tick": 1000 * v / len(ticks) for k, v in self.phase_seconds.items()},
        }

    def _tick_stats_text(self) -> str:
        stats = self._tick_stats()
        if not stats["ticks"]:
            return "no balancer tick ran"
        return (
            f"{stats['ticks']:.0f} balancer ticks: p50 {stats['p50_ms']:.1f} ms, "
            f"p99 {stats['p99_ms']:.1f} ms, max {stats['max_ms']:.1f} ms"
        )

    def in_flight_running(self) -> bool:
        now = time.monotonic()
        return any(d.may_complete(now) for d in self.in_flight.values())
