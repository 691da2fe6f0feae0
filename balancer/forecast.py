"""Time to full: when each node's pool will reach its high water at the rate it fills.

NiFi predicts a queue's time to back pressure from its recent growth. So does this: a
node fills at the trend of its buffered bytes over the last ``WINDOW_S`` seconds (a
least-squares slope over the ticks in it; before two ticks, its rate in minus its rate
out). Measured on a live run (bench/bench_forecast.py), the trend of the bytes held beat
smoothed rates in and out: batches take segments and segments arrive in bursts, so an
average of the rates kept promising a fill long after a burst had stopped.

What the balancer has just changed upstream counts at once: when an upstream's rate
coefficient, or its explicit traffic share to the node, changes by some ratio, the
node's rate in over the window is scaled by it, and the filling rate changes by the
difference, instead of waiting for the trend to show it. A node that is not filling has
no time to full; one at or past its high water has 0. Pure: observations and pacing in,
seconds out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from balancer.model import Observation

WINDOW_S = 1.0


@dataclass(frozen=True)
class Pacing:
    """What the balancer set for a node as an upstream: its rate coefficient, and its
    explicit traffic share per downstream (None when the data's tags route it)."""

    coefficient: float
    shares: Mapping[str, float] | None = None


# (time, buffered bytes, rate in) of a node at one tick
Point = tuple[float, float, float]


@dataclass
class Forecast:
    """Each node's recent ticks, kept from one to the next."""

    history: dict[str, deque[Point]] = field(default_factory=dict)

    def update(
        self,
        observation: Observation,
        high_water: Mapping[str, float],
        before: Mapping[str, Pacing],
        after: Mapping[str, Pacing],
    ) -> dict[str, float | None]:
        """Seconds until each non-source node reaches ``high_water`` (a fraction of its
        capacity), given the pacing ``before`` and ``after`` this tick's actions."""
        topology = observation.topology
        now = observation.time_s
        full_in: dict[str, float | None] = {}
        history: dict[str, deque[Point]] = {}
        for node_id, node in observation.nodes.items():
            points = self.history.get(node_id, deque())
            points.append((now, node.buffered_bytes, node.in_rate))
            while points[0][0] < now - WINDOW_S:
                points.popleft()
            history[node_id] = points
            if topology.node(node_id).kind == "source":
                continue
            filling = _slope(points) if len(points) > 1 else node.in_rate - node.out_rate
            change = 1.0
            for upstream in topology.upstreams(node_id):
                change *= _change(before.get(upstream), after.get(upstream), node_id)
            rate_in = sum(p[2] for p in points) / len(points)
            filling += rate_in * (change - 1.0)
            capacity = topology.node(node_id).capacity_bytes
            full_in[node_id] = time_to_full(
                node.buffered_bytes, capacity, high_water[node_id], filling
            )
        self.history = history  # nodes a rescale retired are forgotten
        return full_in


def time_to_full(
    buffered: float, capacity: float, high_water: float, filling: float
) -> float | None:
    """Seconds until ``buffered`` reaches ``high_water`` x ``capacity`` at ``filling``
    bytes per second: 0 at or past it, None when the pool is not filling."""
    room = high_water * capacity - buffered
    if room <= 0:
        return 0.0
    if filling <= 0:
        return None
    return room / filling


def _slope(points: deque[Point]) -> float:
    """Bytes per second: the least-squares slope of the buffered bytes over time."""
    mean_t = sum(p[0] for p in points) / len(points)
    mean_b = sum(p[1] for p in points) / len(points)
    spread = sum((p[0] - mean_t) ** 2 for p in points)
    if spread <= 0:
        return 0.0
    return sum((p[0] - mean_t) * (p[1] - mean_b) for p in points) / spread


def _change(before: Pacing | None, after: Pacing | None, node: str) -> float:
    """By how much an upstream's pacing changed what it sends ``node``: the ratio of
    its coefficients, times that of its explicit shares to the node."""
    if before is None or after is None:
        return 1.0
    ratio = after.coefficient / before.coefficient if before.coefficient > 0 else 1.0
    if before.shares is not None and after.shares is not None:
        old = before.shares.get(node, 0.0)
        if old > 0:
            ratio *= after.shares.get(node, 0.0) / old
    return ratio
