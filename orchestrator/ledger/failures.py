"""A batch whose operator failed: back to its pool for another try, or the run fails.

A failure is the operator's own (an expression Spark refuses at run time, a JVM that
died under the batch), never a lost worker: a batch whose worker vanished comes back
when its lease expires and counts nothing here. Every failure is an event; the one
that reaches the policy's ``max_batch_attempts`` (or a refusal, which no retry can
change) fails the run with the error, the node and the segment, and the worker's
watch (``orchestrator/worker/stopwatch.py``) then cancels the run's other Spark jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from orchestrator.ledger.events import record_event
from orchestrator.models import Run, Segment

MAX_ERROR_CHARS = 1000


@dataclass(frozen=True)
class Failure:
    """What became of a failed batch: ``run_failed`` when it ended the run."""

    attempt: int
    run_failed: bool


def describe(error: BaseException) -> str:
    """One readable line for an operator error: Spark's own message, not the JVM stack."""
    text = str(error).strip() or type(error).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # py4j puts "An error occurred while calling o123.x." before the Java exception.
    useful = [line for line in lines if not line.startswith("An error occurred while calling")]
    first = (useful or lines or [type(error).__name__])[0]
    return first if len(first) <= MAX_ERROR_CHARS else first[: MAX_ERROR_CHARS - 3] + "..."


def record_failure(
    run_id: int,
    node: str,
    owner: str,
    segments: Sequence[Segment],
    error: str,
    *,
    max_attempts: int,
    retryable: bool = True,
) -> Failure:
    """Count a failure on the batch's segments and release them, or fail the run.

    One transaction with the run row locked, so two workers failing at once fail the
    run once. Segments whose lease was lost meanwhile are another worker's now.
    """
    ids = [s.pk for s in segments]
    first = segments[0].pk if segments else ""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        Segment.objects.filter(pk__in=ids, state=Segment.State.CLAIMED, lease_owner=owner).update(
            state=Segment.State.QUEUED,
            lease_owner="",
            lease_expires=None,
            failures=F("failures") + 1,
            available_at=timezone.now(),
        )
        attempt = Segment.objects.filter(pk__in=ids).aggregate(worst=Max("failures"))["worst"] or 0
        data = {
            "segment": first,
            "segments": len(ids),
            "attempt": attempt,
            "max_attempts": max_attempts,
            "error": error,
        }
        if retryable and attempt < max_attempts:
            record_event(
                run_id,
                "batch_failed",
                f"{node}: a batch of {len(ids)} segment(s) from {first} failed "
                f"(attempt {attempt} of {max_attempts}); it will be tried again: {error}",
                node=node,
                data=data,
            )
            return Failure(attempt, run_failed=False)
        reason = (
            f"node {node}, segment {first}: {error}"
            if not retryable
            else f"node {node}, segment {first}: failed {attempt} times: {error}"
        )
        _fail(run, reason, node=node, data=data)
        return Failure(attempt, run_failed=True)


def fail_run(run_id: int, reason: str, *, node: str = "") -> None:
    """Fail an active run with ``reason`` (what the run page shows)."""
    with transaction.atomic():
        _fail(Run.objects.select_for_update().get(pk=run_id), reason, node=node, data={})


def _fail(run: Run, reason: str, *, node: str, data: dict[str, object]) -> None:
    if run.is_active:
        run.status = Run.Status.FAILED
        run.error = reason
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
        record_event(run.pk, "run_failed", f"run failed: {reason}", node=node, data=data)
