"""The small interface the console uses to reach the orchestrator.

The console (webapp/) never imports balancer/ or sparkjobs/ directly: what it needs of
them (the policy declaration, the operator catalog) comes through here, as do
starting, stopping, hot-migrating, rescaling and snapshotting runs.
"""

from __future__ import annotations

from typing import Any

from balancer.policy import (
    PARAMETERS,
    PARAMETERS_BY_NAME,
    Param,
    Policy,
    PolicyError,
)
from balancer.policy import validate as validate_policy
from orchestrator.batchjob import batch_summary
from orchestrator.celery import app as celery_app  # noqa: F401 - see the note below
from orchestrator.generator import GeneratorError
from orchestrator.results import summary as run_summary
from orchestrator.runs import (
    RunError,
    create_run,
    live_workers,
    request_adjustment,
    request_migration,
    set_status,
    snapshot,
    start_run,
)
from orchestrator.source import InputError, confined_files
from sparkjobs.catalog import OPERATORS, OperatorSpec, validate_params

# Importing ``celery_app`` makes the project's Celery app current in every process that
# uses this interface (the ASGI server included); without it start_run's task would go to
# Celery's default app and broker (amqp://localhost) and starting a run from the console
# would fail.


def workers_alive(timeout_s: float = 2.0) -> bool:
    """Does at least one Celery worker answer a ping?"""
    from orchestrator.celery import app

    return bool(app.control.ping(timeout=timeout_s))


__all__ = [
    "OPERATORS",
    "PARAMETERS",
    "PARAMETERS_BY_NAME",
    "GeneratorError",
    "InputError",
    "OperatorSpec",
    "Param",
    "Policy",
    "PolicyError",
    "RunError",
    "batch_summary",
    "confined_files",
    "create_run",
    "live_workers",
    "request_adjustment",
    "request_migration",
    "run_summary",
    "set_status",
    "snapshot",
    "start_run",
    "validate_params",
    "validate_policy",
    "workers_alive",
]


# -- Read helpers for the console ---------------------------------------------------------
# The console lists runs and events through these, so the queries it depends on are
# written down next to the rest of its interface (additive: nothing above uses them).


def runs_of(*, pipeline_id: int | None = None, status: str | None = None) -> Any:
    """Runs, newest first (a QuerySet of ``orchestrator.models.Run``)."""
    from orchestrator.models import Run

    queryset = Run.objects.select_related("created_by").order_by("-created_at", "-id")
    if pipeline_id is not None:
        queryset = queryset.filter(pipeline_id=pipeline_id)
    if status is not None:
        queryset = queryset.filter(status=status)
    return queryset


def get_run(run_id: int) -> Any:
    """The run ``run_id``; raises :class:`RunNotFound` when there is none."""
    from orchestrator.models import Run

    try:
        return Run.objects.select_related("created_by").get(pk=run_id)
    except Run.DoesNotExist:
        raise RunNotFound(f"there is no run {run_id}") from None


class RunNotFound(LookupError):
    """No run has that id."""


def latest_runs(pipeline_ids: list[int]) -> dict[int, Any]:
    """The most recent run of each pipeline that has one."""
    from orchestrator.models import Run

    latest: dict[int, Any] = {}
    rows = Run.objects.filter(pipeline_id__in=pipeline_ids).order_by("-created_at", "-id")
    for run in rows.only("id", "pipeline_id", "status", "created_at", "started_at",
                         "finished_at", "error"):  # fmt: skip
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
) -> list[Any]:
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


def record_refusal(
    *,
    run_id: int | None,
    action: str,
    user: Any,
    reason: str,
    data: dict[str, Any] | None = None,
) -> Any:
    """An action the console refused (a viewer pressing an operator's button), as an
    event with the user, so it shows in the run's timeline and the activity page."""
    from orchestrator.events import record_event

    return record_event(
        run_id,
        "action_refused",
        reason,
        node=str((data or {}).get("node", "")),
        user=user if getattr(user, "is_authenticated", False) else None,
        data={"action": action, **(data or {})},
    )


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
    from orchestrator.publisher import run_group

    return run_group(run_id)


__all__ += ["live_group"]


def input_preparing(run: Any) -> dict[str, Any] | None:
    """How far the writing of a run's generated input is ({"written", "total",
    "fraction"}), or None once the input exists or for an input of files."""
    from orchestrator.generation import preparing

    return preparing(run.input_spec or {})


__all__ += ["input_preparing"]
