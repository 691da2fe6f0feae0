"""Nothing lost, nothing twice: a run equals the plain Spark batch job, even under
migration, malformed records, and crashes of a Spark worker and of the driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.ledger.results import summary
from orchestrator.models import Event, Segment
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import (
    completes_like_the_batch_job,
    kill_a_batch_and_the_driver,
    policy,
    skewed_reference,
    start,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

GENERATOR = "seed=11,volume_mb=4,dominance=0.85,skew_mean_s=1000,malformed_every=997"


def test_skewed_run_with_migration_equals_the_batch_job(workers) -> None:
    # Given a skewed input that overloads a slow branch
    doc = skewed_reference()
    run = start(doc, policy(), generator=GENERATOR)
    # When the run finishes
    run = wait_until_done(run)
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    # Then it is exact, data was migrated, and every aggregate equals the batch job's
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["migrated_segments"] > 0
    assert Event.objects.filter(run=run, kind="start_migration").exists()
    assert result["malformed_records"] == expected["malformed_records"] > 0
    assert result["rows"] == expected["rows"]
    assert len(result["rows"]) == 48  # 16 keys per branch, all seen
    migrated = Segment.objects.filter(run=run).exclude(migrated_from="").first()
    assert migrated is not None and migrated.node != migrated.migrated_from


def test_killed_spark_worker_and_killed_driver_still_give_the_exact_result(
    workers, services
) -> None:
    doc = skewed_reference()
    run = start(doc, policy(), generator=GENERATOR.replace("seed=11", "seed=12"))
    # When a Spark worker process is killed while it holds a batch, and the worker
    # process running the run's driver too
    victim = kill_a_batch_and_the_driver(run, workers, services)
    # Then another worker takes the run over and it completes exactly
    completes_like_the_batch_job(run)
    drivers = Event.objects.filter(run=run, kind="driver").count()
    assert drivers >= 2, "a second driver took over"
    assert Segment.objects.filter(run=run, attempts__gt=1).exists(), "a batch was re-run"
    run.refresh_from_db()
    assert run.epoch >= 2
    # The killed control worker comes back for the tests that follow.
    workers.start(victim)
    workers.wait_ready([victim])


def test_a_file_of_garbage_is_quarantined_not_fatal(workers, tmp_path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    # (one record among the garbage: a file whose every record lacks a field the
    # pipeline reads is refused when the run is created, tests/orchestrator/run/
    # test_fields_read.py)
    garbage.write_text(
        "".join(f"not json {i}\n" for i in range(500))
        + '{"key": 1}\n'
        + '{"key": "k", "value": 2, "user": "u"}\n'
    )
    doc = skewed_reference()
    run = wait_until_done(start(doc, policy(), input_path=str(garbage)))
    result = summary(run)
    assert result["status"] == "completed"
    assert result["coverage"] == "exact"
    assert result["malformed_records"] == 501  # {"key": 1} lacks value and user
    assert [(r["key"], r["count"]) for r in result["rows"]] == [("k", 1)]
    quarantine = Path(workers.env["BPCONSOLE_DATA_DIR"]) / "runs" / str(run.pk) / "quarantine"
    quarantined = sum(len(p.read_text().splitlines()) for p in quarantine.glob("*.jsonl"))
    assert quarantined == 501


def test_proportional_migration_plans_from_the_source_mix_and_stays_exact(workers) -> None:
    # Given the live source's read-ahead (per-branch head and arrival rates)
    doc = skewed_reference()
    run = start(doc, policy(migration="proportional"), generator=GENERATOR)
    run = wait_until_done(run)
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    # Then the predicted excess of the slow branches moved, spread by spare capacity
    started = Event.objects.filter(run=run, kind="start_migration").first()
    assert started is not None
    assert "predicted excess" in started.reason
    assert result["migrated_segments"] > 0
    assert result["coverage"] == "exact"
    assert result["rows"] == expected["rows"]
