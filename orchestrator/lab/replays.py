"""What a lab simulates: the workload an operator chose, on the runtime the pipeline
was measured to have.

A generator spec gives the packets the run's driver would write, each about one source
segment tagged with the branch its keys route to, all there at the start (as a file's
chunks are). A completed run gives its own input, chunk by chunk, and its own runtime.
The runtime of a generated workload is fitted to the one of the pipeline's latest
completed runs closest to it in size; with none, the lab simulates links only, and
says so.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import numpy as np
from django.conf import settings

from balancer.document import PipelineDocument
from balancer.sim.calibration import RuntimeModel
from balancer.sim.replay import Replay
from balancer.sim.workload import Workload
from orchestrator.ledger.calibration import CalibrationError, replay_of, runtime_of
from orchestrator.models import PolicyLab, Run
from orchestrator.pipeline.generator import GeneratorSpec, generated_workload
from orchestrator.pipeline.graph import downstreams_of

# How many of the pipeline's latest completed runs a generated workload's calibration
# is chosen from: the one closest to it in size (a small run's few batches, the first of
# them on a cold worker, fit a slower runtime than a large one has: docs/benchmarks.md,
# "The policy lab's predictions").
CALIBRATION_CANDIDATES = 10


def is_replayable(run: Run) -> bool:
    """A completed run over files or the generator: its input is whole in its ledger and
    can be read again by a live run started from the lab."""
    return run.status == Run.Status.COMPLETED and (
        bool(run.input_spec.get("paths")) or bool(run.input_spec.get("generator"))
    )


def calibration_of(pipeline_id: int | None, volume_bytes: float) -> tuple[Run, RuntimeModel] | None:
    """The runtime fitted to the one of the pipeline's latest completed runs whose input
    is closest to ``volume_bytes`` in ratio (the latest among equals) and that ran
    batches to fit."""
    if pipeline_id is None:
        return None
    latest = list(
        Run.objects.filter(pipeline_id=pipeline_id, status=Run.Status.COMPLETED).order_by(
            "-finished_at"
        )[:CALIBRATION_CANDIDATES]
    )
    by_size = sorted(latest, key=lambda run: _size_ratio(run.input_bytes, volume_bytes))
    for run in by_size:
        try:
            return run, runtime_of(run, workers=settings.BPCONSOLE_SPARK_WORKERS)
        except CalibrationError:
            continue
    return None


def _size_ratio(size: float, volume: float) -> float:
    """How many times larger the larger of the two is (an empty input: infinitely)."""
    if size <= 0 or volume <= 0:
        return math.inf
    return max(size, volume) / min(size, volume)


def lab_replay(lab: PolicyLab) -> Replay:
    """The lab's replay; raises CalibrationError (a ValueError) naming what is wrong."""
    document = cast("PipelineDocument", lab.topology)
    if lab.workload["kind"] == "run":
        run = Run.objects.filter(pk=lab.workload["run"]).first()
        if run is None:
            raise CalibrationError(f"run {lab.workload['run']} is gone")
        return replay_of(run, workers=settings.BPCONSOLE_SPARK_WORKERS)
    spec = GeneratorSpec.parse(lab.workload["generator"])
    source = next(n for n in document["nodes"] if n["kind"] == "source")
    segment_mb = float((source.get("params") or {}).get("segment_mb", 1.0))
    packets = generated_workload(spec, downstreams_of(document, source["name"]), segment_mb)
    # A generated input is one file: every chunk is there when the run starts.
    workload = Workload(
        packets.tags, packets.packet_bytes, np.zeros(packets.packets), packets.tag_index
    )
    return Replay(document, runtime_for(document, lab.runtime), workload)


def runtime_for(document: PipelineDocument, fitted: dict[str, object] | None) -> RuntimeModel:
    """The fitted runtime with the reductions and placed costs of the document's
    operators only (the pipeline may have changed since the run it was fitted to: an
    operator it did not run takes the shared workers' cost); links only without one."""
    if fitted is None:
        return RuntimeModel()
    runtime = RuntimeModel.from_json(fitted)
    operators = {n["name"] for n in document["nodes"] if n["kind"] == "operator"}
    kept = {node: r for node, r in runtime.reductions.items() if node in operators}
    placed = {node: c for node, c in runtime.placed.items() if node in operators}
    return replace(runtime, reductions=kept, placed=placed)
