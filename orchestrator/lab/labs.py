"""Asking for a lab, and what a lab shows.

A lab is refused, with the reason and nothing created, when its workload cannot be
simulated: a generator spec out of its bounds, a run of another pipeline, one not
completed or over a continuous source, one whose batches cannot be fitted; when the
pipeline already has ``ACTIVE_PER_PIPELINE`` labs waiting or running; or when the user
already has as many waiting or running as their quota allows (:class:`LabQuotaExceeded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from django.conf import settings
from django.db import connection, transaction

from balancer.document import PipelineDocument
from balancer.sim.lab import ArmJson, LabJson
from balancer.units import MB
from orchestrator.lab.replays import calibration_of, is_replayable
from orchestrator.ledger.calibration import CalibrationError, runtime_of
from orchestrator.models import PolicyLab, Run
from orchestrator.pipeline.generator import GeneratorError, GeneratorSpec

ACTIVE_PER_PIPELINE = 3  # a lab holds a CPU for seconds: a queue of them is refused
KEPT_PER_PIPELINE = 50
_LOCK_CLASS = 0x1AB  # advisory locks' first key: this module's, the pipeline's id second
_USER_LOCK_CLASS = 0x1AC  # the same for a user's labs, the user's id second


class LabRefused(ValueError):
    """The lab cannot be created as asked; nothing was created."""


class LabQuotaExceeded(LabRefused):
    """The user has as many labs waiting or running as their quota allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"you have {limit} labs waiting or running, the most an operator may have at "
            "once (the operator quota an admin sets); wait for one to finish"
        )
        self.limit = limit


class Workload(TypedDict, total=False):
    kind: str  # "generator" or "run"
    generator: dict[str, float]
    run: int


def create_lab(
    *,
    pipeline_id: int,
    topology: PipelineDocument,
    policy: Mapping[str, object],
    generator: str | None = None,
    run_id: int | None = None,
    user: Any = None,
    max_active: int | None = None,
) -> PolicyLab:
    """A pending lab over a generator spec or a completed run of the pipeline. The
    caller hands it to a worker (``orchestrator.tasks.start_lab``). ``max_active``: how
    many labs waiting or running ``user`` may have (None: no quota)."""
    if (generator is None) == (run_id is None):
        raise LabRefused("give exactly one workload: a generator spec or a completed run")
    calibrated_from: Run | None = None
    runtime: dict[str, Any] | None = None
    if generator is not None:
        try:
            spec = GeneratorSpec.parse(generator)
        except GeneratorError as exc:
            raise LabRefused(str(exc)) from None
        workload: Workload = {"kind": "generator", "generator": spec.to_json()}
        found = calibration_of(pipeline_id, spec.volume_mb * MB)
        if found is not None:
            calibrated_from, fitted = found
            runtime = fitted.to_json()
    elif run_id is not None:
        run = Run.objects.filter(pk=run_id, pipeline_id=pipeline_id).first()
        if run is None:
            raise LabRefused(f"this pipeline has no run {run_id}")
        if not is_replayable(run):
            raise LabRefused(
                f"run {run.pk} is {run.status} over "
                f"{'a continuous source' if run.input_spec.get('kind') else 'its input'}; "
                "a lab replays a completed run over files or the generator"
            )
        try:
            runtime = runtime_of(run, workers=settings.BPCONSOLE_SPARK_WORKERS).to_json()
        except CalibrationError as exc:
            raise LabRefused(str(exc)) from None
        workload = {"kind": "run", "run": run.pk}
        topology = cast("PipelineDocument", run.topology)
        calibrated_from = run
    with transaction.atomic(), connection.cursor() as cursor:
        # Counted under a lock on the pipeline: two requests at once cannot both pass.
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, pipeline_id % 2**31])
        active = PolicyLab.objects.filter(pipeline_id=pipeline_id, status__in=PolicyLab.ACTIVE)
        if active.count() >= ACTIVE_PER_PIPELINE:
            raise LabRefused(
                f"this pipeline has {ACTIVE_PER_PIPELINE} labs waiting or running; "
                "wait for one to finish"
            )
        if max_active is not None and getattr(user, "is_authenticated", False):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_USER_LOCK_CLASS, user.pk])
            mine = PolicyLab.objects.filter(created_by=user, status__in=PolicyLab.ACTIVE)
            if mine.count() >= max_active:
                raise LabQuotaExceeded(max_active)
        lab = PolicyLab.objects.create(
            pipeline_id=pipeline_id,
            pipeline_name=topology["name"],
            topology=dict(topology),
            policy=dict(policy),
            workload=dict(workload),
            calibrated_from=calibrated_from,
            runtime=runtime,
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        # The oldest finished labs go: however long the console runs, a pipeline's
        # labs take a bounded room (a run started from a deleted lab loses its dashes).
        kept = PolicyLab.objects.filter(pipeline_id=pipeline_id).order_by("-pk")
        old = kept.values_list("pk", flat=True)[KEPT_PER_PIPELINE:]
        PolicyLab.objects.filter(pk__in=list(old)).exclude(status__in=PolicyLab.ACTIVE).delete()
        return lab


class LabRun(TypedDict):
    run: int
    arm: str
    status: str


class LabView(TypedDict):
    id: int
    pipeline: str
    status: str
    workload: str
    calibration: str
    runtime: dict[str, Any] | None
    created_at: str
    finished_at: str | None
    error: str
    result: LabJson | None
    best: ArmJson | None  # the arm predicted to finish first
    runs: list[LabRun]


def describe_workload(workload: Mapping[str, Any]) -> str:
    if workload["kind"] == "run":
        return f"the recorded input of run {workload['run']}"
    g = workload["generator"]
    return (
        f"generated: seed {g['seed']:g}, {g['volume_mb']:g} MB, dominance {g['dominance']:g}, "
        f"skew episodes of {g['skew_mean_s']:g} s"
    )


def describe_calibration(lab: PolicyLab) -> str:
    if lab.runtime is None:
        return (
            "not calibrated: the pipeline has no completed run yet, so only the links "
            "are simulated (no batch costs, data not reduced)"
        )
    r = lab.runtime
    source = lab.calibrated_from
    size = f" ({source.input_bytes / MB:.0f} MB)" if source and source.input_bytes else ""
    placed = r.get("placed") or {}
    if placed:
        return f"calibrated from run {lab.calibrated_from_id}{size}, placed: " + "; ".join(
            f"{node} on {c['worker'] or 'its own worker'}, {_batch_cost(c)}"
            for node, c in placed.items()
        )
    return (
        f"calibrated from run {lab.calibrated_from_id}{size}: {r['workers']} Spark worker(s), "
        + _batch_cost(r)
    )


def _batch_cost(cost: Mapping[str, Any]) -> str:
    rate = cost.get("batch_mb_per_s")
    return f"a batch costs {cost['batch_fixed_s']:.2f} s" + (
        f" + its MB at {rate:.3g} MB/s" if rate else ""
    )


def lab_json(lab: PolicyLab) -> LabView:
    result = cast("LabJson | None", lab.result)
    finished = [a for a in result["arms"] if a["completion_s"] is not None] if result else []
    return {
        "id": lab.pk,
        "pipeline": lab.pipeline_name,
        "status": lab.status,
        "workload": describe_workload(lab.workload),
        "calibration": describe_calibration(lab),
        "runtime": lab.runtime,
        "created_at": lab.created_at.isoformat(),
        "finished_at": lab.finished_at.isoformat() if lab.finished_at else None,
        "error": lab.error,
        "result": result,
        "best": min(finished, key=lambda a: a["completion_s"] or 0.0) if finished else None,
        "runs": [
            {"run": pk, "arm": arm, "status": status}
            for pk, arm, status in lab.runs.order_by("pk").values_list("pk", "lab_arm", "status")
        ],
    }
