"""The one contract between the balancer and the two runtimes it drives.

A runtime is where decisions take effect: the simulator (:mod:`balancer.sim.runtime`)
in virtual time, or a live run (``orchestrator.run.runtime``) on the ledger and
ZooKeeper. Each measures its nodes its own way (packet counters, ledger flows) and
hands the measurements to :func:`observe`, which adds what the balancer set earlier
(flags, task speeds) the same way for both; each applies the same actions. So a policy
fed the same measurements takes the same decisions in both, which
``tests/orchestrator/run/test_runtime_contract.py`` checks policy by policy, and a
benchmark of the simulator says something about a live run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from balancer.model import Action, KeyLoad, NodeObservation, Observation, SourceLoad
from balancer.stepwise import TaskSpeed
from balancer.topology import Topology

# A batch of an instance on a Spark worker of its own claims at most this share of its
# pool. Claimed data counts in the pool's level until its batch commits, so a batch that
# took the whole pool leaves the upstream no room until it ends, and the worker then idles
# while the next batch's data arrives; with half, the other half is there when it ends
# and the pool refills meanwhile. Both runtimes claim by it.
PLACED_BATCH_POOL_SHARE = 0.5


def placed_batch_bytes(pool_bytes: float) -> float:
    """The most one batch of a placed instance whose pool holds ``pool_bytes`` claims."""
    return PLACED_BATCH_POOL_SHARE * pool_bytes


class Runtime(Protocol):
    """Observe the nodes since the last observation; apply the actions decided on it."""

    def observe(self) -> Observation: ...

    def apply(self, actions: Sequence[Action]) -> None: ...


@dataclass(frozen=True, slots=True)
class Measurement:
    """What a runtime measured at one node over an interval, before the balancer's own
    state (flags, speeds) is added: the part each runtime measures its own way."""

    buffered_bytes: float
    in_rate: float  # bytes per second into the node's pool
    out_rate: float  # bytes per second processed and sent on
    head_by_route: Mapping[str, float]
    in_rate_by_route: Mapping[str, float]
    capacity_bps: float  # bytes per second of busy time; math.inf while unknown
    resource: str  # what the node's work runs on (NodeObservation.resource)
    waiting_bytes: float = 0.0  # arrived, not taken by a batch (NodeObservation)


@dataclass(frozen=True, slots=True)
class Measured:
    """One interval's measurements: when, over how long, and per node."""

    time_s: float
    interval_s: float
    nodes: Mapping[str, Measurement]
    # Keyed stages' key loads, where the runtime measured them (Observation.key_loads).
    key_loads: Mapping[str, KeyLoad] = field(default_factory=dict)
    # The source's backlog and arrival rate, where the runtime measured them.
    source: SourceLoad | None = None


def observe(
    topology: Topology,
    measured: Measured,
    *,
    flagged: Collection[str],
    speeds: Mapping[str, TaskSpeed],
) -> Observation:
    """The observation of every node of ``topology`` that was measured: its level on its
    capacity, its flag, and the task speed the last stepwise signal it applied left it
    at (full speed when none did)."""
    full = TaskSpeed()
    nodes = {}
    for node_id in topology.order:
        if node_id not in measured.nodes:
            continue
        m = measured.nodes[node_id]
        speed = speeds.get(node_id, full)
        nodes[node_id] = NodeObservation(
            node=node_id,
            level=min(1.0, m.buffered_bytes / topology.node(node_id).capacity_bytes),
            buffered_bytes=m.buffered_bytes,
            in_rate=m.in_rate,
            out_rate=m.out_rate,
            flagged=node_id in flagged,
            speed=speed.speed,
            origin_speed=speed.origin_speed,
            in_backpressure=speed.in_backpressure,
            head_by_route=m.head_by_route,
            in_rate_by_route=m.in_rate_by_route,
            capacity_bps=m.capacity_bps,
            resource=m.resource,
            waiting_bytes=m.waiting_bytes,
        )
    return Observation(
        measured.time_s,
        measured.interval_s,
        topology,
        nodes,
        key_loads=measured.key_loads,
        source=measured.source,
    )
