"""The run driver: the loop that runs one pipeline's source, batches and balancer.

Exactly one driver per run holds the run's ZooKeeper lock; taking it bumps the run's
epoch, which fences any older owner out of the ledger. The driver pauses while its
ZooKeeper session is SUSPENDED and stops on LOST (its lock is gone; the watchdog starts
a new driver elsewhere, which resumes from the ledger). Through a PostgreSQL outage it
keeps its lock, waits for the database, and resumes from the ledger itself.

Each loop the driver:
1. lets the source send what its pacing allows (orchestrator.run.pacer);
2. reads the ledger's flows once and dispatches a batch for every node with arrived
   data and no batch in flight (orchestrator.run.dispatch);
3. every tick: observes the run and applies ``balancer.loop.step``'s actions through
   its :class:`~orchestrator.run.runtime.LiveRuntime`, handles operators' commands,
   steps a hot rescale, writes flags and events, and hands the tick's node states to
   the reporter thread (ZooKeeper and the live snapshot);
4. finishes the run when the source is exhausted (an unbounded one once an operator
   stopped it: orchestrator.source), nothing is in flight and the sink has merged every
   chunk it took in exactly once (orchestrator.run.completion).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone
from kazoo.exceptions import LockTimeout

from balancer.capacity import CapacityMeter
from balancer.credit import credit_grants
from balancer.document import NodeDocument
from balancer.forecast import Forecast
from balancer.loop import BalancerState, forget, step
from balancer.model import SHARED_POOL, ClearFlag, NodeState, Observation
from balancer.policy import Policy
from balancer.reductions import Reductions
from balancer.runtime import Measured
from balancer.sizing import ArrivalMeter, size_stages
from balancer.topology import Topology
from orchestrator.ledger import busy, retention, seen, segments
from orchestrator.ledger import windows as window_ledger
from orchestrator.ledger.coalesce import coalesce
from orchestrator.ledger.events import record_event, thin_events
from orchestrator.ledger.failures import fail_run
from orchestrator.ledger.segments import NodeFlow
from orchestrator.models import Instance, Run
from orchestrator.pipeline.graph import (
    RunGraph,
    graph_of,
    pipeline_sink,
    pipeline_windows,
    result_grouping,
)
from orchestrator.pipeline.inputs import InputError
from orchestrator.rescale.control import RescaleControl
from orchestrator.rescale.plan import topology_at
from orchestrator.rescale.start import ensure_instances
from orchestrator.run import generation, observer
from orchestrator.run.actions import ActionTable
from orchestrator.run.capacity_log import CapacityLog
from orchestrator.run.commands import OperatorCommands, SignalQueue
from orchestrator.run.completion import TickStats, settle
from orchestrator.run.dispatch import BatchDispatch, Dispatcher
from orchestrator.run.key_loads import KeyLoads
from orchestrator.run.pacer import SourceGraph, SourcePacer, source_graph
from orchestrator.run.publisher import Publisher
from orchestrator.run.references import Refresher
from orchestrator.run.reporter import Report, Reporter
from orchestrator.run.runtime import LiveRuntime
from orchestrator.run.snapshot import SNAPSHOT_FIELDS, build_snapshot
from orchestrator.run.wakeups import Wakeups
from orchestrator.sink.layout import layout_of
from orchestrator.sink.targets import Sink, SinkError, sink_of
from orchestrator.source.base import SourceUnavailable
from orchestrator.zk.control_plane import ControlPlane, Subscription
from sparkjobs.event_time import WindowSpec
from sparkjobs.measures import Grouping

log = logging.getLogger(__name__)

LOOP_S = 0.1
DATABASE_ERRORS = (OperationalError, InterfaceError)
# How often a driver whose database went away tries it again.
DATABASE_RETRY_S = 0.5
# How often a source whose server is down is tried again before the run can start.
SOURCE_RETRY_S = 2.0
# The resource of the sink's merges: the control workers.
CONTROL_POOL = "control pool"
# How often merged data's segment files (and old rows) are deleted while a run goes on.
RETENTION_S = 5.0


class RunDriver:
    def __init__(
        self,
        run_id: int,
        control: ControlPlane,
        identity: str,
        *,
        dispatch: Dispatcher,
        publish: Publisher,
        host_running: Callable[[], bool] = lambda: True,
    ) -> None:
        self.run_id, self.key, self.identity = run_id, str(run_id), identity
        self.control, self.publish, self.dispatch = control, publish, dispatch
        # False once the process hosting the driver is shutting down: the driver gives
        # the run up (its lock is released) instead of holding that shutdown up for days.
        self.host_running = host_running
        self.lost = False
        self._fresh()

    def _fresh(self) -> None:
        """What one attempt at driving the run builds; a new attempt starts from the
        ledger as a new driver would."""
        self.table = ActionTable(self.control, self.run_id, on_graph_change=self._reload_topology)
        self.batches = BatchDispatch(
            self.run_id, self.dispatch, self.table.routes, self.table.batch_bounds
        )
        self.state = BalancerState()
        self.decided = False  # the balancer has ticked once (_dispatch_batches)
        self.stats = TickStats()
        self.node_states: dict[str, NodeState] = {}
        self.forecast = Forecast()
        # The last tick's time to full per node: what the console showed when the next
        # tick decided.
        self.full_in: dict[str, float | None] = {}
        self.subscriptions: list[Subscription] = []
        self.rescale: RescaleControl | None = None
        self.windows: WindowSpec | None = None
        # The aggregating stage's grouped measures, and where closed windows go: _start.
        self.grouping: Grouping
        self.sink: Sink
        # Made once the input exists (a generated input is written first): _start.
        self.pacer: SourcePacer
        self.runtime: LiveRuntime
        self.topology: Topology  # the balancer's view, set by _reload_topology
        self.graph: RunGraph  # the run's document as the runtime asks it, with the topology
        self.flows: dict[str, NodeFlow] = {}  # the ledger's flows, read once a loop
        self.started = False
        # What each operator sends on per byte it takes in, as measured; the balancer's
        # capacities after a node count in its input bytes (balancer/reductions.py).
        self.reductions = Reductions.of(())
        # Each node's true processing rate, from its batches (balancer/capacity.py), the
        # latest completion read, and what each node's work last ran on.
        self.capacities = CapacityMeter()
        self.next_grant = 0.0  # when credit is next granted between ticks
        self.busy_after: dt.datetime | None = None
        self.resources: dict[str, str] = {}
        self.key_loads = KeyLoads(self.run_id)
        # The source's arrival rate from outside the run (balancer/sizing.py), and what
        # each adjustment did to its stages' capacity.
        self.arrivals = ArrivalMeter()
        self.capacity_log = CapacityLog(self.run_id)
        self.references: Refresher | None = None  # the refreshed joins' reads: _start

    def drive(self, lock_timeout_s: float = 2.0) -> str:
        lock = self.control.driver_lock(self.key, self.identity)
        try:
            acquired = lock.acquire(timeout=lock_timeout_s)
        except LockTimeout:  # kazoo raises on the timeout rather than returning False
            acquired = False
        if not acquired:
            return "another driver holds this run"
        callback = self.control.session.on_lost(self._on_lost)
        try:
            while True:
                try:
                    return self._attempt()
                except DATABASE_ERRORS as err:
                    # PostgreSQL restarting: the driver keeps the run's lock, waits for
                    # the database and resumes from the ledger (a new epoch fences
                    # whatever the interrupted attempt had sent), instead of giving the
                    # run up to a watchdog that needs the database too.
                    log.warning("run %s: database unreachable (%s); waiting", self.run_id, err)
                    if not wait_for_database(alive=lambda: not self.lost and self.host_running()):
                        return "lost" if self.lost else "the worker is stopping"
                    self._fresh()
        finally:
            self.control.session.remove(callback)
            if not self.lost:
                lock.release()

    def _attempt(self) -> str:
        self.reporter = Reporter(self.run_id, self.control, self.table.routes, self.publish)
        self.reporter.start()
        self.wakeups = Wakeups(self.run_id)
        try:
            return self._drive()
        finally:
            self.wakeups.close()
            self.reporter.stop()
            if self.rescale is not None:
                self.rescale.close()
            if self.references is not None:
                self.references.close()
            for subscription in self.subscriptions:
                subscription.cancel()
            if self.started:
                self.pacer.input.close()

    def _on_lost(self) -> None:
        # Runs in kazoo's thread: only note it; the loop gives the run up.
        self.lost = True

    def _drive(self) -> str:
        # A driver started while the run was active may get the lock only after the run
        # ended (it waited behind the driver that finished it, or behind dead drivers
        # whose locks the watchdog broke): an ended run is not taken over. The chaos suite
        # saw four drivers in turn resume a completed landing run, each in a new epoch.
        status = Run.objects.values_list("status", flat=True).get(pk=self.run_id)
        if status not in Run.ACTIVE:
            return str(status)
        self.epoch = self.table.routes.epoch = segments.bump_epoch(self.run_id)
        # ZooKeeper's fence follows the ledger's: older owners' routes writes are refused.
        self.control.raise_epoch(self.key, self.epoch)
        run = Run.objects.get(pk=self.run_id)
        self.policy = Policy.from_mapping(run.policy)
        self.source: NodeDocument = next(n for n in run.topology["nodes"] if n["kind"] == "source")
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
        waiting = self._start_when_the_source_answers(run)
        if waiting is not None:
            return waiting
        return self._loop(run)

    def _start_when_the_source_answers(self, run: Run) -> str | None:
        """Start; a source whose server is down (a stream's Redis) is waited for, and the
        run can still be stopped meanwhile; one whose files are gone fails the run."""
        reported = False
        while True:
            try:
                self._start(run)
                return None
            except InputError as exc:
                return self._input_failed(exc)
            except SourceUnavailable as exc:
                if not reported:
                    record_event(self.run_id, "source_unavailable", str(exc))
                    reported = True
            time.sleep(SOURCE_RETRY_S)
            run.refresh_from_db(fields=["status", "epoch"])
            if self.lost or run.epoch != self.epoch:
                return "superseded by a newer driver"
            if not run.is_active:
                return str(run.status)

    def _input_failed(self, error: InputError) -> str:
        """A file gone or swapped since the run measured it: no retry brings it back, so
        the run fails with why."""
        fail_run(self.run_id, f"the input could not be read: {error}")
        return str(Run.Status.FAILED)

    def _start(self, run: Run) -> None:
        self.pacer = SourcePacer(
            run, self.epoch, self.source, self.table.controls, self.table.routes
        )
        self.pacer.reconfigure(self.topology, self.source_graph)
        ended = self.table.routes.restore(self.topology)
        self.table.flags.flagged = set(self.control.flags(self.key))
        self.rescale = self.table.rescale = RescaleControl(
            self.run_id,
            self.control,
            epoch=self.epoch,
            source=self.source["name"],
            timeout_s=self.policy.adjust_timeout_s,
            placement=self.policy.placement,
            scale_in_busy=self.policy.scale_in_busy,
            scale_in_after_s=self.policy.scale_in_after_s,
        )
        self.signals = SignalQueue(self.table, self.policy)
        self.commands = OperatorCommands(self.table, self.policy)
        self.subscriptions = [self.signals.watch(), self.commands.watch()]
        self.runtime = LiveRuntime(self.topology, self._measure, self.table, self.signals)
        # Event-time windows the sink closes as its watermark passes them, if any.
        self.windows = pipeline_windows(run.topology)
        self.grouping = result_grouping(run.topology)
        self.sink = sink_of(pipeline_sink(run.topology), layout_of(run.topology))
        self.references = Refresher(
            self.run_id,
            self.epoch,
            run.topology,
            source=str((run.input_spec or {}).get("kind", "")),
        )
        self.started = True
        if run.status == Run.Status.PENDING:
            # Only a run still pending: one cancelled since it was read stays cancelled
            # (the loop then sees it and ends), instead of running with nobody to stop it.
            Run.objects.filter(pk=self.run_id, status=Run.Status.PENDING).update(
                status=Run.Status.RUNNING, started_at=timezone.now()
            )
        took = f"driver {self.identity} took over, epoch {self.epoch}"
        if ended:
            moves = ", ".join(
                f"{heavy} -> {light}"
                for migrations in ended.values()
                for heavy, lights in sorted(migrations.items())
                for light in sorted(lights)
            )
            took += f"; migrations the last driver left end ({moves}): this one decides its own"
        record_event(self.run_id, "driver", took)

    def _loop(self, run: Run) -> str:
        self.interval_s = max(self.policy.tick_ms / 1000, 0.1)
        tick_s, next_tick = self.policy.tick_ms / 1000, time.monotonic()
        next_sweep = time.monotonic() + RETENTION_S
        early_settle_after = 0.0
        while True:
            if self.lost:
                log.warning("run %s: ZooKeeper session lost; giving up the run", self.run_id)
                return "lost"
            if not self.host_running():
                log.warning("run %s: the worker is stopping; giving up the run", self.run_id)
                return "the worker is stopping"
            if self.control.session.is_suspended:
                time.sleep(LOOP_S)
                continue
            run.refresh_from_db(fields=["status", "epoch"])
            if run.epoch != self.epoch or self.table.routes.superseded:
                return "superseded by a newer driver"
            if run.status in (Run.Status.CANCELLED, Run.Status.FAILED):
                # Stopped by an operator, or failed by a batch (orchestrator/ledger/failures.py).
                self._publish(run, final=True)
                self._give_workers_back()
                return str(run.status)
            now, sending = time.monotonic(), False
            running = run.status in (Run.Status.RUNNING, Run.Status.STOPPING)
            if run.status == Run.Status.STOPPING:
                self.pacer.drain()  # an unbounded input: finish what was taken in
            if running or now >= next_tick:
                # One read of the ledger per loop, for the source, the dispatch and the
                # tick alike; a second only after the source sent something.
                self._read_flows()
            if running:
                self._grant_credits(now)
                try:
                    sending = self._emit(now)
                except segments.StaleEpochError:
                    return "superseded by a newer driver"
                except InputError as exc:
                    self._input_failed(exc)
                    continue  # the next loop sees the run failed
                self._dispatch_batches(now, sending=sending)
                if self.rescale is not None and self.rescale.poll():
                    self._reload_topology()
                if now >= early_settle_after and self._all_merged(now):
                    # The last merge is in: the run settles now rather than at its next
                    # tick, up to a tick later (0.5 s of a 10 s run, measured). Once
                    # per tick at most, in case something else holds it open.
                    next_tick = min(next_tick, now)
                    early_settle_after = now + tick_s
            if now >= next_tick:
                began = time.perf_counter()
                self._tick()
                self.stats.ticks.append(time.perf_counter() - began)
                next_tick = now + tick_s
                if self._finished(run):
                    self._give_workers_back()
                    return run.status
            next_sweep = self._upkeep(now, next_sweep, running=running)
            if not sending:  # a source with more to send now goes on at once
                self.wakeups.sleep(self._nap_s(next_tick))

    def _upkeep(self, now: float, next_sweep: float, *, running: bool) -> float:
        """Beside the data: refreshed joins' tables read again when due, and merged data
        swept every ``RETENTION_S``. Returns when the next sweep is due."""
        if running and self.references is not None:
            self.references.poll(now)
        if now < next_sweep:
            return next_sweep
        self._retain()
        return now + RETENTION_S

    def _dispatch_batches(self, now: float, *, sending: bool) -> None:
        """A batch task for each node with data waiting (orchestrator/run/dispatch.py),
        none before the balancer's first tick: the bounds it sets on batches
        (balancer/queued.py) hold from the first one."""
        if self.decided:
            self.batches.dispatch_ready(
                now, self.flows, self.graph, self.rescale, source_sending=sending
            )

    def _grant_credits(self, now: float) -> None:
        """Under credit-based flow control, every upstream's credit from the pools as
        read now, once per credit interval (``credit_interval_ms``): a pool that a batch
        emptied is offered to its upstream within that interval, not at the next tick,
        so a fast worker does not idle for a grant (ADR 17). A node with no flow yet
        holds nothing."""
        if self.policy.throttling != "credit" or now < self.next_grant:
            return
        buffered = {
            n: float(self.flows[n].queued_bytes) if n in self.flows else 0.0
            for n in self.topology.order
        }
        for action in credit_grants(self.topology, buffered):
            self.table.apply(action)
        self.next_grant = now + self.policy.credit_interval_ms / 1000

    def _emit(self, now: float) -> bool:
        """The source's slice (:meth:`SourcePacer.emit`) after the flows were read, so
        it sees the room a batch that just ended made before the next batch is sent
        (one sent first takes only what had arrived by then); the flows are read again
        if it sent anything, so the dispatch sees that too."""
        emitted = self.pacer.emitted_bytes
        sending = self.pacer.emit(now)
        self.pacer.input.housekeeping()
        if self.pacer.emitted_bytes != emitted:
            self._read_flows()
        return sending

    def _read_flows(self) -> None:
        self.flows = segments.node_flows(
            self.run_id, timezone.now() - timedelta(seconds=self.interval_s)
        )
        self.pacer.pool = {node: flow.queued_bytes for node, flow in self.flows.items()}

    def _nap_s(self, next_tick: float) -> float:
        """How long the loop sleeps: a loop while the source has input to send or an
        adjustment is under way; once the source has sent everything, until the next
        tick, since what the run then waits for wakes it sooner: a batch ending, a
        stop (orchestrator/run/wakeups.py). Without the loop's reads beside its batch,
        a bounded run of 512 MB ended 0.2 s sooner (medians of six) and its control
        worker used 0.1 CPU seconds less (docs/benchmarks.md, "2026-11-29 (sixth)")."""
        adjusting = self.rescale is not None and self.rescale.current is not None
        if self.pacer.done and not adjusting:
            return max(0.0, next_tick - time.monotonic())
        return LOOP_S

    def _measure(self, topology: Topology) -> Measured:
        return observer.measure(
            topology,
            self.flows,
            self.pacer,
            time_s=time.monotonic(),
            interval_s=self.interval_s,
            capacities=self.capacities.capacities(topology.order),
            resources=self.resources,
            arrivals=self.arrivals,
            key_loads=self.key_loads.read(
                self.graph,
                self._pressed(topology),
                adjusting=self.rescale is not None and self.rescale.current is not None,
                now=time.monotonic(),
            ),
        )

    def _pressed(self, topology: Topology) -> set[str]:
        """Nodes flagged, or whose pool is past the policy's ``bp_threshold``."""
        full = {
            node
            for node, flow in self.flows.items()
            if topology.has_node(node)
            and flow.queued_bytes > self.policy.bp_threshold * topology.node(node).capacity_bytes
        }
        return full | set(self.table.flags.flagged)

    def _measure_capacities(self, topology: Topology) -> None:
        """Add the batches completed since the last tick to each node's capacity, with
        those running now (balancer.capacity: a running batch bounds the rate too); a
        node now running on another resource starts its estimate again."""
        resources = {node: self._resource_of(topology, node) for node in topology.order}
        for node, resource in resources.items():
            if self.resources.get(node, resource) != resource:
                self.capacities.forget(node)
        self.resources = resources
        completed = busy.completed_since(self.run_id, self.busy_after)
        self.capacities.add(completed.batches)
        self.capacities.running(busy.running(self.run_id))
        self.busy_after = completed.latest

    def _resource_of(self, topology: Topology, node: str) -> str:
        """What ``node``'s work runs on: an operator's live Spark worker where it is
        placed, else the shared pool of Spark workers; the sink's merges run on the
        control workers; the source reads in the driver. A node at an emulated rate
        (``max_rate_mbps``) is its own resource: its token bucket, not the cores, bounds
        it."""
        spec = topology.node(node)
        kind = spec.kind
        if spec.max_rate_bps:
            return node
        if kind == "operator":
            worker = self.rescale.worker_of(node) if self.rescale is not None else ""
            return worker or SHARED_POOL
        return CONTROL_POOL if kind == "sink" else node

    def _tick(self) -> None:
        phase = self.stats.phase
        with phase("observe"):
            self._measure_reductions()
            self._measure_capacities(self.topology)
            observation = self.runtime.observe()
        with phase("decide"):
            # Each node as the balancer sees it now, thresholds and pacing before its
            # decisions: kept with the events of the actions, to show why.
            self.table.seen = self._node_states(observation, self.full_in)
            paced = self.table.pacing(observation.topology.order)
            decision = step(observation, self.state, self.policy)
            self.state = decision.state
            self.decided = True
        with phase("apply"):
            self.runtime.apply(decision.actions)
            self.commands.handle(observation)
            self.signals.handle()
            with phase("adjust"):
                if self.rescale is not None and self.rescale.tick():
                    self._reload_topology()
                if self.rescale is not None and self.rescale.consider_scale_in(
                    {n: s.get("busy") for n, s in self.node_states.items()},
                    time.monotonic(),
                    sizes=(
                        (lambda: size_stages(observation, self.policy.scale_out_horizon_s))
                        if self.policy.scale_out == "measured"
                        else None
                    ),
                ):
                    self._reload_topology()
                if self.rescale is not None:
                    self.capacity_log.update(observation, self.rescale.current, time.monotonic())
            with phase("flags"):
                self.table.flags.flush(self.control, self.key)
            with phase("events"):
                self.reporter.add_events(self.table.timeline.take())
            if self.windows is not None:
                with phase("windows"):
                    self._close_windows()
        with phase("report"):
            states = self._node_states(observation)
            self.full_in = self.forecast.update(
                observation,
                {node: state["high_water"] for node, state in states.items()},
                before=paced,
                after=self.table.pacing(observation.topology.order),
            )
            self.node_states = self._node_states(observation, self.full_in)
            # Read this tick by the observation (orchestrator/run/observer.py).
            lag = self.pacer.last_lag.to_json() if self.pacer.input.unbounded else None
            self.reporter.submit(Report(self.node_states, self.table.routes.tables(), lag))

    def _close_windows(self, *, final: bool = False) -> bool:
        """Close what the sink's watermark passed; a sink that cannot be written fails
        the run with why (nothing of that step was committed). False: it failed."""
        if self.windows is None:
            return True
        try:
            window_ledger.advance(
                self.run_id,
                self.windows,
                self.sink,
                grouping=self.grouping,
                final=final,
            )
        except SinkError as exc:
            fail_run(self.run_id, f"the sink could not be written: {exc}")
            return False
        return True

    def _node_states(
        self, observation: Observation, full_in: Mapping[str, float | None] | None = None
    ) -> dict[str, NodeState]:
        return observer.node_states(
            observation,
            flagged=self.table.flags.flagged,
            controls=self.table.controls,
            state=self.state,
            policy=self.policy,
            full_in=full_in,
            busy={
                node: self.capacities.busy_share(node, time.time()) for node in observation.nodes
            },
            capacities=self.capacities.capacities(observation.nodes),
        )

    def _measure_reductions(self) -> None:
        """Add the last interval's bytes in and out of each operator; give the balancer
        the ratios when they have moved."""
        since = timezone.now() - timedelta(seconds=self.interval_s)
        taken = {node: flow.done_bytes for node, flow in self.flows.items()}
        if self.reductions.add(taken, segments.sent_bytes(self.run_id, since)):
            self.topology = self.topology.with_reductions(self.reductions.give())
            self.runtime.topology = self.topology

    def _reload_topology(self) -> None:
        """The run's graph after a hot rescale began, completed or rolled back: what the
        balancer observes, and what the source routes with."""
        run = Run.objects.only("topology", "config_version").get(pk=self.run_id)
        self.graph = graph_of(run.topology)
        graph = self.graph.topology
        self.reductions.keep_only(n.id for n in graph.nodes if n.kind == "operator")
        self.topology = graph.with_reductions(self.reductions.give())
        self.state = forget(self.state, frozenset(self.topology.order))
        for gone in sorted(self.table.flags.flagged - set(self.topology.order)):
            self.table.apply(ClearFlag(reason=f"{gone} was retired by a hot rescale", node=gone))
        name = self.source["name"]
        config = Instance.objects.get(run_id=self.run_id, name=name).config
        self.source_graph: SourceGraph = source_graph(topology_at(run, config, name), config, name)
        self.table.routes.prune(self.topology)
        if self.started:
            self.pacer.reconfigure(self.topology, self.source_graph)
            self.runtime.topology = self.topology

    def _publish(self, run: Run, *, final: bool = False) -> None:
        run.refresh_from_db(fields=SNAPSHOT_FIELDS)
        snapshot = build_snapshot(
            run, node_states=self.node_states, routes=self.table.routes.tables(), final=final
        )
        self.publish(self.run_id, snapshot)

    def _all_merged(self, now: float) -> bool:
        """A cheap sign that the run may be over, from what this loop read anyway: the
        input is all sent, no node holds or has queued anything, no batch is running.
        ``_finished`` decides."""
        return (
            self.pacer.done
            and all(
                f.queued_bytes == 0 and f.arrived_waiting == 0 and f.held == 0
                for f in self.flows.values()
            )
            and not self.batches.running(now)
        )

    def _finished(self, run: Run) -> bool:
        if not self.pacer.done or self.batches.running(time.monotonic()):
            return False
        if (self.rescale is not None and self.rescale.current is not None) or segments.unfinished(
            self.run_id
        ):
            return False
        # Merged, all of it: a landing folder's last files are archived or deleted now.
        try:
            self.pacer.input.housekeeping(now=True)
        except InputError as exc:  # its folder was swapped: nothing is cleaned through it
            self._input_failed(exc)
            return False
        # The input ended: its watermark is past every window. A sink that cannot take
        # them failed the run, which the next loop reports (never settled as complete).
        if not self._close_windows(final=True):
            return False
        # Every pool is empty now: no node is backpressured any more.
        for node in sorted(self.table.flags.flagged):
            self.table.apply(ClearFlag(reason="run finished: every pool is empty", node=node))
        self.table.flags.flush(self.control, self.key)
        self.reporter.add_events(self.table.timeline.take())
        self.reporter.write_events()  # the timeline ends with the run's own last events
        settle(run, self.epoch, self.stats)
        self._publish(run, final=True)
        # Every segment is done now: none of their files is needed any more.
        while self._retain().files_deleted:
            pass
        return True

    def _give_workers_back(self) -> None:
        """The run ended: the Spark workers it asked of the elastic pool go back."""
        if self.rescale is not None:
            try:
                self.rescale.ended()
            except Exception:  # the run has ended either way
                log.warning("run %s: its workers' ask was not cleared", self.run_id, exc_info=True)

    def _retain(self) -> retention.Swept:
        """Delete what merged data no longer needs: segment files always, and the
        identities a deduplicate stage remembered for its ``within_s``; for a run that
        goes on without end, old segment rows too, its merged chunks' rows coalesce
        into its merged prefix and its old balancer events thin out (a bounded run's
        rows are its record until ``manage.py clean_runs``)."""
        unbounded = self.started and self.pacer.input.unbounded
        within = seen.periods(self.graph.document)
        if within:
            seen.forget(self.run_id, within)
        if unbounded:
            coalesce(self.run_id, older_than_s=settings.BPCONSOLE_MERGED_KEEP_S)
            thin_events(self.run_id, older_than_s=settings.BPCONSOLE_EVENTS_KEEP_S)
        keep = settings.BPCONSOLE_SEGMENT_ROWS_KEEP_S if unbounded else None
        return retention.sweep(self.run_id, keep_rows_s=keep)


def wait_for_database(*, alive: Callable[[], bool]) -> bool:
    """Block until the database answers again (True), or until ``alive`` says the
    driver was superseded or its worker is stopping meanwhile (False)."""
    while alive():
        with contextlib.suppress(*DATABASE_ERRORS):
            connection.close()  # the broken connection: the next query opens a new one
        try:
            connection.ensure_connection()
            return True
        except DATABASE_ERRORS:
            time.sleep(DATABASE_RETRY_S)
    return False
