"""What a finished run measured, for the simulator to replay it (balancer/sim/replay.py).

All of it comes from the ledger: each operator batch's claim and completion, the bytes
each operator took in and sent on, and the source's chunks in order with their tags. A
run in ``placement = placed`` gave each operator instance a Spark worker of its own, and
those need not be alike: each operator's cost is then fitted from its own batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import cast

import numpy as np
from django.conf import settings
from django.db.models import F, Max, Min, Sum

from balancer.document import PipelineDocument
from balancer.sim.calibration import (
    BatchSample,
    NodeCost,
    RuntimeModel,
    fit_node_cost,
    fit_runtime,
)
from balancer.sim.replay import Replay
from balancer.sim.workload import Workload
from balancer.units import MB
from orchestrator.models import Instance, Run, Segment
from orchestrator.pipeline.graph import RunGraph
from orchestrator.pipeline.routes import tagged_target


class CalibrationError(ValueError):
    """The run cannot be replayed; the message says why."""


def batches(run: Run, kind: str = "operator") -> list[BatchSample]:
    """Each batch of the run's nodes of ``kind`` (operators: on the Spark workers; the
    sink: on the control worker): when it was claimed and completed, and its bytes. A
    batch is the segments one lease owner completed: at one node, or at several siblings
    whose data one job ran (``orchestrator/worker/batch.py``)."""
    return sorted(sample for _, sample in _grouped(run, kind, "lease_owner"))


def node_batches(run: Run) -> dict[str, list[BatchSample]]:
    """Each operator's own batches: the segments one lease owner completed at it (a
    batch that also took a sibling's data counts at each of them, as its worker ran
    both; a placed batch never does)."""
    found: dict[str, list[BatchSample]] = {}
    for (_, node), sample in _grouped(run, "operator", "lease_owner", "node"):
        found.setdefault(node, []).append(sample)
    return {node: sorted(samples) for node, samples in found.items()}


def _grouped(run: Run, kind: str, *by: str) -> Iterator[tuple[tuple[str, ...], BatchSample]]:
    """The run's completed segments at its nodes of ``kind``, grouped by the columns
    ``by``: each group's values and its batch (claim to completion, bytes)."""
    start = run.started_at
    if start is None:
        return
    graph = RunGraph.of(cast("PipelineDocument", run.topology))
    nodes = [n for n in graph.nodes if graph.node(n)["kind"] == kind]
    found = (
        Segment.objects.filter(run=run, node__in=nodes, state=Segment.State.DONE)
        .exclude(claimed_at=None)
        .values(*by)
        .annotate(size=Sum("bytes"), began=Min("claimed_at"), done=Max("done_at"))
    )
    for b in found:
        sample = BatchSample(
            (b["began"] - start).total_seconds(),
            (b["done"] - start).total_seconds(),
            float(b["size"]),
        )
        yield tuple(b[column] for column in by), sample


def operator_reductions(run: Run) -> dict[str, float]:
    """Each operator's bytes sent on per byte taken in."""
    graph = RunGraph.of(cast("PipelineDocument", run.topology))
    found = {}
    segments = Segment.objects.filter(run=run, marker=False)
    for node in graph.nodes:
        if graph.node(node)["kind"] != "operator":
            continue
        taken = segments.filter(node=node).aggregate(n=Sum("bytes"))["n"]
        sent = segments.filter(upstream=node).aggregate(n=Sum("bytes"))["n"]
        if taken:
            found[node] = (sent or 0) / taken
    return found


def recorded_workload(run: Run, entry_times: Sequence[float] = ()) -> Workload:
    """The run's input as the simulator takes it: the source's chunks in order, each
    tagged with the branch its key routes to. A file's chunks are all there at the
    start; a stream's (``entry_times``: when each of its entries was added, in seconds)
    each when its last entry was."""
    graph = RunGraph.of(cast("PipelineDocument", run.topology))
    branches = tuple(graph.downstreams_of(graph.source))
    if len(branches) < 1:
        raise CalibrationError(f"run {run.pk}: its source feeds no node")
    # One row per chunk: a chunk the balancer migrated has its row at the light branch
    # (its tag still names the branch it was meant for), and a keyed stage's copies of
    # a chunk share its file.
    first: dict[int, tuple[str, int, int]] = {}
    for chunk, tag, size, end in (
        Segment.objects.filter(run=run, upstream=graph.source, marker=False)
        .order_by("chunk")
        .values_list("chunk", "tag", "bytes", F("origin_offset") + F("origin_length"))
    ):
        first.setdefault(chunk, (tag, size, end))
    chunks = list(first.values())
    if not chunks:
        raise CalibrationError(f"run {run.pk} emitted no data")
    if entry_times and max(end for *_, end in chunks) > len(entry_times):
        raise CalibrationError(f"run {run.pk} read entries past the {len(entry_times)} given")
    index = {b: i for i, b in enumerate(branches)}
    tags = np.array([index[tagged_target(tag, branches)] for tag, *_ in chunks], dtype=np.int64)
    mean_bytes = float(np.mean([size for _, size, _ in chunks]))
    arrivals = np.array([entry_times[end - 1] if entry_times else 0.0 for *_, end in chunks])
    return Workload(branches, mean_bytes, np.maximum.accumulate(arrivals), tags)


def runtime_of(run: Run, *, workers: int = 1) -> RuntimeModel:
    """The runtime fitted to the run's batches: ``workers`` Spark workers shared by its
    operators, or, for a run in ``placement = placed``, each operator on the worker it
    was placed on at its own cost (:func:`placed_costs`)."""
    if run.status != Run.Status.COMPLETED:
        raise CalibrationError(f"run {run.pk} is {run.status}; only a completed run is measured")
    operated = batches(run)
    if not operated:
        raise CalibrationError(f"run {run.pk} has no operator batch to fit")
    runtime = fit_runtime(
        [operated],
        sink_runs=[batches(run, "sink")],
        workers=workers,
        max_batch_bytes=float(settings.BPCONSOLE_BATCH_MB) * MB,
        reductions=operator_reductions(run),
    )
    if run.policy.get("placement") != "placed":
        return runtime
    return replace(runtime, placed=placed_costs(run))


def placed_costs(run: Run) -> dict[str, NodeCost]:
    """Each operator's batch cost on the Spark worker it was placed on (its instance's
    worker when the run ended), fitted from its own batches
    (:func:`~balancer.sim.calibration.fit_node_cost`). Raises CalibrationError naming
    an operator that ran no batch: its worker's speed is its own, so it is not guessed
    from the others'."""
    graph = RunGraph.of(cast("PipelineDocument", run.topology))
    operators = [n for n in graph.nodes if graph.node(n)["kind"] == "operator"]
    workers = dict(Instance.objects.filter(run=run).values_list("name", "worker"))
    own = node_batches(run)
    costs = {}
    for node in operators:
        try:
            costs[node] = fit_node_cost(own.get(node, []), worker=workers.get(node, ""))
        except ValueError as why:
            raise CalibrationError(
                f"run {run.pk} was placed, and {node}'s own cost cannot be fitted: {why}"
            ) from None
    return costs


def replay_of(run: Run, *, workers: int = 1) -> Replay:
    """The run, replayable: its input on its fitted runtime (:func:`runtime_of`)."""
    runtime = runtime_of(run, workers=workers)
    return Replay(cast("PipelineDocument", run.topology), runtime, recorded_workload(run))
