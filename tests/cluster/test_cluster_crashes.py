"""On real cluster engines (a Spark standalone master with two workers, a ZooKeeper
ensemble of three), a run loses a Spark worker, a Celery Spark worker and a ZooKeeper
server mid-run, goes on, and equals the batch job run on its own share of the cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import psutil
import pytest
import yaml
from pytest_django.fixtures import Settings

from orchestrator.ledger.groups import GroupRow
from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run, Segment
from orchestrator.services.launcher import PROJECT_ROOT
from tests.cluster.conftest import Cluster
from tests.cluster.engines import SparkWorker
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
]

SPARK_WORKERS = ("spark1", "spark2")
GENERATOR = "seed=21,volume_mb=6,dominance=0.85,skew_mean_s=1000,malformed_every=997"


def _poll(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.1)


def _first_true(conditions: dict[str, Callable[[], bool]], timeout_s: float) -> dict[str, float]:
    """Seconds until each condition first held, all polled together from now."""
    began = time.monotonic()
    seconds: dict[str, float] = {}
    while len(seconds) < len(conditions):
        for what, condition in conditions.items():
            if what not in seconds and condition():
                seconds[what] = time.monotonic() - began
        missing = sorted(set(conditions) - set(seconds))
        assert time.monotonic() - began < timeout_s, f"after {timeout_s} s still no {missing}"
        time.sleep(0.1)
    return seconds


def _pool_pids(cluster: Cluster, name: str) -> set[int]:
    """The Celery worker's pool processes: the pid its batches' leases name."""
    parent = psutil.Process(cluster.celery.processes[name].pid)
    return {child.pid for child in parent.children()}


def _holders(run: Run, cluster: Cluster) -> set[str]:
    """The Spark Celery workers holding one of the run's operator batches."""
    owners = Segment.objects.filter(run=run, state="claimed").exclude(node="sink")
    pids = {int(owner.split(":")[1]) for owner in owners.values_list("lease_owner", flat=True)}
    return {name for name in SPARK_WORKERS if _pool_pids(cluster, name) & pids}


def _executor_host(cluster: Cluster, name: str) -> SparkWorker | None:
    """The standalone worker running the executor of that Celery worker's application."""
    return cluster.executor_host(cluster.celery.processes[name].pid)


def _operator_batches_done(run: Run) -> int:
    return Segment.objects.filter(run=run, state="done").exclude(node="sink").count()


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a Celery worker, parent and pool at once: nothing of it says goodbye."""
    parent = psutil.Process(process.pid)
    for child in parent.children():
        child.kill()
    parent.kill()
    process.wait()


class BatchJob(TypedDict):
    """What ``run_pipeline --batch --json`` prints that the test compares."""

    rows: list[GroupRow]
    malformed_records: int


def _batch_job(cluster: Cluster, doc_file: Path, input_path: str) -> BatchJob:
    """The plain batch job, as an operator runs it: ``run_pipeline --batch``, on the
    cluster's master with its own share."""
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "run_pipeline",
            str(doc_file),
            "--batch",
            "--input",
            input_path,
            "--json",
        ],
        env=cluster.env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    return BatchJob(rows=printed["rows"], malformed_records=printed["malformed_records"])


def test_a_run_outlives_a_spark_worker_a_celery_worker_and_a_zookeeper_server(
    cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    settings.ZK_HOSTS = cluster.zookeeper.hosts
    doc = skewed_reference(buffer_mb=1.0)
    began = time.monotonic()
    run = start(doc, policy(), generator=GENERATOR)
    # Given both Spark Celery workers running an executor on the cluster, each on its
    # share, one of them holding an operator batch
    holder: list[str] = []

    def both_up_and_one_holding() -> bool:
        if any(_executor_host(cluster, name) is None for name in SPARK_WORKERS):
            return False
        holder[:] = [name for name in SPARK_WORKERS if name in _holders(run, cluster)]
        return bool(holder)

    _poll(both_up_and_one_holding, "batch held with both Spark workers up", 180)
    victim = holder[0]
    survivor = next(name for name in SPARK_WORKERS if name != victim)
    victim_pids = _pool_pids(cluster, victim)
    lost = _executor_host(cluster, survivor)
    leader = cluster.zookeeper.leader()
    assert lost is not None and leader is not None
    batches_at_kill = _operator_batches_done(run)
    # When that Celery worker, the standalone worker running the other one's executor
    # and the ZooKeeper leader are killed
    killed_at = time.monotonic() - began
    _kill_tree(cluster.celery.processes[victim])
    lost.daemon.kill()
    leader.daemon.kill()
    victim_owner = r"^[^:]*:(" + "|".join(map(str, victim_pids)) + "):"
    # Then ZooKeeper elects a new leader, the dead worker's application leaves the master,
    # the other one gets an executor on the other standalone worker, the run's batches go
    # on and the dead worker's batch is taken over
    recovery = _first_true(
        {
            "new ZooKeeper leader": lambda: cluster.zookeeper.leader() is not None,
            "dead worker's application gone": lambda: len(cluster.master.apps()) == 1,
            "executor on the other standalone worker": lambda: (
                _executor_host(cluster, survivor) not in (None, lost)
            ),
            "first operator batch done": lambda: _operator_batches_done(run) > batches_at_kill,
            "dead Celery worker's batch taken over": lambda: (
                not Segment.objects.filter(
                    run=run, state="claimed", lease_owner__regex=victim_owner
                ).exists()
            ),
        },
        timeout_s=180,
    )
    run = wait_until_done(run, timeout_s=300)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert Segment.objects.filter(run=run, attempts__gt=1).exists(), "a batch was re-run"
    # Two ZooKeeper servers of three are a quorum: no session ended, the driver kept its lock
    assert Event.objects.filter(run=run, kind="driver").count() == 1
    # And the batch job, on its own share next to the surviving worker's once the dead
    # standalone worker is back (as a service manager brings it back), gives the same rows
    index = cluster.spark_workers.index(lost)
    cluster.spark_workers[index] = lost.restarted()
    cluster.spark_workers[index].daemon.launch()
    _poll(lambda: cluster.master.alive_workers() == 2, "standalone worker back", 120)
    doc_file = tmp_path / "skewed.yaml"
    doc_file.write_text(yaml.safe_dump(dict(doc)))
    (input_path,) = run.input_spec["paths"]
    expected = _batch_job(cluster, doc_file, input_path)
    assert result["rows"] == expected["rows"]
    assert result["malformed_records"] == expected["malformed_records"] > 0
    assert len(result["rows"]) == 48
    # The figures docs/runtime.md quotes (shown with -s or -rP).
    figures = ", ".join(f"{what} {seconds:.1f} s" for what, seconds in recovery.items())
    print(f"killed {killed_at:.1f} s into the run; after the kills: {figures}")
