"""The virtual-time simulator: discrete events, driven by the real balancer decisions.

Model (docs/simulation.md, "Model"):

* **Nodes** own a fixed-length queue (``NodeSpec.capacity_bytes``) and one consumer
  that takes the head packet, processes it (``size / max_rate_bps``, instantly when the
  rate is unlimited) and forwards it; a sink consumes. A node forwards in FIFO order:
  when the head packet cannot go, nothing behind it goes (the reference experiment's
  single consumer thread). The source's queue is the emitted-but-unsent data and is
  unbounded (it is the input waiting to be read).
* **Links** serialise packets at their bandwidth, one after the other, then add their
  latency. A packet reserves its room in the receiver's queue when it enters the link,
  so a queue's level counts the data on the wire to it and can never overflow.
* **Flow control** (``policy.throttling``): ``stop_resume`` calls
  :func:`balancer.credit.stop_resume_step` at the instant a queue fills or drains to 50%
  (the per-node signals of the experiment); ``credit`` sends only what
  :func:`balancer.credit.credit_step` granted; ``watermark`` and ``stepwise`` pace a node
  at the rate coefficient or speed their decisions set (of the node's maximum output:
  its processing rate, else the total bandwidth of its links); ``window`` makes the
  source dispatch packets as batches to its downstreams through
  :mod:`balancer.window`. Every mode also blocks a send the receiver has no room for.
* **Routing**: a node sends a packet to its tag when the tag is one of its downstreams,
  else splits evenly; a ``SetShares`` split is realised keeping packets on their tag as
  long as the tag's share allows; a ``StartMigration`` then diverts ``share`` of what
  would enter the heavy branch to the light branch(es), evenly spread (error diffusion
  and smooth weighted round robin: deterministic, no random draw).
* **Batch mode** (a :class:`~balancer.sim.calibration.RuntimeModel`, for replaying a
  live run: docs/simulation.md, "Replaying a live run"): operators process batches on a
  pool of workers they share instead of one packet at a time, a batch taking every
  packet waiting at its node when a worker starts it and costing a fixed time plus a
  time per byte; an operator the model places (``RuntimeModel.placed``) runs its
  batches on its own worker at its own cost instead, never with a sibling's data; a
  sink merges its own batches one at a time. A node sends on its
  ``reduction`` of what it takes in, so packets shrink (or grow) on the way. A link
  queues as much as its receiver has room for, as a live run's emulated link does.
* **Controllers** (:mod:`balancer.sim.control`) are called at their period with an
  :class:`~balancer.model.Observation` measured over their own interval, and the
  actions they return are applied at once, both through a
  :class:`~balancer.sim.runtime.SimRuntime`: the contract a live run implements too
  (:mod:`balancer.runtime`).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from balancer import window as win
from balancer.capacity import BatchSample, CapacityMeter, stage_bps
from balancer.credit import RESUME_LEVEL, StopResumeState, stop_resume_step
from balancer.model import (
    SHARED_POOL,
    Action,
    BoundBatches,
    ClearFlag,
    MoveQueued,
    Observation,
    SetCredits,
    SetFlag,
    SetRate,
    SetShares,
    SetSpeed,
    StartMigration,
    StepwiseSignal,
    StopMigration,
)
from balancer.policy import Policy
from balancer.runtime import Measured, Measurement, placed_batch_bytes
from balancer.sim.calibration import RuntimeModel
from balancer.sim.runtime import SimRuntime
from balancer.sim.workload import Workload
from balancer.stepwise import TaskSpeed, apply_signal
from balancer.topology import Topology

_ARRIVE, _DELIVER, _WAKE, _CONTROL, _EXPIRE, _BATCH_DONE, _START = range(7)
_EPS = 1e-9
# Packets a link holds at once (one on the wire, one waiting): the sender's socket
# buffer. More waiting data stays in the sender's queue, where its level shows it. Not
# in batch mode: a live run's emulated link takes whatever the receiver's pool has room
# for, its segments in that pool from the moment they are sent and arriving after the
# link's delay, so the receiver's level shows them (orchestrator/ledger/segments.py
# ``node_flows``).
_LINK_BUFFER = 2
# Batch mode's pool of Spark workers, which every unplaced operator shares (a sink's
# pool is its node index; a placed worker's, the index of the first node placed on it).
_SPARK = -1
# How often window mode looks for timed-out batches; the timeout itself is the policy's.
_EXPIRE_CHECK_S = 1.0


class Controller(Protocol):
    """A balancer decision the simulator calls every ``period_s`` of virtual time."""

    period_s: float

    def decide(self, observation: Observation) -> list[Action]: ...


@dataclass(frozen=True)
class SimResult:
    """What one run measured."""

    completion_s: float
    volume_bytes: float
    migrated_bytes: float
    done_times: np.ndarray  # completion time of every packet, in emission order
    left_source: np.ndarray  # when every packet (its first copy) left the source
    actions: Mapping[str, int] = field(default_factory=dict)  # action count by kind

    @property
    def migrated_share(self) -> float:
        return self.migrated_bytes / self.volume_bytes

    def completed_fraction(self, every_s: float) -> list[tuple[float, float]]:
        """``(t, share of the volume done by t)`` for t = 0, every_s, ... up to the end."""
        done = np.sort(self.done_times)
        steps = math.ceil(self.completion_s / every_s)
        times = [i * every_s for i in range(steps + 1)]
        counts = np.searchsorted(done, times, side="right")
        return [(t, float(c) / len(done)) for t, c in zip(times, counts, strict=True)]


@dataclass(frozen=True)
class _Counters:
    """A node's cumulative byte counters at one instant (rates are their differences)."""

    bytes_in: float
    bytes_out: float
    route_in: dict[int, float]  # bytes in per default route, at nodes that branch


@dataclass
class _Migration:
    share: float
    targets: dict[int, float]
    error: float = 0.0  # error diffusion: share owed minus share given, in packets
    credit: dict[int, float] = field(default_factory=dict)  # smooth weighted round robin


@dataclass
class _Split:
    """A ``SetShares`` split being realised: shares and packets sent since it was set."""

    shares: dict[int, float]
    sent: dict[int, int]
    total: int = 0


class _Windows:
    """Window mode: the source's dispatcher (balancer.window) and, per consumer, the
    batches assigned to its window but not yet sent (its queue had no room)."""

    def __init__(self, consumers: Sequence[str], downs: Sequence[int], policy: Policy) -> None:
        self.state = win.WindowState.start(consumers, policy)
        self.delivered = win.SequenceSet()  # batches the consumers have passed on
        self.outbox: dict[int, deque[int]] = {d: deque() for d in downs}


class _Node:
    __slots__ = (
        "batched",
        "bytes_in",
        "bytes_out",
        "capacity",
        "credits",
        "downs",
        "flagged",
        "gate",
        "head_ready",
        "id",
        "in_backpressure",
        "index",
        "migrations",
        "next_send",
        "occupancy",
        "origin_speed",
        "pace",
        "proc_s",
        "queue",
        "r_max",
        "ready",
        "route_in",
        "speed",
        "splits",
        "ups",
        "wake_at",
    )

    def __init__(self, index: int, node_id: str, capacity: float, proc_s: float) -> None:
        self.index, self.id, self.capacity, self.proc_s = index, node_id, capacity, proc_s
        self.downs: tuple[int, ...] = ()
        self.ups: tuple[int, ...] = ()
        self.queue: deque[int] = deque()
        self.occupancy = 0.0
        self.head_ready = 0.0
        self.gate = True  # stop/resume: False while a downstream holds it stopped
        self.pace = 1.0  # rate coefficient or speed, of r_max
        self.r_max = math.inf
        self.next_send = 0.0
        self.bytes_in = 0.0
        self.bytes_out = 0.0
        self.route_in: dict[int, float] = {}
        self.wake_at = math.inf
        self.flagged = False
        self.speed = 1.0
        self.origin_speed = 1.0
        self.in_backpressure = False
        self.credits: dict[int, float] = {}
        self.splits: list[_Split] = []
        self.migrations: dict[int, _Migration] = {}
        # Batch mode (a RuntimeModel): packets at the head of the queue already processed,
        # and packets being processed in a batch behind them; -1: no batch asked for.
        self.ready = 0
        self.batched = -1


class Simulator:
    """One run of ``workload`` through ``topology`` under ``policy`` and ``controllers``."""

    def __init__(
        self,
        topology: Topology,
        workload: Workload,
        policy: Policy,
        controllers: Sequence[Controller] = (),
        runtime: RuntimeModel | None = None,
    ) -> None:
        """``runtime``: operators as the live runtime runs them (batches on shared
        workers); without it, the published model. Data shrinks at each node by its
        ``reduction`` (1 in the published model)."""
        (self.source_id,) = topology.sources()
        self.topology, self.workload, self.policy = topology, workload, policy
        self.controllers = tuple(controllers)
        self.size = workload.packet_bytes
        self.model = runtime
        ids = list(topology.order)
        self.index = {n: i for i, n in enumerate(ids)}
        # A packet's size in each node's queue and as it leaves the node (reduced by
        # the nodes it went through: topology.with_reductions).
        gain_in, gain_out = topology.source_shares
        self.in_size = [self.size * gain_in[n] for n in ids]
        self.out_size = [self.size * gain_out[n] for n in ids]
        self.nodes: list[_Node] = []
        for i, node_id in enumerate(ids):
            spec = topology.node(node_id)
            if spec.capacity_bytes < self.in_size[i] and node_id != self.source_id:
                raise ValueError(f"queue of {node_id} cannot hold one packet")
            proc_s = self.in_size[i] / spec.max_rate_bps if spec.max_rate_bps else 0.0
            node = _Node(i, node_id, spec.capacity_bytes, proc_s)
            node.downs = tuple(self.index[d] for d in topology.downstreams(node_id))
            node.ups = tuple(self.index[u] for u in topology.upstreams(node_id))
            # The maximum output a rate coefficient or speed is a fraction of.
            node.r_max = spec.max_rate_bps or sum(
                topology.link(node_id, d).bandwidth_bps or math.inf
                for d in topology.downstreams(node_id)
            )
            self.nodes.append(node)
        self.source = self.nodes[self.index[self.source_id]]
        # Link state per (src, dst): [free from, serialisation time, latency].
        self.links: dict[tuple[int, int], list[float]] = {}
        for link in topology.links:
            src = self.index[link.src]
            tx = self.out_size[src] / link.bandwidth_bps if link.bandwidth_bps else 0.0
            self.links[(src, self.index[link.dst])] = [0.0, tx, link.latency_s]
        self._batch_mode(runtime)
        self.tag_node = np.array([self.index[t] for t in workload.tags])[workload.tag_index]
        self.done_times = np.full(workload.packets, math.nan)
        self.left_source = np.full(workload.packets, math.nan)
        self.migrated = np.zeros(workload.packets, dtype=bool)
        self.done_count = 0
        # The source's latest chunk a full pool refused, per node: when, and its size.
        self.blocked: dict[int, tuple[float, float]] = {}
        self.now = 0.0
        self.events: list[tuple[float, int, int, int, int]] = []
        self.counter = itertools.count()
        self.action_counts: dict[str, int] = {}
        self.stop_resume = StopResumeState() if policy.throttling == "stop_resume" else None
        self.windows = (
            _Windows([ids[d] for d in self.source.downs], self.source.downs, policy)
            if policy.throttling == "window"
            else None
        )
        empty = _Counters(0.0, 0.0, {})
        self.snapshots: list[tuple[float, list[_Counters]]] = [
            (0.0, [empty] * len(self.nodes)) for _ in self.controllers
        ]
        self.runtimes = [
            SimRuntime(self, functools.partial(self._measure, i))
            for i in range(len(self.controllers))
        ]
        self.levels = SimRuntime(self, functools.partial(self._measure, None))

    def _pools(self, runtime: RuntimeModel | None) -> dict[int, int]:
        """Which nodes process batches, and in which pool of workers. Raises ValueError
        when the runtime places a node that is not one of the topology's operators."""
        pools: dict[int, int] = {}
        if runtime is None:
            return pools
        runtime.check_placed(self.topology)
        # A placed worker's pool: the index of the first node on it ("": the node's own).
        placed_pools: dict[tuple[str, str], int] = {}
        for n, i in self.index.items():
            kind = self.topology.node(n).kind
            placed = runtime.placed.get(n)
            if placed is not None:
                worker = (placed.worker, "" if placed.worker else n)
                pools[i] = placed_pools.setdefault(worker, i)
            elif kind == "operator":
                pools[i] = _SPARK
            elif kind == "sink" and runtime.batches_sinks:
                pools[i] = i
        return pools

    def _siblings(self) -> dict[int, tuple[int, ...]]:
        """Per operator on the shared Spark workers, the other instances of its stage
        whose waiting input its batch takes too, as the live worker does (orchestrator/
        worker/batch.py, siblings in one job): stateless, with no emulated rate of their
        own, and not placed (the live rule also asks for one operator with the same
        parameters, which a stage's instances have, and no event-time windows, which the
        simulator does not model)."""

        def fusable(i: int) -> bool:
            spec = self.topology.node(self.nodes[i].id)
            return self.pool_of.get(i) == _SPARK and spec.mergeable and not spec.max_rate_bps

        siblings = {}
        for i in self.pool_of:
            if fusable(i):
                stage = self.topology.node(self.nodes[i].id).stage_name
                siblings[i] = tuple(
                    self.index[m]
                    for m in self.topology.stage_members(stage)
                    if self.index[m] != i and fusable(self.index[m])
                )
        return siblings

    def _batch_mode(self, runtime: RuntimeModel | None) -> None:
        """Batch mode's state: unplaced operators share the pool of Spark workers
        (_SPARK); a placed worker and a sink each run their batches one at a time. Per
        pool, the nodes waiting for a worker in the order they asked, and the workers
        free."""
        self.pool_of = self._pools(runtime)
        self.batching = frozenset(self.pool_of)
        self.waiting_batches: dict[int, deque[int]] = {p: deque() for p in self.pool_of.values()}
        self.free_workers = {
            p: (runtime.workers if p == _SPARK and runtime is not None else 1)
            for p in self.pool_of.values()
        }
        self.siblings = self._siblings()
        self.fused: dict[int, tuple[int, ...]] = {}  # a running batch's lead -> its nodes
        self.start_pending: set[int] = set()  # pools with a start due at this instant
        # Each running batch's lead -> (when it started, the bytes it took); the capacity
        # the balancer is shown is measured from the batches, as the live driver's is.
        self.batch_began: dict[int, tuple[float, float]] = {}
        self.meter = CapacityMeter()
        # The most a node's next batch claims (bytes) where the balancer bounds it.
        self.batch_bounds: dict[int, float] = {}

    # --- the event loop -------------------------------------------------------------------

    def run(self, max_time_s: float) -> SimResult:
        self._push(float(self.workload.arrivals[0]), _ARRIVE, 0)
        for i in range(len(self.controllers)):
            self._push(0.0, _CONTROL, i)
        if self.windows is not None:
            self._push(_EXPIRE_CHECK_S, _EXPIRE)
        packets = self.workload.packets
        while self.done_count < packets:
            if not self.events:
                raise RuntimeError(f"deadlock at {self.now:.3f} s: nothing left to happen")
            time, _, kind, a, b = heapq.heappop(self.events)
            if time > max_time_s:
                raise RuntimeError(f"not finished after {max_time_s:.0f} s of virtual time")
            self.now = time
            if kind == _DELIVER:
                self._deliver(a, b)
            elif kind == _ARRIVE:
                self._arrive(a)
            elif kind == _WAKE:
                node = self.nodes[a]
                if node.wake_at <= time + _EPS:
                    node.wake_at = math.inf
                    self._forward(node)
            elif kind == _CONTROL:
                self._control(a)
            elif kind == _BATCH_DONE:
                self._batch_done(self.nodes[a])
            elif kind == _START:
                self.start_pending.discard(a)
                self._start_batches(a)
            elif self.windows is not None:
                self._expire(self.windows)
        return SimResult(
            completion_s=float(np.max(self.done_times)),
            volume_bytes=self.workload.volume_bytes,
            migrated_bytes=float(self.migrated.sum()) * self.size,
            done_times=self.done_times,
            left_source=self.left_source,
            actions=dict(self.action_counts),
        )

    def _push(self, time: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self.events, (time, next(self.counter), kind, a, b))

    def _wake(self, node: _Node, time: float) -> None:
        if time < node.wake_at - _EPS:
            node.wake_at = time
            self._push(time, _WAKE, node.index)

    def _arrive(self, packet: int) -> None:
        source = self.source
        arrivals = self.workload.arrivals
        # Packets emitted at the same instant arrive together.
        while packet < len(arrivals) and arrivals[packet] <= self.now + _EPS:
            if not source.queue:
                source.head_ready = self.now
            source.queue.append(packet)
            source.occupancy += self.size
            source.bytes_in += self.size
            self._count_route_in(source, packet)
            packet += 1
        if packet < len(arrivals):
            self._push(float(arrivals[packet]), _ARRIVE, packet)
        self._forward(source)

    def _deliver(self, node_index: int, packet: int) -> None:
        node = self.nodes[node_index]
        if not node.queue:
            node.head_ready = self.now + node.proc_s
        node.queue.append(packet)
        if node_index in self.batching:
            self._ask_batch(node)
        self._forward(node)

    # --- batch mode: operators as the live runtime runs them --------------------------------

    def _ask_batch(self, node: _Node) -> None:
        """A node with unprocessed input and no batch asks for one (a live driver sends
        one task per node at a time; the workers take tasks in the order sent)."""
        if node.batched < 0 and len(node.queue) > node.ready:
            node.batched = 0
            pool = self.pool_of[node.index]
            self.waiting_batches[pool].append(node.index)
            # Started once everything arriving at this instant is in: a live batch task
            # claims what the source's whole send slice delivered, not its first chunk.
            if pool not in self.start_pending:
                self.start_pending.add(pool)
                self._push(self.now, _START, pool)

    def _start_batches(self, pool: int) -> None:
        model = self.model
        if model is None:
            return  # the published model: no batches
        waiting = self.waiting_batches[pool]
        while self.free_workers[pool] and waiting:
            node = self.nodes[waiting.popleft()]
            if node.batched > 0:
                continue  # in a sibling's batch: it asks again when that one ends
            if len(node.queue) == node.ready:
                node.batched = -1  # a sibling's batch took all it had
                continue
            # The batch claims what has arrived when its worker starts it, its own
            # first, then its siblings' while it has room.
            room = min(model.max_batch_bytes, self.batch_bounds.get(node.index, math.inf))
            if node.id in model.placed:
                room = min(room, placed_batch_bytes(node.capacity))
            members: list[int] = []
            for member in (node.index, *self.siblings.get(node.index, ())):
                other = self.nodes[member]
                size = self.in_size[member]
                count = len(other.queue) - other.ready
                if other.batched > 0 or count == 0 or room <= 0:
                    continue
                # Until the batch holds its bytes, the segment crossing them included,
                # as the ledger's claim takes them.
                if math.isfinite(room):
                    count = min(count, math.ceil(room / size))
                other.batched = count
                room -= count * size
                members.append(member)
            self.free_workers[pool] -= 1
            taken = sum(self.nodes[m].batched * self.in_size[m] for m in members)
            self.fused[node.index] = tuple(members)
            self.batch_began[node.index] = (self.now, taken)
            self._push(self.now + self._batch_s(model, node, taken), _BATCH_DONE, node.index)

    def _batch_s(self, model: RuntimeModel, node: _Node, size_bytes: float) -> float:
        """How long ``node``'s batch of ``size_bytes`` takes: at its placed cost, on the
        shared workers, or as a sink's merge."""
        placed = model.placed.get(node.id)
        if placed is not None:
            return placed.batch_s(size_bytes)
        if self.pool_of[node.index] == _SPARK:
            return model.batch_s(size_bytes)
        return model.sink_batch_s(size_bytes)

    def _batch_done(self, lead: _Node) -> None:
        members = [self.nodes[m] for m in self.fused.pop(lead.index)]
        began, taken = self.batch_began.pop(lead.index)
        ids = tuple(node.id for node in members)
        self.meter.add([BatchSample(ids, taken, self.now - began, ended_s=self.now)])
        for node in members:
            node.ready += node.batched
            node.batched = -1
        pool = self.pool_of[lead.index]
        self.free_workers[pool] += 1
        for node in members:
            self._ask_batch(node)
        self._start_batches(pool)
        for node in members:
            self._forward(node)

    # --- forwarding -----------------------------------------------------------------------

    def _forward(self, node: _Node) -> None:
        """Send as many head packets as the node's consumer, links and receivers allow."""
        windows = self.windows
        if windows is not None and node is self.source:
            self._window_dispatch(windows)
            return
        acks = windows if windows is not None and node.index in self.source.downs else None
        batching = node.index in self.batching
        while node.queue:
            if batching and node.ready == 0:
                return  # the head is still being processed, or waits for a worker
            if not batching and node.head_ready > self.now + _EPS:
                self._wake(node, node.head_ready)
                return
            packet = node.queue[0]
            if not node.downs or (acks is not None and packet + 1 in acks.delivered):
                self._consume(node, packet, acks)  # a sink, or a copy already delivered
                continue
            if not node.gate:
                return
            if node.next_send > self.now + _EPS:
                self._wake(node, node.next_send)
                return
            route, target, commit = self._route(node, packet)
            spilled = False
            if not self._admits(node, target):
                light = self._spill(node, route, target)
                if light is None:
                    if node is self.source and self._pool_full(target):
                        # Demand the node could not take: part of its input rate, as
                        # the live source reports it, so a full pool still reads as
                        # "input faster than output".
                        self.blocked[target] = (self.now, self.in_size[target])
                    return
                target, spilled = light, True
            node.queue.popleft()
            if batching:
                node.ready -= 1
            commit()
            if spilled:
                self.migrated[packet] = True
            self._send(node, target, packet)
            if node.queue:
                node.head_ready = self.now + node.proc_s
            if acks is not None:
                self._window_ack(acks, node, packet)

    def _consume(self, node: _Node, packet: int, acks: _Windows | None) -> None:
        node.queue.popleft()
        if node.index in self.batching:
            node.ready -= 1
        node.occupancy -= self.in_size[node.index]
        node.bytes_out += self.in_size[node.index]
        if node.queue:
            node.head_ready = self.now + node.proc_s
        if acks is not None:
            self._window_ack(acks, node, packet)
        elif math.isnan(self.done_times[packet]):
            self.done_times[packet] = self.now
            self.done_count += 1
        self._after_drain(node)

    def _admits(self, node: _Node, target: int) -> bool:
        free_from, tx, _ = self.links[(node.index, target)]
        opens = free_from - (_LINK_BUFFER - 1) * tx
        if self.model is None and opens > self.now + _EPS:  # batch mode: see _LINK_BUFFER
            self._wake(node, opens)  # the link's send buffer is full until then
            return False
        if self._pool_full(target):
            return False  # the receiver's put() would block: no room
        size = self.in_size[target]
        if self.policy.throttling == "credit":
            return node.credits.get(target, 0.0) + _EPS >= size
        return True

    def _pool_full(self, target: int) -> bool:
        receiver = self.nodes[target]
        return receiver.occupancy + self.in_size[target] > receiver.capacity + _EPS

    def _send(self, node: _Node, target: int, packet: int) -> None:
        link = self.links[(node.index, target)]
        start = max(self.now, link[0])
        link[0] = start + link[1]
        self._push(link[0] + link[2], _DELIVER, target, packet)
        # Rates count a node's input bytes (as a live node's "done" does); what travels
        # the link is its output.
        taken, size = self.in_size[node.index], self.in_size[target]
        node.occupancy -= taken
        node.bytes_out += taken
        if node is self.source and math.isnan(self.left_source[packet]):
            self.left_source[packet] = self.now
        if node.credits:
            node.credits[target] = node.credits.get(target, 0.0) - size
        if node.pace < 1.0 and math.isfinite(node.r_max):
            node.next_send = self.now + self.out_size[node.index] / (node.pace * node.r_max)
        receiver = self.nodes[target]
        receiver.occupancy += size
        receiver.bytes_in += size
        self._count_route_in(receiver, packet)
        self._level_changed(receiver)
        self._after_drain(node)

    def _count_route_in(self, node: _Node, packet: int) -> None:
        tag = int(self.tag_node[packet])
        if len(node.downs) > 1 and tag in node.downs:
            node.route_in[tag] = node.route_in.get(tag, 0.0) + self.in_size[node.index]

    def _after_drain(self, node: _Node) -> None:
        self._level_changed(node)
        if not self._pool_full(node.index):
            for up in node.ups:
                self._wake(self.nodes[up], self.now)

    # --- routing ----------------------------------------------------------------------------

    def _route(self, node: _Node, packet: int) -> tuple[int, int, _Commit]:
        """The head packet's branch before any migration, where it goes, and what to
        record once it has gone."""
        tag = int(self.tag_node[packet])
        base = tag if tag in node.downs else -1
        split = next((s for s in node.splits if base in s.shares or base < 0), None)
        if split is not None:
            route = _split_choice(split, base)
        elif base >= 0 or len(node.downs) == 1:
            route = base if base >= 0 else node.downs[0]
        else:
            route = node.downs[packet % len(node.downs)]  # untagged here: spread evenly
        migration = node.migrations.get(route)
        target, moved_error = route, None
        if migration is not None:
            owed = migration.error + migration.share
            if owed >= 0.5:
                target = _weighted_choice(migration)
                moved_error = owed - 1.0
            else:
                moved_error = owed

        def commit() -> None:
            if split is not None:
                split.sent[route] = split.sent.get(route, 0) + 1
                split.total += 1
            if migration is not None and moved_error is not None:
                migration.error = moved_error
                if target != route:
                    for t, weight in migration.targets.items():
                        migration.credit[t] = migration.credit.get(t, 0.0) + weight
                    migration.credit[target] -= 1.0
            if (base >= 0 and target != base) or target != route:
                self.migrated[packet] = True

        return route, target, commit

    def _spill(self, node: _Node, route: int, target: int) -> int | None:
        """Where a packet goes whose ``target`` cannot take it now, when ``route``'s data
        is being migrated: the migration's light branch with the largest share that can
        (None: it waits, and the node with it), as the live source does
        (orchestrator/run/pacer.py)."""
        migration = node.migrations.get(route)
        if migration is None:
            return None
        for light in sorted(migration.targets, key=lambda t: (-migration.targets[t], t)):
            if light not in (route, target) and self._admits(node, light):
                return light
        return None

    # --- window mode: the source dispatches batches through balancer.window ---------------

    def _window_dispatch(self, windows: _Windows) -> None:
        """Assign waiting packets (batches ``seq = packet + 1``) to consumers' windows and
        send what the consumers' queues have room for; each consumer has its own outbox
        so a full consumer does not hold up the others."""
        source = self.source
        sends, windows.state = win.dispatch(windows.state, len(source.queue), self.now)
        for send in sends:
            target = self.index[send.consumer]
            if send.resend:
                packet = send.seq - 1
                source.occupancy += self.size  # a fresh copy of a batch that already left
            else:
                packet = source.queue.popleft()
                if target != int(self.tag_node[packet]):
                    self.migrated[packet] = True
            windows.outbox[target].append(packet)
        for target, outbox in windows.outbox.items():
            while outbox and self._admits(source, target):
                self._send(source, target, outbox.popleft())

    def _window_ack(self, windows: _Windows, node: _Node, packet: int) -> None:
        """Consumer ``node`` has processed ``packet`` (delivered it, or dropped a copy)."""
        _, windows.delivered = win.deliver(windows.delivered, packet + 1)
        windows.state = win.on_ack(windows.state, packet + 1, node.id, self.now, self.policy)
        self._wake(self.source, self.now)

    def _expire(self, windows: _Windows) -> None:
        late, windows.state = win.expire(windows.state, self.now, self.policy)
        if late:
            self.action_counts["batch_timeout"] = self.action_counts.get("batch_timeout", 0) + len(
                late
            )
        self._push(self.now + _EXPIRE_CHECK_S, _EXPIRE)
        self._wake(self.source, self.now)

    # --- control ----------------------------------------------------------------------------

    def _level_changed(self, node: _Node) -> None:
        if self.stop_resume is None:
            return
        # stop_resume_step only changes anything when a queue with upstreams has just
        # filled or drained to the resume level: call it at exactly those instants.
        if not node.ups:
            return
        level = node.occupancy / node.capacity
        holding = node.id in self.stop_resume.holding
        if (level >= 1.0 - _EPS and not holding) or (holding and level <= RESUME_LEVEL):
            observation = self.levels.observe()
            actions, self.stop_resume = stop_resume_step(observation, self.stop_resume)
            for action in actions:
                self._count(action.kind)
                if isinstance(action, SetRate):
                    upstream = self.nodes[self.index[action.node]]
                    upstream.gate = action.coefficient > 0
                    if upstream.gate:
                        self._wake(upstream, self.now)

    def _control(self, i: int) -> None:
        controller, runtime = self.controllers[i], self.runtimes[i]
        runtime.apply(controller.decide(runtime.observe()))
        self._push(self.now + controller.period_s, _CONTROL, i)
        for node in self.nodes:
            self._wake(node, self.now)

    def _measure(self, controller: int | None) -> Measured:
        """What was measured over controller ``controller``'s interval (None: levels
        only, at this instant)."""
        now = [_Counters(n.bytes_in, n.bytes_out, dict(n.route_in)) for n in self.nodes]
        if controller is None:
            since, before = self.now, now
        else:
            since, before = self.snapshots[controller]
            self.snapshots[controller] = (self.now, now)
        interval = self.now - since

        def rate(later: float, earlier: float) -> float:
            return (later - earlier) / interval if interval > 0 else 0.0

        def refused(node: _Node) -> float:
            at, size = self.blocked.get(node.index, (-math.inf, 0.0))
            return size if controller is not None and at >= since else 0.0

        order = self.topology.order
        self.meter.running(
            BatchSample(tuple(self.nodes[m].id for m in self.fused[lead]), taken, self.now - began)
            for lead, (began, taken) in self.batch_began.items()
        )
        measured = {
            node.id: Measurement(
                buffered_bytes=node.occupancy,
                in_rate=rate(node.bytes_in + refused(node), then.bytes_in),
                out_rate=rate(node.bytes_out, then.bytes_out),
                head_by_route=self._head_by_route(node) if len(node.downs) > 1 else {},
                in_rate_by_route={
                    order[d]: rate(b, then.route_in.get(d, 0.0)) for d, b in node.route_in.items()
                },
                capacity_bps=self._capacity_bps(node),
                resource=self._resource(node),
                waiting_bytes=self._waiting(node) * self.in_size[node.index],
            )
            for node, then in zip(self.nodes, before, strict=True)
        }
        return Measured(self.now, interval, measured)

    def _waiting(self, node: _Node) -> int:
        """Packets in the node's queue no batch or consumer has started on: on the
        modelled workers those behind its processed and batched ones, else all but the
        head."""
        if node.index in self.batching:
            return len(node.queue) - node.ready - max(node.batched, 0)
        return max(0, len(node.queue) - 1)

    def _capacity_bps(self, node: _Node) -> float:
        """What the node processes per second of busy time, in its input bytes: its
        emulated rate, or on the modelled Spark workers what its batches showed, as
        the live driver measures it (balancer/capacity.py, ``stage_bps``; a batch's
        fixed cost included); ``math.inf`` when nothing limits it or nothing is
        measured yet."""
        spec = self.topology.node(node.id)
        if spec.max_rate_bps:
            return spec.max_rate_bps
        if self.model is None or spec.kind == "sink":
            return math.inf
        if node.id in self.model.placed or self.pool_of.get(node.index) == _SPARK:
            peers = self.topology.stage_members(spec.stage_name)
            return stage_bps(self.meter.capacities(peers or (node.id,)), node.id, peers)
        return math.inf

    def _resource(self, node: _Node) -> str:
        """The modelled shared Spark workers are one pool every unemulated, unplaced
        operator shares; a placed operator's resource is its worker (shared with the
        operators placed on the same one); any other node is its own resource."""
        spec = self.topology.node(node.id)
        if spec.max_rate_bps:
            return node.id
        placed = self.model.placed.get(node.id) if self.model is not None else None
        if placed is not None:
            return placed.worker or node.id
        if self.pool_of.get(node.index) == _SPARK:
            return SHARED_POOL
        return node.id

    def flagged(self) -> frozenset[str]:
        return frozenset(node.id for node in self.nodes if node.flagged)

    def speeds(self) -> dict[str, TaskSpeed]:
        return {
            node.id: TaskSpeed(node.speed, node.origin_speed, node.in_backpressure)
            for node in self.nodes
        }

    def _head_by_route(self, node: _Node) -> dict[str, float]:
        """Bytes per tag among what the node sends next, at most one buffer of it."""
        size = self.in_size[node.index]
        limit = max(1, int(node.capacity // size))
        by_route: dict[str, float] = {}
        order = self.topology.order
        for packet in itertools.islice(node.queue, limit):
            tag = int(self.tag_node[packet])
            if tag in node.downs:
                by_route[order[tag]] = by_route.get(order[tag], 0.0) + size
        return by_route

    def apply(self, action: Action) -> None:
        """An action takes effect at once (SimRuntime.apply is the contract's door)."""
        self._count(action.kind)
        index = self.index
        if isinstance(action, StartMigration):
            node = self.nodes[index[action.branch_node]]
            heavy = index[action.heavy[0]]
            targets = action.targets or {action.light[0]: 1.0}
            previous = node.migrations.get(heavy)
            node.migrations[heavy] = _Migration(
                share=action.share,
                targets={index[t]: f for t, f in targets.items()},
                error=previous.error if previous else 0.0,
            )
        elif isinstance(action, StopMigration):
            self.nodes[index[action.branch_node]].migrations.pop(index[action.heavy[0]], None)
        elif isinstance(action, MoveQueued):
            self._move_queued(self.nodes[index[action.node]], action.moves)
        elif isinstance(action, BoundBatches):
            for member in action.members:
                self.batch_bounds.pop(index[member], None)
            self.batch_bounds.update({index[m]: b for m, b in action.bounds.items()})
        elif isinstance(action, SetCredits):
            node = self.nodes[index[action.upstream]]
            node.credits = {index[d]: c for d, c in action.credits.items()}
        elif isinstance(action, SetRate):
            self.nodes[index[action.node]].pace = action.coefficient
        elif isinstance(action, SetSpeed):
            node = self.nodes[index[action.node]]
            node.pace = node.speed = action.speed
            node.origin_speed, node.in_backpressure = action.origin_speed, action.in_backpressure
        elif isinstance(action, SetShares):
            node = self.nodes[index[action.upstream]]
            shares = {index[d]: s for d, s in action.shares.items()}
            node.splits = [s for s in node.splits if set(s.shares) != set(shares)]
            node.splits.append(_Split(shares, {}))
        elif isinstance(action, SetFlag | ClearFlag):
            self.nodes[index[action.node]].flagged = isinstance(action, SetFlag)
        elif isinstance(action, StepwiseSignal):
            # The task-message handler's part: the target applies the signal at once.
            target = self.nodes[index[action.target]]
            current = TaskSpeed(target.speed, target.origin_speed, target.in_backpressure)
            applied, _ = apply_signal(action, current, self.policy)
            if applied is not None:
                self.apply(applied)

    def _move_queued(self, giver: _Node, moves: Mapping[str, float]) -> None:
        """Whole packets from the tail of ``giver``'s waiting ones into each receiver's
        queue, as many as ``moves`` names bytes for and the receiver has room for."""
        size = self.in_size[giver.index]
        for target, wanted in moves.items():
            receiver = self.nodes[self.index[target]]
            taken = self.in_size[receiver.index]
            count = min(int(wanted // size), self._waiting(giver))
            moved = 0
            while moved < count and receiver.occupancy + taken <= receiver.capacity + _EPS:
                packet = giver.queue.pop()
                giver.occupancy -= size
                if not receiver.queue:
                    receiver.head_ready = self.now + receiver.proc_s
                receiver.queue.append(packet)
                receiver.occupancy += taken
                receiver.bytes_in += taken
                self.migrated[packet] = True
                moved += 1
            if moved:
                self._level_changed(receiver)
                if receiver.index in self.batching:
                    self._ask_batch(receiver)
                self._forward(receiver)
        self._after_drain(giver)

    def _count(self, kind: str) -> None:
        self.action_counts[kind] = self.action_counts.get(kind, 0) + 1


class _Commit(Protocol):
    def __call__(self) -> None: ...


def _split_choice(split: _Split, base: int) -> int:
    """Keep the packet on its tag while the tag is owed at least half a packet of its
    share; otherwise send it to the member owed the most."""
    total = split.total + 1
    owed = {m: share * total - split.sent.get(m, 0) for m, share in split.shares.items()}
    if base in owed and owed[base] >= 0.5:
        return base
    return max(owed, key=lambda m: owed[m])


def _weighted_choice(migration: _Migration) -> int:
    credit = migration.credit
    return max(migration.targets, key=lambda t: credit.get(t, 0.0) + migration.targets[t])
