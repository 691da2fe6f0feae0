"""On a Spark standalone cluster, a placed run's scale-out adds capacity from the cluster
manager: the elastic pool starts a Celery Spark worker, whose application (named after
it) registers with the master and gets an executor on the cluster's free core; the new
instance takes batches there. Once underloaded, the run gives the worker back: the
pool stops it, and its application and executor leave the cluster. The result equals
the plain Spark job over what the run took in."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil
import pytest
from pytest_django.fixtures import Settings

from orchestrator.ledger.results import summary
from orchestrator.models import Adjustment, Event, Instance, Segment, SourceFile
from orchestrator.run.lifecycle import live_workers, request_adjustment, set_status
from orchestrator.zk.control_plane import ControlPlane
from tests.cluster.conftest import Cluster
from tests.cluster.engines import MasterApp, SparkWorker
from tests.orchestrator.rescale.elastic_pool import elastic_pool
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    plain_rows_over_intake,
    policy,
    start,
    unemulated_reference,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
]

# The base Celery Spark workers of the cluster fixture, one application each.
BASE = 2
SCALE_IN_AFTER_S = 5.0


def _application(cluster: Cluster, worker: str) -> MasterApp | None:
    """The master's view of the application of the Spark worker registered as
    ``worker``: named after its Celery node name."""
    node = live_workers().get(worker, {}).get("name")
    return next((a for a in cluster.master.apps() if a["name"] == f"bpconsole {node}"), None)


def _executors(worker: SparkWorker) -> list[psutil.Process]:
    """The executor processes a standalone worker runs."""
    executors = []
    for child in psutil.Process(worker.daemon.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "--driver-url" in child.cmdline():
                executors.append(child)
    return executors


def test_a_scale_out_gets_an_executor_from_the_cluster_and_a_scale_in_gives_it_back(
    cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    settings.ZK_HOSTS = cluster.zookeeper.hosts
    base = sorted(live_workers())
    assert len(base) == BASE, base
    # Given a cluster with a free core: the base applications hold one core each of
    # the first two standalone workers, and a third one offers one more
    spare = SparkWorker.create("spark-worker3", cluster.master, cluster.celery.log_dir)
    cluster.spark_workers.append(spare)  # stopped with the cluster
    spare.daemon.launch()
    spare.daemon.wait_for(lambda: cluster.master.alive_workers() == 3, "registration", 120)
    for worker in base:
        wait_for(
            f"{worker}'s application has its core",
            lambda worker=worker: (_application(cluster, worker) or {}).get("cores") == 1,
            timeout_s=120,
        )
    folder = tmp_path / "landing"
    source = landed_at_once(folder, mb=2, seed=11, file_kb=256)
    with (
        ControlPlane.connect(settings.ZK_HOSTS) as control,
        elastic_pool(cluster.celery, control, BASE) as running,
    ):
        # and a placed run on the base workers, with an elastic pool one worker wide
        doc = unemulated_reference()
        values = policy(
            placement="placed",
            migration="off",
            routing="static",
            scale_out="measured",
            scale_in_after_s=SCALE_IN_AFTER_S,
        )
        run = start(doc, values, source=source)
        wait_for(
            "the driver placed the tasks", lambda: Event.objects.filter(run=run, kind="placed")
        )
        # When one more instance of the stage is asked for while every worker runs one
        request_adjustment(run.pk, "add_instance", stage="agg")
        wait_for(
            "the run asked the pool for a worker",
            lambda: Event.objects.filter(run=run, kind="worker_asked").exists(),
        )
        # Then the pool starts a Celery Spark worker, whose application registers with
        # the master and gets an executor on the free core
        (worker,) = wait_for(
            "the new worker registered",
            lambda: sorted(set(live_workers()) - set(base)),
            timeout_s=120,
        )
        extra = running.pool.extras[0].process
        assert extra is not None
        node = live_workers()[worker]["name"]
        app = wait_for(
            "the new worker's application got a core",
            lambda: (a := _application(cluster, worker)) is not None and a["cores"] == 1 and a,
            timeout_s=120,
            detail=lambda: str(cluster.master.apps()),
        )
        assert app["state"] == "RUNNING"
        wait_for(
            "the new application's executor on the spare standalone worker",
            lambda: cluster.executor_host(extra.pid) is spare,
            timeout_s=120,
        )
        # and the new instance, added on it by hot rescale, takes batches there
        adjustment = wait_for(
            "a scale-out adjustment began",
            lambda: Adjustment.objects.filter(run=run, kind="scale_out").first(),
        )
        (added,) = adjustment.plan["added"]
        assert Instance.objects.get(run=run, name=added).worker == worker
        wait_for(
            "the scale-out completed",
            lambda: Adjustment.objects.filter(pk=adjustment.pk, status="complete").exists(),
            timeout_s=180,
        )
        landed_at_once(folder, mb=0.5, seed=13, file_kb=256)
        wait_for(
            "a batch of the new instance done",
            lambda: Segment.objects.filter(run=run, node=added, state="done").exists(),
            timeout_s=180,
        )
        # When the run stays underloaded, it scales in by itself
        wait_for(
            "the balancer's scale-in completed",
            lambda: Adjustment.objects.filter(run=run, kind="scale_in", status="complete"),
            timeout_s=SCALE_IN_AFTER_S + 180,
        )
        # Then the pool stops the worker, and its application and executor leave the
        # cluster
        wait_for("the pool stopped its worker", lambda: not running.pool.extras, timeout_s=120)
        wait_for(
            "the application left the master",
            lambda: f"bpconsole {node}" not in {a["name"] for a in cluster.master.apps()},
            timeout_s=60,
            detail=lambda: str(cluster.master.apps()),
        )
        wait_for(
            "the spare standalone worker's executor exited",
            lambda: not _executors(spare),
            timeout_s=60,
        )
        # When the run is stopped once it has read every landed file
        files = len(list(folder.glob("*.jsonl")))
        wait_for(
            "the run read every landed file",
            lambda: SourceFile.objects.filter(run=run, state="read").count() == files,
            timeout_s=120,
        )
        set_status(run.pk, "stopping", reason="test: every landed file read")
        run = wait_until_done(run, timeout_s=300)
    # Then the run equals the plain Spark job over what it took in
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact", result["error"]
    assert result["rows"] == plain_rows_over_intake(run, doc, tmp_path)
