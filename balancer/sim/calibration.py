"""How the live runtime processes data, for a simulator that predicts it.

The published model (every node a consumer taking one packet at a time, packets
unchanged from source to sink) does not describe a live run: there, operators are Spark
jobs that take everything their pool holds as one batch, each batch costs a fixed
time plus a time per byte on a pool of Spark workers that every operator shares, and an
aggregation sends on only a few per cent of the bytes it reads. With one Spark worker
busy 91% of a link-limited run (docs/benchmarks.md, "Balancing policies, live"), the
worker, not the links, set the pace, and no policy ranking made in the published model
carried over.

:class:`RuntimeModel` holds those facts; :func:`fit_batch_cost` fits the batch cost
from a live run's batches (bench/bench_policies.py measures them from the ledger). A run in
``placement = placed`` gave each operator a Spark worker of its own, and those workers
need not be alike (S1 caps their CPU at 1, 0.5 and 0.25 core): one cost for all of them
cannot replay it, so each placed operator has its own :class:`NodeCost`, fitted by
:func:`fit_node_cost` from its own batches.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from balancer.topology import Topology, check_reductions

# Gaps between one batch's end and the next one's start shorter than this are the
# runtime's own cost of starting a batch (task delivery, the claim); longer ones are a
# worker with nothing to do.
BACK_TO_BACK_S = 1.0


@dataclass(frozen=True)
class NodeCost:
    """A placed operator's batches on the Spark worker it was placed on: each costs
    ``fixed_s`` plus its bytes over ``bytes_per_s``. Operators placed on one ``worker``
    take turns on it, as a live worker runs one batch at a time; "" is a worker of the
    operator's own."""

    fixed_s: float
    bytes_per_s: float
    worker: str = ""

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0 and self.bytes_per_s > 0):
            raise ValueError(
                f"a placed batch's fixed cost must be >= 0 and its rate positive: {self}"
            )

    def batch_s(self, size_bytes: float) -> float:
        return self.fixed_s + size_bytes / self.bytes_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_fixed_s": round(self.fixed_s, 4),
            "batch_mb_per_s": _mb(self.bytes_per_s),
            "worker": self.worker,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeCost:
        return cls(
            fixed_s=float(data["batch_fixed_s"]),
            bytes_per_s=_bytes(data["batch_mb_per_s"]),
            worker=str(data.get("worker", "")),
        )


@dataclass(frozen=True)
class RuntimeModel:
    """Operators run as batches on ``workers`` shared workers: a batch takes all its
    node's waiting input (until it holds ``max_batch_bytes``, the segment that crosses
    them included) and costs ``batch_fixed_s`` plus its
    bytes over ``batch_bytes_per_s``. ``reductions``: the bytes each operator was
    measured to send on per byte it took in (a replay gives them to its topology).
    ``placed``: the operators whose batches run on a Spark worker they were placed on
    instead (``placement = placed``), each at its own cost; their batches never take a
    sibling's data, as a live placed batch never does."""

    workers: int = 1
    batch_fixed_s: float = 0.0
    batch_bytes_per_s: float = math.inf
    max_batch_bytes: float = math.inf
    reductions: Mapping[str, float] = field(default_factory=dict)
    # A sink merges batches too, one at a time, on the control worker. At 0 and
    # unlimited, it merges each packet as it arrives.
    sink_batch_fixed_s: float = 0.0
    sink_batch_bytes_per_s: float = math.inf
    placed: Mapping[str, NodeCost] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("a runtime needs at least one worker")
        if not (self.batch_fixed_s >= 0 and self.batch_bytes_per_s > 0):
            raise ValueError("a batch's fixed cost must be >= 0 and its rate positive")
        if not (self.sink_batch_fixed_s >= 0 and self.sink_batch_bytes_per_s > 0):
            raise ValueError("a sink batch's fixed cost must be >= 0 and its rate positive")
        if not self.max_batch_bytes > 0:
            raise ValueError("a batch must be able to hold some bytes")
        check_reductions(self.reductions)

    def batch_s(self, size_bytes: float) -> float:
        return self.batch_fixed_s + size_bytes / self.batch_bytes_per_s

    def check_placed(self, topology: Topology) -> None:
        """Raise ValueError naming the placed nodes that are not operators of
        ``topology``: a cost fitted to a node the pipeline does not run."""
        operators = {n.id for n in topology.nodes if n.kind == "operator"}
        unknown = sorted(set(self.placed) - operators)
        if unknown:
            raise ValueError(f"placed nodes that are not operators of the pipeline: {unknown}")

    @property
    def batches_sinks(self) -> bool:
        return self.sink_batch_fixed_s > 0 or math.isfinite(self.sink_batch_bytes_per_s)

    def sink_batch_s(self, size_bytes: float) -> float:
        return self.sink_batch_fixed_s + size_bytes / self.sink_batch_bytes_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "batch_fixed_s": round(self.batch_fixed_s, 4),
            "batch_mb_per_s": _mb(self.batch_bytes_per_s),
            "max_batch_mb": _mb(self.max_batch_bytes),
            "reductions": {k: round(v, 5) for k, v in self.reductions.items()},
            "sink_batch_fixed_s": round(self.sink_batch_fixed_s, 4),
            "sink_batch_mb_per_s": _mb(self.sink_batch_bytes_per_s),
            "placed": {n: c.to_json() for n, c in sorted(self.placed.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuntimeModel:
        """Raises ValueError (or KeyError, TypeError) on a document that is not one. A
        document without ``placed`` (a pooled run's) places nothing."""
        return cls(
            workers=int(data["workers"]),
            batch_fixed_s=float(data["batch_fixed_s"]),
            batch_bytes_per_s=_bytes(data["batch_mb_per_s"]),
            max_batch_bytes=_bytes(data["max_batch_mb"]),
            reductions={str(k): float(v) for k, v in dict(data["reductions"]).items()},
            sink_batch_fixed_s=float(data.get("sink_batch_fixed_s", 0.0)),
            sink_batch_bytes_per_s=_bytes(data.get("sink_batch_mb_per_s")),
            placed={
                str(n): NodeCost.from_json(c) for n, c in dict(data.get("placed") or {}).items()
            },
        )


def _mb(value: float) -> float | None:
    return None if math.isinf(value) else round(value / 2**20, 4)


def _bytes(mb: object) -> float:
    return math.inf if mb is None else float(mb) * 2**20  # type: ignore[arg-type]


class BatchSample(NamedTuple):
    """One operator batch of a live run: when its worker began and finished it (seconds
    from the run's start) and the bytes it took."""

    began_s: float
    done_s: float
    bytes: float


def fit_runtime(
    runs: Sequence[Sequence[BatchSample]],
    *,
    workers: int,
    max_batch_bytes: float,
    reductions: Mapping[str, float],
    sink_runs: Sequence[Sequence[BatchSample]] = (),
) -> RuntimeModel:
    """The runtime that the operator batches of one or more live runs show: their cost
    fitted by :func:`fit_batch_cost` over all of them, plus the median gap between
    back-to-back batches of a run (the cost of starting one, outside its
    claim-to-completion time; with several workers batches overlap and no gap is read).
    The sink's batches (``sink_runs``), if given, are fitted the same way."""
    sink_fixed, sink_rate = 0.0, math.inf
    if any(sink_runs):
        sink_fixed, sink_rate = fit_batch_cost(
            [(b.bytes, b.done_s - b.began_s) for bs in sink_runs for b in bs]
        )
    fixed, rate = fit_batch_cost([(b.bytes, b.done_s - b.began_s) for bs in runs for b in bs])
    start = _start_s(runs) if workers == 1 else 0.0
    return RuntimeModel(
        workers=workers,
        batch_fixed_s=fixed + start,
        batch_bytes_per_s=rate,
        max_batch_bytes=max_batch_bytes,
        reductions=dict(reductions),
        sink_batch_fixed_s=sink_fixed,
        sink_batch_bytes_per_s=sink_rate,
    )


def fit_node_cost(batches: Sequence[BatchSample], *, worker: str = "") -> NodeCost:
    """The cost of one placed operator's batches on ``worker``: :func:`fit_batch_cost`
    over them, plus the median gap between its back-to-back batches (the cost of
    starting one, as :func:`fit_runtime` reads it for one worker).

    Batches that cannot separate a fixed cost from a rate (all of one size, or times
    that do not grow with the size) give their throughput instead: their bytes over
    their seconds as the rate, no fixed cost but the gap, which is what the balancer
    was shown of them and what they cost at the size they were. Each placed worker has
    a speed of its own, so it is measured from its batches, never taken from the other
    operators; raises ValueError without any batch to measure."""
    if not batches:
        raise ValueError("0 batches: nothing shows its rate")
    fixed, rate = fit_batch_cost([(b.bytes, b.done_s - b.began_s) for b in batches])
    if not math.isfinite(rate):
        seconds = sum(b.done_s - b.began_s for b in batches)
        fixed, rate = 0.0, sum(b.bytes for b in batches) / seconds if seconds > 0 else math.inf
    return NodeCost(fixed + _start_s([batches]), rate, worker)


def _start_s(runs: Sequence[Sequence[BatchSample]]) -> float:
    """The median gap between back-to-back batches of each run, 0 with none."""
    gaps = [
        later.began_s - earlier.done_s
        for batches in runs
        for earlier, later in itertools.pairwise(sorted(batches))
        if 0 <= later.began_s - earlier.done_s < BACK_TO_BACK_S
    ]
    return statistics.median(gaps) if gaps else 0.0


def fit_batch_cost(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(fixed seconds, bytes per second)`` of ``seconds = fixed + bytes / rate``, fitted
    by least squares to ``(bytes, seconds)`` samples.

    The fit is constrained to a cost that makes sense: a negative fixed cost is taken as
    0 (the rate refitted through the origin), and batches that are all alike in size
    give only their mean time, as a fixed cost with an unlimited rate.
    """
    if not samples:
        raise ValueError("no batches to fit")
    sizes = np.array([s for s, _ in samples], dtype=float)
    seconds = np.array([t for _, t in samples], dtype=float)
    if np.ptp(sizes) <= 0:
        return float(seconds.mean()), math.inf
    slope, fixed = np.polyfit(sizes, seconds, 1)
    if fixed < 0:
        slope, fixed = float(sizes @ seconds / (sizes @ sizes)), 0.0
    if slope <= 0:
        return float(seconds.mean()), math.inf
    return float(fixed), float(1 / slope)
