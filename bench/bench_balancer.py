"""Time the balancer's decision functions over one run of 1,000 operator instances.

    .venv/bin/python bench/bench_balancer.py [--ticks 200] [--seed 7] [--gc-freeze]

The pipeline is a large layered job: 40 sources, eight stages of 110 instances and 80
sinks; stages are either forward-connected (one to one) or fully connected (a shuffle),
one keyed stage is not mergeable. Levels follow a seeded random walk, so some nodes cross
the watermarks, fill up or drain every tick.

Every function is called at its own decision period (the watermark and the rate
coefficient each sampling period, stepwise each sensitivity period, credit each credit
interval, shares and the loop each second), so every timed call does its full work.
Target: p99 under 10 ms per call. Wall and CPU times are both shown: on a shared machine
the wall clock also counts time spent waiting for a core.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from balancer.credit import CreditState, credit_step
from balancer.document import NodeKind
from balancer.loop import BalancerState, step
from balancer.model import NodeObservation, Observation
from balancer.policy import Policy
from balancer.rate import RateState, rate_tick
from balancer.shares import GroupKey, shares_tick
from balancer.stepwise import StepwiseState, stepwise_step
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import MB
from balancer.watermark import WatermarkState, flags_after, watermark_tick

TARGET_MS = 10.0
Samples = list[tuple[float, float]]
CAPACITY = 64 * MB
# (stage, instances, how it is fed by the previous stage, mergeable)
LAYOUT = (
    ("src", 40, "", True),
    ("parse", 110, "shuffle", True),
    ("filter", 110, "forward", True),
    ("enrich", 110, "forward", True),
    ("agg", 110, "shuffle", True),
    ("window", 110, "forward", True),
    ("dedupe", 110, "shuffle", False),
    ("format", 110, "forward", True),
    ("route", 110, "forward", True),
    ("sink", 80, "shuffle", True),
)


def pipeline() -> Topology:
    nodes: list[NodeSpec] = []
    links: list[LinkSpec] = []
    previous: list[str] = []
    for index, (stage, width, feed, mergeable) in enumerate(LAYOUT):
        kind: NodeKind = (
            "source" if index == 0 else "sink" if index == len(LAYOUT) - 1 else "operator"
        )
        members = [f"{stage}{i}" for i in range(width)]
        nodes.extend(NodeSpec(m, kind, stage, CAPACITY, mergeable) for m in members)
        if feed == "forward":
            links.extend(LinkSpec(a, b, 12.5 * MB) for a, b in zip(previous, members, strict=True))
        elif feed == "shuffle":
            links.extend(LinkSpec(a, b, 12.5 * MB) for a in previous for b in members)
        previous = members
    return Topology.build(nodes, links)


def frames(topology: Topology, period_s: float, count: int, seed: int) -> Iterator[Observation]:
    """``count`` observations ``period_s`` apart; levels random-walk in [0, 1]."""
    rng = random.Random(seed)  # noqa: S311 -- a reproducible workload, not a secret
    levels = {n.id: rng.random() * 0.6 for n in topology.nodes}
    flagged: frozenset[str] = frozenset()
    for tick in range(count):
        for node_id, level in levels.items():
            levels[node_id] = min(1.0, max(0.0, level + rng.uniform(-0.08, 0.08)))
        nodes = {
            node_id: NodeObservation(
                node=node_id,
                level=level,
                buffered_bytes=level * CAPACITY,
                in_rate=rng.uniform(0, 12.5 * MB),
                out_rate=rng.uniform(0, 12.5 * MB),
                flagged=node_id in flagged,
                speed=1.0,
                origin_speed=1.0,
                in_backpressure=False,
                head_by_route={},
                in_rate_by_route={},
                capacity_bps=math.inf,
                resource=node_id,
            )
            for node_id, level in levels.items()
        }
        observation = Observation(tick * period_s, period_s, topology, nodes)
        yield observation
        flagged = frozenset(n for n, level in levels.items() if level >= 0.7)


def timed(calls: Iterator[Callable[[], object]], warmup: int = 5) -> list[tuple[float, float]]:
    """(wall ms, CPU ms) per call. On a shared machine the wall clock also counts time
    spent waiting for a core; the CPU time is what the decision itself costs."""
    samples = []
    for index, call in enumerate(calls):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        elapsed = ((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000)
        if index >= warmup:
            samples.append(elapsed)
    return samples


def bench_watermark(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    states: dict[str, WatermarkState] = {}

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, policy.sampling_period_s, ticks, seed):

            def call(observation: Observation = observation) -> None:
                nonlocal states
                _, states = watermark_tick(observation, states, policy)

            yield call

    return timed(calls())


def bench_rate(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    states: dict[str, RateState] = {}

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, policy.sampling_period_s, ticks, seed):
            flagged = flags_after(observation, [])

            def call(
                observation: Observation = observation, flagged: frozenset[str] = flagged
            ) -> None:
                nonlocal states
                _, states = rate_tick(observation, flagged, states, policy)

            yield call

    return timed(calls())


def bench_shares(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    shares: dict[GroupKey, dict[str, float]] = {}

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, 1.0, ticks, seed):

            def call(observation: Observation = observation) -> None:
                nonlocal shares
                _, shares = shares_tick(observation, shares, policy)

            yield call

    return timed(calls())


def bench_stepwise(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    state = StepwiseState()
    # Scale the thresholds to the random walk: about a tenth of the nodes overloaded.
    policy = policy.replace(overload_mb=0.8 * CAPACITY / MB, underload_kb=0.2 * CAPACITY / 1024)

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, policy.sensitivity_ms / 1000, ticks, seed):

            def call(observation: Observation = observation) -> None:
                nonlocal state
                _, state = stepwise_step(observation, state, policy)

            yield call

    return timed(calls())


def bench_credit(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    state = CreditState()

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, policy.credit_interval_ms / 1000, ticks, seed):

            def call(observation: Observation = observation) -> None:
                nonlocal state
                _, state = credit_step(observation, state, policy)

            yield call

    return timed(calls())


def bench_loop(topology: Topology, policy: Policy, ticks: int, seed: int) -> Samples:
    state = BalancerState()

    def calls() -> Iterator[Callable[[], object]]:
        for observation in frames(topology, 1.0, ticks, seed):

            def call(observation: Observation = observation) -> None:
                nonlocal state
                state = step(observation, state, policy).state

            yield call

    return timed(calls())


def percentiles(values: tuple[float, ...]) -> tuple[float, float]:
    return statistics.median(values), statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="freeze the start-up heap first (gc.freeze), as a long-running worker can, "
        "so full collections do not rescan it",
    )
    args = parser.parse_args()

    topology = pipeline()
    policy = Policy()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{len(topology.nodes)} nodes, {len(topology.links)} links, {args.ticks} calls each, "
        f"{os.cpu_count()} CPUs, load average {load}, gc.freeze {args.gc_freeze}\n"
        f"policy: throttling={policy.throttling}, routing={policy.routing}, "
        f"migration={policy.migration}"
    )
    benches = {
        "watermark_tick": bench_watermark,
        "rate_tick": bench_rate,
        "shares_tick": bench_shares,
        "stepwise_step": bench_stepwise,
        "credit_step": bench_credit,
        "loop.step": bench_loop,
    }
    print(
        f"{'function':<16}{'wall p50':>10}{'wall p99':>10}{'cpu p50':>10}{'cpu p99':>10}"
        f"   ms, target p99 < {TARGET_MS:g}"
    )
    for name, bench in benches.items():
        samples = bench(topology, policy, args.ticks, args.seed)
        figures = [q for column in zip(*samples, strict=True) for q in percentiles(column)]
        verdict = "ok" if figures[1] < TARGET_MS else "over"
        print(f"{name:<16}" + "".join(f"{f:>10.2f}" for f in figures) + f"   {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
