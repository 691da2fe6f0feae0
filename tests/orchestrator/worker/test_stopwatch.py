"""Stop means stopped: a batch's Spark job is cancelled as soon as its run stops or
fails, not when the batch would have finished (real PostgreSQL and Spark)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Run, Segment
from orchestrator.worker.batch import process_batch
from orchestrator.worker.stopwatch import StopWatch, cancel_group, job_group
from tests.orchestrator.runs import pending_run, queue_segments, records_file

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def long_job(spark: Any, group: str, outcome: dict[str, Any]) -> None:
    """A Spark job of minutes on two cores, in the run's job group, as a batch runs it."""
    spark.sparkContext.setJobGroup(group, "a long batch", interruptOnCancel=True)
    began = time.monotonic()
    try:
        spark.range(0, 10**12, numPartitions=4).where("id % 7 = 3").count()
        outcome["result"] = "finished"
    except Exception as error:  # noqa: BLE001 - the cancellation is the answer
        outcome["result"] = f"{type(error).__name__}: {error}"
    outcome["seconds"] = time.monotonic() - began


@pytest.mark.parametrize("status", ["cancelled", "failed"])
def test_a_run_that_stops_cancels_its_spark_job_at_once(spark: Any, status: str) -> None:
    # Given a running run whose batch is in a long Spark job
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(status="running")
    group = job_group(run.pk)
    outcome: dict[str, Any] = {}
    with StopWatch(run.pk, lambda: spark.sparkContext.cancelJobGroup(group)):
        job = threading.Thread(target=long_job, args=(spark, group, outcome))
        job.start()
        time.sleep(3)
        assert job.is_alive()  # it is really running
        # When the run is stopped (by an operator) or failed (by another batch)
        stopped_at = time.monotonic()
        Run.objects.filter(pk=run.pk).update(status=status)
        job.join(30)
        # Then the job was cancelled within a couple of seconds
        assert not job.is_alive()
        assert time.monotonic() - stopped_at < 5
    assert "cancelled part of cancelled job group" in outcome["result"], outcome["result"][:500]


def test_a_running_run_keeps_its_job(spark: Any) -> None:
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(status="running")
    group = job_group(run.pk)
    cancelled: list[str] = []
    with StopWatch(run.pk, lambda: cancelled.append(group), poll_s=0.05):
        spark.sparkContext.setJobGroup(group, "a short batch", interruptOnCancel=True)
        assert spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"] == 499500
    assert cancelled == []


def test_a_batch_past_its_time_limit_has_its_job_cancelled(spark: Any) -> None:
    # Given a running run whose batch, limited to 2 s, is in a long Spark job
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(status="running")
    group = job_group(run.pk)
    outcome: dict[str, Any] = {}
    started = time.monotonic()
    with StopWatch(run.pk, cancel_group(spark, group), max_s=2) as watch:
        job = threading.Thread(target=long_job, args=(spark, group, outcome))
        job.start()
        job.join(30)
        # Then the job was cancelled soon after the limit, the run left running
        assert not job.is_alive()
        assert time.monotonic() - started < 8
    assert watch.expired
    assert Run.objects.get(pk=run.pk).status == "running"
    assert "cancelled" in outcome["result"], outcome["result"][:500]


def test_a_stop_while_a_batch_is_planned_cancels_the_job_it_plans(spark: Any) -> None:
    # Given a running run whose batch has not submitted its job yet (Spark is planning
    # its query, which no cancellation interrupts)
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(status="running")
    group = job_group(run.pk)
    fired = threading.Event()
    cancel = cancel_group(spark, group)

    def cancel_and_say() -> None:
        cancel()
        fired.set()

    outcome: dict[str, Any] = {}
    with StopWatch(run.pk, cancel_and_say):
        # When the run is stopped before the job exists
        Run.objects.filter(pk=run.pk).update(status="cancelled")
        assert fired.wait(10)
        # Then the job the planning ends in is cancelled as it is submitted
        job = threading.Thread(target=long_job, args=(spark, group, outcome))
        job.start()
        job.join(30)
        assert not job.is_alive()
    assert outcome["seconds"] < 5 and "cancelled" in outcome["result"], outcome


def test_a_batch_past_its_time_limit_fails_counted_and_says_so(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    # Given a batch whose time limit passes before its Spark jobs can end
    settings.DATA_DIR = tmp_path / "data"
    settings.BPCONSOLE_BATCH_MAX_S = 0.01
    run = pending_run("reference")
    # (80,000 records: seconds of Spark work, where the watch looks every 0.25 s)
    keys = [range(n * 20_000, (n + 1) * 20_000) for n in range(4)]
    paths = [records_file(tmp_path / f"in{n}.jsonl", k) for n, k in enumerate(keys)]
    ids = queue_segments(run, paths)
    # When a worker runs it
    report = process_batch(run.pk, "task1", None)
    # Then its jobs were cancelled, its failure says why and counts against its segments,
    # and the run goes on (the batch is retried)
    assert "ran past its time limit of 0 s (BPCONSOLE_BATCH_MAX_S)" in report.failure
    assert set(Segment.objects.filter(pk__in=ids).values_list("failures", flat=True)) == {1}
    assert Run.objects.get(pk=run.pk).status in Run.ACTIVE
    # and the worker thread's next jobs are not in the cancelled batch's group
    assert spark.range(10).count() == 10
