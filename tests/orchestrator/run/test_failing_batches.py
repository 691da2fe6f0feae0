"""Poison batches fail the run: an operator error is retried up to the policy's
``max_batch_attempts`` and then fails the run with the error, node and segment; an
expression refused on the worker fails it at once; a dead Spark JVM is replaced; a batch
that exhausts its JVM ends it at once and fails, saying so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.models import Event, Run
from tests.conftest import child_env
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

GENERATOR = "seed=5,volume_mb=0.5,dominance=0.5"


def filtering(condition: str) -> dict:
    """The reference pipeline with its branches filtering before they aggregate."""
    doc = skewed_reference(slow_mbps=0.0)
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
    first = next(n for n in doc["nodes"] if n["name"] == "task1")
    first.update(operator="filter", stage="f", params={"condition": condition})
    return doc


def test_a_batch_that_keeps_failing_fails_the_run_with_its_error(workers) -> None:
    # Given a condition both checks admit but that fails at run time (ANSI cast of "key-1")
    doc = filtering("CAST(key AS INT) > 0")
    # When the run meets it
    run = wait_until_done(start(doc, policy(max_batch_attempts=2), generator=GENERATOR), 180)
    # Then the run failed, saying which node, which segment and what Spark said
    assert run.status == "failed"
    assert run.error.startswith("node task1, segment ")
    assert "failed 2 times" in run.error and "CAST_INVALID_INPUT" in run.error
    retries = Event.objects.filter(run=run, kind="batch_failed")
    assert retries.count() >= 1 and retries.first().node == "task1"
    assert Event.objects.filter(run=run, kind="run_failed", node="task1").count() == 1


def test_an_expression_refused_on_the_worker_fails_the_run_at_once(workers, tmp_path: Path) -> None:
    # Given a run whose stored topology slipped past the console (written to the row)
    link = tmp_path / "etcdir"
    doc = filtering("value > 0")
    run = start(doc, policy(), generator=GENERATOR)
    hostile = f"reflect('org.apache.hadoop.fs.FileUtil', 'symLink', '/etc', '{link}') IS NULL"
    for node in doc["nodes"]:
        if node["name"] == "task1":
            node["params"]["condition"] = hostile
    Run.objects.filter(pk=run.pk).update(topology=doc)
    # When its batch reaches the worker
    run = wait_until_done(run, 180)
    # Then the worker refused it before Spark ran anything, and no retry was made
    assert run.status == "failed"
    assert "function 'reflect' is not allowed" in run.error
    assert not Event.objects.filter(run=run, kind="batch_failed").exists()
    assert not link.exists() and not link.is_symlink()


JVM_DIES = """
import os, signal, time
from sparkjobs.session import jvm_exit_code, restart_if_dead, spark_session
from pyspark import SparkContext
from orchestrator.services import heartbeat
spark = spark_session(master="local[1]")
assert spark.range(10).count() == 10
os.kill(SparkContext._gateway.proc.pid, signal.SIGKILL)
SparkContext._gateway.proc.wait()
print("beat", heartbeat.beat("jvm-test")["jvm"], flush=True)
print("restart", restart_if_dead(), flush=True)
print("count", spark_session(master="local[1]").range(7).count(), flush=True)
"""


def test_a_dead_spark_jvm_is_reported_and_replaced(services, client) -> None:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user("hank", password="pw-hank-123")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client.force_login(user)
    # Given a worker process whose Spark JVM is killed
    env = {**child_env(services), "DJANGO_SETTINGS_MODULE": "webapp.settings.test"}
    script = "import django; django.setup()\n" + JVM_DIES
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        cwd=root,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert child.stdout is not None
    try:
        # Then its heartbeat says so
        assert child.stdout.readline().split() == ["beat", "exited", "with", "code", "-9"]
        # and /healthz reports the dead JVM while the heartbeat lasts
        answer = client.get("/healthz")
        assert answer.status_code == 503
        check = next(c for c in answer.json()["checks"] if c["service"] == "spark-workers")
        assert "report a dead JVM (exited with code -9" in check["detail"]
        # and the worker starts a new session, in which Spark runs again
        assert child.stdout.readline().split() == ["restart", "-9"]
        assert child.stdout.readline().split() == ["count", "7"]
    finally:
        child.kill()
        child.wait()


OUT_OF_MEMORY = """
import sys
from pathlib import Path
import sparkjobs.grouped
from orchestrator.models import Run, Segment
from orchestrator.worker.batch import process_batch
from sparkjobs.session import jvm_exit_code
from tests.orchestrator.runs import pending_run, queue_segments, records_file


def exhausting(spark, *args, **kwargs):
    # What no admitted expression may build: 1 GB, folded while Spark plans the query
    spark.range(1).selectExpr("length(repeat(repeat('x', 1000000), 1000)) AS n").collect()
    raise AssertionError("the JVM survived")


# The catalog finds the aggregate's batch job by its name when a batch runs
# (sparkjobs/catalog.py, AGGREGATE_JOB): the name now leads here.
sparkjobs.grouped.aggregate_batch = exhausting
run = pending_run("reference")
ids = queue_segments(run, [records_file(Path(sys.argv[1]) / "in.jsonl", range(10))])
report = process_batch(run.pk, "task1", None)
print("code", jvm_exit_code(), flush=True)
print("failure", report.failure, flush=True)
print("failures", *Segment.objects.filter(pk__in=ids).values_list("failures", flat=True))
print("status", Run.objects.get(pk=run.pk).status, flush=True)
"""


def test_a_batch_that_exhausts_its_jvm_fails_alone_and_says_so(services, tmp_path: Path) -> None:
    # Given a worker process whose Spark JVM has a 512 MB heap, and a batch whose operator
    # exhausts it (as the console's budget no longer lets an expression do)
    env = {
        **child_env(services),
        "DJANGO_SETTINGS_MODULE": "webapp.settings.test",
        "SPARK_DRIVER_MEMORY": "512m",
        "BPCONSOLE_DATA_DIR": str(tmp_path / "data"),
    }
    script = "import django; django.setup()\n" + OUT_OF_MEMORY
    root = Path(__file__).resolve().parents[3]
    # When the worker runs the batch
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env=env,
        cwd=root,
        text=True,
        capture_output=True,
        timeout=240,
        check=False,
    )
    lines = done.stdout.splitlines()
    # Then the JVM ended at once with the out-of-memory code, rather than serving other
    # batches half-alive, and the batch failed saying so, counted, its run still active
    assert "code 3" in lines, (lines, done.stderr[-3000:])
    assert (
        "failure the Spark JVM ran out of memory under this batch (exit code 3); "
        "the worker starts a new one for its next batch" in lines
    ), lines
    assert "failures 1" in lines and "status pending" in lines, lines
