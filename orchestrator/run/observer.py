"""What a live run measures at its nodes, and what each node then shows.

The ledger says what every pool holds and what arrived and was processed over the
interval; the source's read-ahead says what it is about to send, per route. The
balancer's own state (flags, task speeds) is added by balancer.runtime.observe, as in
the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from balancer.capacity import Capacity, stage_bps
from balancer.loop import BalancerState
from balancer.model import KeyLoad, NodeState, Observation, SourceLoad
from balancer.policy import Policy
from balancer.runtime import Measured, Measurement
from balancer.sizing import ArrivalMeter
from balancer.topology import Topology
from orchestrator.ledger.segments import NodeFlow
from orchestrator.run.controls import Controls
from orchestrator.run.pacer import SourcePacer


def measure(
    topology: Topology,
    flows: Mapping[str, NodeFlow],
    pacer: SourcePacer,
    *,
    time_s: float,
    interval_s: float,
    capacities: Mapping[str, Capacity],
    resources: Mapping[str, str],
    key_loads: Mapping[str, KeyLoad],
    arrivals: ArrivalMeter,
) -> Measured:
    """Each node's measurement over the last interval; ``capacities``: what its batches
    showed it can do (a capacity not yet known is ``math.inf``); ``resources``: what
    its work runs on; ``key_loads``: the keyed stages' records per key slot, where read
    this tick. An unbounded source's backlog (what waits outside the run and its
    read-ahead) and arrival rate (``arrivals``, fed here once a tick) go with them."""
    nodes = {}
    load: SourceLoad | None = None
    blocked = pacer.take_blocked()
    for node_id in topology.order:
        if topology.node(node_id).kind == "source":
            head = pacer.head_by_route()
            arriving = {r: b / interval_s for r, b in pacer.take_sent_by_route().items()}
            rate = sum(arriving.values())
            if pacer.input.unbounded:
                # The source's lag counts all that is not in the ledger yet, its
                # read-ahead included: added again, the read-ahead's filling and
                # draining would read as arrivals twice over.
                backlog = float(max(pacer.lag().bytes, sum(head.values())))
                load = SourceLoad(backlog, arrivals.add(time_s, rate * interval_s, backlog))
            nodes[node_id] = Measurement(
                buffered_bytes=float(int(sum(head.values()))),
                in_rate=rate,
                out_rate=rate,
                head_by_route=head,
                in_rate_by_route=arriving,
                capacity_bps=math.inf,
                resource=resources.get(node_id, node_id),
            )
            continue
        flow = flows.get(node_id)
        offered = (flow.arrived_bytes if flow else 0) + blocked.get(node_id, 0)
        nodes[node_id] = Measurement(
            buffered_bytes=float(flow.queued_bytes if flow else 0),
            in_rate=offered / interval_s,
            out_rate=(flow.done_bytes if flow else 0) / interval_s,
            head_by_route={},
            in_rate_by_route={},
            capacity_bps=stage_bps(
                capacities,
                node_id,
                topology.stage_members(topology.node(node_id).stage_name),
            ),
            resource=resources.get(node_id, node_id),
            waiting_bytes=float(flow.waiting_bytes if flow else 0),
        )
    return Measured(time_s, interval_s, nodes, key_loads=key_loads, source=load)


def node_states(
    observation: Observation,
    *,
    flagged: Collection[str],
    controls: Controls,
    state: BalancerState,
    policy: Policy,
    full_in: Mapping[str, float | None] | None = None,
    busy: Mapping[str, float | None] | None = None,
    capacities: Mapping[str, Capacity] | None = None,
) -> dict[str, NodeState]:
    """What each node shows in the console and in ZooKeeper after a tick: the flags and
    pacing as the tick's actions left them, ``full_in`` (balancer.forecast), ``busy``
    (balancer.capacity.CapacityMeter.busy_share) and its records per second of busy
    time (from ``capacities``)."""
    states: dict[str, NodeState] = {}
    for node_id, obs in observation.nodes.items():
        control = controls.of(node_id)
        watermark = state.watermarks.get(node_id)
        states[node_id] = NodeState(
            level=round(obs.level, 4),
            buffered_bytes=int(obs.buffered_bytes),
            in_rate=round(obs.in_rate, 1),
            out_rate=round(obs.out_rate, 1),
            high_water=round(watermark.high_water if watermark else policy.high_water, 3),
            low_water=round(watermark.low_water if watermark else policy.low_water, 3),
            flagged=node_id in flagged,
            rate_coefficient=round(control.coefficient, 3),
            speed=round(control.speed.speed, 4),
            origin_speed=round(control.speed.origin_speed, 4),
            in_backpressure=control.speed.in_backpressure,
            full_in_s=_seconds((full_in or {}).get(node_id)),
            capacity_bps=round(obs.capacity_bps, 1) if math.isfinite(obs.capacity_bps) else None,
            resource=obs.resource,
            busy=_share((busy or {}).get(node_id)),
            capacity_rps=_records_per_s((capacities or {}).get(node_id)),
        )
    return states


def _records_per_s(found: Capacity | None) -> float | None:
    if found is None or not found.known or found.records_per_s <= 0:
        return None
    return round(found.records_per_s, 1)


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
