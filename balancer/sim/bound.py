"""What no policy can beat: max flow, the fluid bound and the minimum migrated share.

* :func:`max_flow`: the most bytes per second the topology can carry from its sources to
  its sinks (links limited by bandwidth, nodes by their emulated processing rate).
* :func:`fluid_bound`: the completion time of an ideal queue fed by the source's
  schedule and drained at the max-flow rate. Whatever the routing, data cannot leave
  the pipeline faster than max flow, nor before it was emitted.
* :func:`reduced_max_flow`: max flow counted in the source's bytes when operators shrink
  (or grow) what passes through them, as live operators do: an aggregation's output
  is a small fraction of its input, so the links after it carry far more of the
  source's data than their bandwidth in bytes. The live fluid bound is
  :func:`schedule_bound` at this rate (bench/bench_policies.py).
* :func:`minimum_share`: a lower bound on the share of the data that must leave its
  tagged branch for the run to finish by a given time. Branch ``i`` alone carries at
  most ``c_i`` bytes per second (its max flow with the source's other links cut), so by
  time ``T`` it can have finished at most ``D_i(T)`` of its own data, where ``D_i`` is
  the output of a fluid queue fed by tag ``i``'s arrivals and drained at ``c_i``. The
  rest, ``V_i - D_i(T)``, must go through other branches. This assumes unbounded queues
  and free reordering, so it is a floor: no policy can migrate less and still finish by
  ``T``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from balancer.sim.workload import Workload
from balancer.topology import Topology


def max_flow(topology: Topology, keep_source_links: frozenset[str] | None = None) -> float:
    """Max flow from every source to every sink, bytes per second (``inf`` if unlimited).

    With ``keep_source_links`` only the sources' links into those nodes carry data: the
    capacity of a subset of branches.
    """
    # Node-split graph: n_in -> n_out carries the node's processing limit.
    capacity: dict[str, dict[str, float]] = {}

    def add(u: str, v: str, c: float) -> None:
        capacity.setdefault(u, {})[v] = capacity.get(u, {}).get(v, 0.0) + c
        capacity.setdefault(v, {}).setdefault(u, 0.0)

    for spec in topology.nodes:
        add(f"{spec.id}:in", f"{spec.id}:out", spec.max_rate_bps or math.inf)
    sources = set(topology.sources())
    for link in topology.links:
        if (
            keep_source_links is not None
            and link.src in sources
            and link.dst not in keep_source_links
        ):
            continue
        add(f"{link.src}:out", f"{link.dst}:in", link.bandwidth_bps or math.inf)
    for s in sources:
        add("<s>", f"{s}:in", math.inf)
    for t in topology.sinks():
        add(f"{t}:out", "<t>", math.inf)
    return _edmonds_karp(capacity, "<s>", "<t>")


def _edmonds_karp(capacity: dict[str, dict[str, float]], s: str, t: str) -> float:
    flow = 0.0
    while True:
        parent: dict[str, str] = {s: s}
        queue = deque([s])
        while queue and t not in parent:
            u = queue.popleft()
            for v, c in capacity[u].items():
                if c > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if t not in parent:
            return flow
        path, v = [], t
        while v != s:
            path.append((parent[v], v))
            v = parent[v]
        push = min(capacity[u][v] for u, v in path)
        if math.isinf(push):
            return math.inf
        for u, v in path:
            capacity[u][v] -= push
            capacity[v][u] += push
        flow += push


def branch_capacities(topology: Topology) -> dict[str, float]:
    """Max flow through each downstream of the (single) source, alone."""
    (source,) = topology.sources()
    return {child: max_flow(topology, frozenset({child})) for child in topology.downstreams(source)}


def reduced_max_flow(topology: Topology, reductions: Mapping[str, float]) -> float:
    """Max flow in the sources' bytes per second, when node ``n`` sends on
    ``reductions[n]`` bytes per byte it takes in (1 where not given).

    Each capacity is converted to source bytes: a link out of ``u`` carries
    ``bandwidth / gain(u)`` of them, where ``gain(u)`` is the product of the reductions on
    the way from the source to ``u``'s output, and a node's processing limit applies to
    its input, ``max_rate / gain(input of n)``. Where paths into a node differ in gain
    the smallest is taken, which overstates the flow: the time bound stays a bound.
    """
    gain_in, gain_out = topology.with_reductions(reductions).source_shares
    nodes = [
        replace(spec, max_rate_bps=_in_source_bytes(spec.max_rate_bps, gain_in[spec.id]))
        for spec in topology.nodes
    ]
    links = [
        replace(link, bandwidth_bps=_in_source_bytes(link.bandwidth_bps, gain_out[link.src]))
        for link in topology.links
    ]
    return max_flow(Topology.build(nodes, links))


def _in_source_bytes(capacity_bps: float, gain: float) -> float:
    """A capacity in source bytes per second; 0 stays "unlimited", and so does a
    capacity that carries nothing of the source's (gain 0)."""
    if capacity_bps <= 0 or gain <= 0:
        return 0.0
    return capacity_bps / gain


def schedule_bound(arrivals: np.ndarray, sizes: np.ndarray, rate_bps: float) -> float:
    """Completion time of an ideal queue fed ``sizes[k]`` bytes at ``arrivals[k]``
    (non-decreasing) and drained at ``rate_bps``.

    The queue is done at ``T`` iff for every ``s <= T`` what arrived before ``s`` plus
    ``rate * (T - s)`` covers the volume; the binding ``s`` is an arrival instant, so
    ``T = max_k (a_k + (V - bytes before arrival k) / rate)``.
    """
    if len(arrivals) == 0:
        return 0.0
    before = np.cumsum(sizes) - sizes
    return float(np.max(arrivals + (float(np.sum(sizes)) - before) / rate_bps))


def fluid_bound(workload: Workload, rate_bps: float) -> float:
    """Completion time of an ideal queue fed by ``workload`` and drained at ``rate_bps``
    (:func:`schedule_bound` of its packets)."""
    sizes = np.full(workload.packets, workload.packet_bytes, dtype=float)
    return schedule_bound(workload.arrivals, sizes, rate_bps)


def own_branch_output(workload: Workload, tag: int, rate_bps: float, until_s: float) -> float:
    """Bytes of tag ``tag`` a fluid queue draining at ``rate_bps`` has output by ``until_s``.

    ``D(T) = min(A(T), min over arrivals a_m <= T of (A(a_m-) + rate * (T - a_m)))``.
    """
    times = workload.arrivals[workload.tag_index == tag]
    times = times[times <= until_s]
    if len(times) == 0:
        return 0.0
    before = np.arange(len(times)) * workload.packet_bytes
    candidates = before + rate_bps * (until_s - times)
    return float(min(len(times) * workload.packet_bytes, candidates.min()))


def minimum_share(workload: Workload, capacities: Mapping[str, float], until_s: float) -> float:
    """Share of the volume that must leave its tagged branch to finish by ``until_s``."""
    per_tag = workload.bytes_per_tag()
    must_move = 0.0
    for index, tag in enumerate(workload.tags):
        done = own_branch_output(workload, index, capacities[tag], until_s)
        must_move += max(0.0, per_tag[tag] - done)
    return must_move / workload.volume_bytes
