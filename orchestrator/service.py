"""The small interface the console uses to reach the orchestrator.

The console (webapp/) never imports balancer/ or sparkjobs/ directly: what it needs of
them (the policy declaration, the operator catalog) comes through here, as do
starting, stopping, hot-migrating, rescaling and snapshotting runs and the services'
health checks. It is the console's one door: webapp/ imports nothing else of the
orchestrator but ``orchestrator.models`` (tests/orchestrator/test_boundaries.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypedDict

from balancer.document import (
    DEFAULT_BANDWIDTH_MBPS,
    DEFAULT_BUFFER_MB,
    DEFAULT_MAX_RATE_MBPS,
    EdgeDocument,
    NodeDocument,
    PipelineDocument,
    emulated,
)
from balancer.policy import (
    PARAMETERS,
    PARAMETERS_BY_NAME,
    Param,
    Policy,
    PolicyError,
)
from balancer.policy import validate as validate_policy
from orchestrator.celery import app as celery_app  # noqa: F401 - see the note below
from orchestrator.lab.labs import LabQuotaExceeded, LabRefused, create_lab, lab_json
from orchestrator.lab.simulation import arm_policy
from orchestrator.ledger.results import summary as run_summary
from orchestrator.ledger.sink_owners import owner_problem
from orchestrator.pipeline.generator import GeneratorError
from orchestrator.pipeline.graph import pipeline_sink, pipeline_windows, window_problems
from orchestrator.pipeline.inputs import InputError, confined_files
from orchestrator.pipeline.sample import Sample, sample_schema
from orchestrator.pipeline.schemas import SchemaProblem
from orchestrator.pipeline.schemas import derive as derive_schemas
from orchestrator.run.lifecycle import (
    RunError,
    RunQuotaExceeded,
    create_run,
    live_workers,
    reference_columns,
    request_adjustment,
    request_migration,
    set_status,
    snapshot,
)
from orchestrator.run.wakeups import wait_until_ended
from orchestrator.services.health import run_checks
from orchestrator.source.replay import ReplayError, replay_inputs, write_ingested
from orchestrator.source.spec import (
    LandingSpec,
    StreamSpec,
    UnboundedSpec,
    check_landing,
    check_stream,
)
from orchestrator.tasks import start_lab, start_run
from orchestrator.worker.plain_job import BatchJobError, batch_summary
from sparkjobs.catalog import (
    DEFAULT_OPERATOR,
    OPERATORS,
    OperatorSpec,
    keyed,
    operator_name,
    stored_params,
    validate_params,
)

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from orchestrator.models import Event, PolicyLab, Run
    from orchestrator.run.generation import Preparing
    from orchestrator.run.snapshot import SourceView

# Importing ``celery_app`` makes the project's Celery app current in every process that
# uses this interface (the ASGI server included); without it start_run's task would go to
# Celery's default app and broker (amqp://localhost) and starting a run from the console
# would fail.


def sink_owner_problem(doc: PipelineDocument) -> str:
    """Why the pipeline ``doc`` may not write the table or folder its sink names (another
    pipeline owns it), or ""."""
    return owner_problem(doc["name"], pipeline_sink(doc))


def reference_problems(doc: PipelineDocument) -> list[SchemaProblem]:
    """Each problem of the joins of a valid document ``doc`` against their reference
    tables as they are now: a table that cannot be read, a column it lacks, a join field
    of another type than the record's."""
    tables = reference_columns(doc["name"])
    return derive_schemas(doc["nodes"], doc.get("edges", []), tables=tables).problems


def workers_alive(timeout_s: float = 2.0) -> bool:
    """Does at least one Celery worker answer a ping?"""
    from orchestrator.celery import app

    return bool(app.control.ping(timeout=timeout_s))


__all__ = [
    "DEFAULT_BANDWIDTH_MBPS",
    "DEFAULT_BUFFER_MB",
    "DEFAULT_MAX_RATE_MBPS",
    "DEFAULT_OPERATOR",
    "OPERATORS",
    "PARAMETERS",
    "PARAMETERS_BY_NAME",
    "BatchJobError",
    "EdgeDocument",
    "GeneratorError",
    "InputError",
    "LabQuotaExceeded",
    "LabRefused",
    "LandingSpec",
    "NodeDocument",
    "OperatorSpec",
    "Param",
    "PipelineDocument",
    "Policy",
    "PolicyError",
    "ReplayError",
    "RunError",
    "RunQuotaExceeded",
    "Sample",
    "StreamSpec",
    "UnboundedSpec",
    "arm_policy",
    "batch_summary",
    "check_landing",
    "check_stream",
    "confined_files",
    "create_lab",
    "create_run",
    "derive_schemas",
    "emulated",
    "keyed",
    "lab_json",
    "live_workers",
    "operator_name",
    "reference_columns",
    "reference_problems",
    "replay_inputs",
    "request_adjustment",
    "request_migration",
    "run_checks",
    "run_summary",
    "sample_schema",
    "set_status",
    "sink_owner_problem",
    "snapshot",
    "start_lab",
    "start_run",
    "stored_params",
    "validate_params",
    "validate_policy",
    "wait_until_ended",
    "window_problems",
    "workers_alive",
    "write_ingested",
]


# -- Read helpers for the console ---------------------------------------------------------
# The console lists runs and events through these, so the queries it depends on are
# written down next to the rest of its interface (additive: nothing above uses them).


def runs_of(*, pipeline_id: int | None = None, status: str | None = None) -> QuerySet[Run]:
    """Runs, newest first (a QuerySet of ``orchestrator.models.Run``)."""
    from orchestrator.models import Run

    queryset = Run.objects.select_related("created_by").order_by("-created_at", "-id")
    if pipeline_id is not None:
        queryset = queryset.filter(pipeline_id=pipeline_id)
    if status is not None:
        queryset = queryset.filter(status=status)
    return queryset


def get_run(run_id: int) -> Run:
    """The run ``run_id``; raises :class:`RunNotFound` when there is none."""
    from orchestrator.models import Run

    try:
        return Run.objects.select_related("created_by").get(pk=run_id)
    except Run.DoesNotExist:
        raise RunNotFound(f"there is no run {run_id}") from None


class RunNotFound(LookupError):
    """No run has that id."""


def labs_of(pipeline_id: int, limit: int = 10) -> list[PolicyLab]:
    """The pipeline's latest policy labs, newest first."""
    from orchestrator.models import PolicyLab

    return list(PolicyLab.objects.filter(pipeline_id=pipeline_id).order_by("-pk")[:limit])


def get_lab(lab_id: int) -> PolicyLab:
    """The lab ``lab_id``; raises :class:`LabNotFound` when there is none."""
    from orchestrator.models import PolicyLab

    try:
        return PolicyLab.objects.get(pk=lab_id)
    except PolicyLab.DoesNotExist:
        raise LabNotFound(f"there is no lab {lab_id}") from None


class LabNotFound(LookupError):
    """No lab has that id."""


def replayable_runs(pipeline_id: int, limit: int = 10) -> list[Run]:
    """The pipeline's latest completed runs over files or the generator: a lab may
    replay their recorded input."""
    from orchestrator.lab.replays import is_replayable

    done = runs_of(pipeline_id=pipeline_id, status="completed")[: limit * 3]
    return [run for run in done if is_replayable(run)][:limit]


class Prediction(TypedDict):
    """What the lab predicted for a run started from it, drawn under its live curve."""

    lab: int
    arm: str
    label: str
    bound_s: float
    completion_s: float | None
    curve: list[tuple[float, float]]


def prediction_of(run: Run) -> Prediction | None:
    lab = run.lab
    if lab is None or not lab.result:
        return None
    arm = next((a for a in lab.result["arms"] if a["name"] == run.lab_arm), None)
    if arm is None:
        return None
    return {
        "lab": lab.pk,
        "arm": arm["name"],
        "label": arm["label"],
        "bound_s": lab.result["bound_s"],
        "completion_s": arm["completion_s"],
        "curve": arm["curve"],
    }


def latest_runs(pipeline_ids: list[int]) -> dict[int, Run]:
    """The most recent run of each pipeline that has one."""
    from orchestrator.models import Run

    latest: dict[int, Run] = {}
    rows = Run.objects.filter(pipeline_id__in=pipeline_ids).order_by("-created_at", "-id")
    for run in rows.only(
        "id", "pipeline_id", "status", "created_at", "started_at", "finished_at", "error"
    ):
        if run.pipeline_id is not None:  # never None after pipeline_id__in; it is nullable
            latest.setdefault(run.pipeline_id, run)
    return latest


def events_of(
    *,
    run_id: int | None = None,
    since_id: int | None = None,
    node: str | None = None,
    kind: str | None = None,
    by_users: bool = False,
    limit: int = 200,
) -> list[Event]:
    """Events, newest first (``orchestrator.models.Event``), at most ``limit``."""
    from orchestrator.models import Event

    queryset = Event.objects.select_related("user").order_by("-time", "-id")
    if run_id is not None:
        queryset = queryset.filter(run_id=run_id)
    if since_id is not None:
        queryset = queryset.filter(id__gt=since_id)
    if node:
        queryset = queryset.filter(node=node)
    if kind:
        queryset = queryset.filter(kind=kind)
    if by_users:
        queryset = queryset.filter(actor=Event.Actor.USER)
    return list(queryset[: max(1, min(limit, 1000))])


def completion_history(run_id: int, points: int = 400) -> list[tuple[float, float]]:
    """(seconds since the run started, completed fraction) after each merged chunk,
    thinned to about ``points`` points: the curve of the published Figures 7/8."""
    from orchestrator.models import MergedChunk, Run

    run = Run.objects.only("started_at", "input_spec").get(pk=run_id)
    total = int(run.input_spec.get("extent_total") or 0)
    if run.started_at is None or total <= 0:
        return []
    rows = list(
        MergedChunk.objects.filter(run_id=run_id)
        .order_by("merged_at", "id")
        .values_list("merged_at", "origin_length")
    )
    curve = [(0.0, 0.0)]
    done = 0
    every = max(1, len(rows) // max(1, points))
    for index, (merged_at, length) in enumerate(rows):
        done += int(length)
        if index % every == 0 or index == len(rows) - 1:
            seconds = max(0.0, (merged_at - run.started_at).total_seconds())
            curve.append((round(seconds, 3), round(done / total, 5)))
    return curve


# A text the user sent that names no node of the run is kept only this long, marked.
REFUSAL_MENTION_CHARS = 32
# Namespace of the advisory locks that serialise one user's refusals (pg_advisory_xact_lock).
_REFUSAL_LOCKS = 0x62707266


def record_refusal(
    *,
    run_id: int | None,
    action: str,
    user: Any,
    reason: str,
    data: dict[str, Any] | None = None,
) -> Any:
    """An action the console refused (a viewer pressing an operator's button), as an
    event with the user, so it shows in the run's timeline and the activity page.

    The event names a node only when it is a node of the run; any other text the user
    sent as a node is kept in ``data["unknown_node"]``, cut to a few characters. The
    same user's refusals of the same action on the same run, less than
    ``BPCONSOLE_REFUSAL_WINDOW_S`` apart, are one event: its ``data["count"]`` (absent:
    once) and ``data["last"]`` go up instead of new events being written, so a refused
    user cannot push the run's real events out of the live view.
    """
    import zlib
    from datetime import datetime, timedelta

    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from orchestrator.ledger.events import record_event
    from orchestrator.models import Event

    if not getattr(user, "is_authenticated", False):
        user = None
    node, details = _refusal_details(run_id, data or {})
    now = timezone.now()
    window = timedelta(seconds=settings.BPCONSOLE_REFUSAL_WINDOW_S)
    with transaction.atomic():
        # One writer at a time per (user, run, action): two refusals at the same moment
        # must not both find no recent event and both write one.
        key = zlib.crc32(f"{getattr(user, 'pk', None)}:{run_id}:{action}".encode())
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [_REFUSAL_LOCKS, key - (1 << 31)]
            )
        recent = (
            Event.objects.select_for_update()
            # run=, not run_id=: the same SQL (IS NULL for a refusal outside any run),
            # but django-stubs accept None only in the relation's own lookup.
            .filter(kind="action_refused", run=run_id, user=user, data__action=action)
            .order_by("-time", "-id")
            .first()
        )
        last = recent and (
            datetime.fromisoformat(recent.data["last"]) if "last" in recent.data else recent.time
        )
        if recent is not None and last and now - last < window:
            count = int(recent.data.get("count", 1)) + 1
            recent.data = {**recent.data, "count": count, "last": now.isoformat()}
            recent.reason = f"{reason} ({count} attempts, the last at {now:%H:%M:%S} UTC)"
            recent.save(update_fields=["data", "reason"])
            return recent
        return record_event(
            run_id,
            "action_refused",
            reason,
            node=node,
            user=user,
            data={"action": action, **details},
        )


def _refusal_details(run_id: int | None, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The node a refusal names (a node of the run, or "") and its data to keep."""
    from orchestrator.models import Run

    details = {key: str(value)[:100] for key, value in data.items() if key != "node"}
    sent = data.get("node")
    if sent in (None, ""):
        return "", details
    topology = (
        Run.objects.filter(pk=run_id).values_list("topology", flat=True).first()
        if run_id is not None
        else None
    )
    nodes = {n.get("name") for n in (topology or {}).get("nodes", []) if isinstance(n, dict)}
    if isinstance(sent, str) and sent in nodes:
        return sent, {"node": sent, **details}
    text = str(sent)
    if len(text) > REFUSAL_MENTION_CHARS:
        text = text[:REFUSAL_MENTION_CHARS] + "…"
    return "", {"unknown_node": text, **details}


__all__ += [
    "RunNotFound",
    "completion_history",
    "events_of",
    "get_run",
    "latest_runs",
    "record_refusal",
    "runs_of",
]


def live_group(run_id: int) -> str:
    """The Channels group a run's driver publishes its snapshots to."""
    from orchestrator.run.publisher import run_group

    return run_group(run_id)


__all__ += ["live_group"]


def input_preparing(run: Run) -> Preparing | None:
    """How far the writing of a run's generated input is ({"written", "total",
    "fraction"}), or None once the input exists or for an input of files."""
    from orchestrator.run.generation import preparing

    return preparing(run.input_spec or {})


__all__ += ["input_preparing"]


def source_view(run: Run) -> SourceView:
    """What a run reads as its live snapshot shows it (kind, whether unbounded, what,
    and how far its results are exact), without the lag only its driver knows."""
    from orchestrator.run.snapshot import source_view as view

    return view(run, None)


__all__ += ["source_view"]


def run_results(run_id: int, *, limit: int = 100) -> dict[str, Any]:
    """The run's result so far: its keys with the most records, and where it is exact up
    to (every chunk before that point merged exactly once), for the run page and the API."""
    from orchestrator.ledger.results import result_columns, top_rows
    from orchestrator.ledger.window_view import windows_view
    from orchestrator.models import Run
    from orchestrator.run.snapshot import exact_up_to

    run = Run.objects.get(pk=run_id)
    limit = max(1, min(limit, 1000))
    keys, rows = top_rows(run, limit)
    spec = pipeline_windows(run.topology)
    return {
        "run": run.pk,
        "status": run.status,
        "exact_up_to": exact_up_to(run),
        "final": not run.is_active,
        "keys": keys,
        "columns": result_columns(run),
        "rows": rows,
        "windows": None if spec is None else windows_view(run, spec, sample=limit > 0),
    }


__all__ += ["run_results"]


def results_csv(run_id: int) -> Iterator[str]:
    """The run's whole result as CSV lines, its columns by their names."""
    from orchestrator.ledger.results import csv_lines
    from orchestrator.models import Run

    return csv_lines(Run.objects.get(pk=run_id))


__all__ += ["results_csv"]
