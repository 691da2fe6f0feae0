"""A cluster for one test: a Spark standalone master and two workers, a three-server
ZooKeeper ensemble, and the console's Celery workers on them (two Spark workers, one
control worker, beat), on the session's PostgreSQL and Redis."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import pytest

from orchestrator.celery import app as celery_app
from orchestrator.services.launcher import Endpoints
from tests.cluster.engines import SparkMaster, SparkWorker, ZooKeeperEnsemble
from tests.conftest import TEST_VAR_DIR, Workers, child_env

HOST = "bpconsole-cluster"
SHARED_QUEUES = ("control", "spark")


@dataclass
class Cluster:
    master: SparkMaster
    spark_workers: list[SparkWorker]
    zookeeper: ZooKeeperEnsemble
    celery: Workers

    @property
    def env(self) -> dict[str, str]:
        """What a console process on this cluster is given (a Celery worker, manage.py)."""
        return self.celery.env

    def executor_host(self, worker_pid: int) -> SparkWorker | None:
        """The standalone worker running the executor of the application of the Celery
        worker ``worker_pid``: an executor's ``--driver-url`` names a port its driver,
        the Spark JVM under the Celery worker, listens on."""
        driver = psutil.Process(worker_pid)
        ports = {p for process in driver.children(recursive=True) for p in _listening(process)}
        for worker in self.spark_workers:
            if worker.daemon.process is None or worker.daemon.process.poll() is not None:
                continue
            for executor in psutil.Process(worker.daemon.pid).children():
                try:
                    command = executor.cmdline()
                except psutil.NoSuchProcess:  # an executor whose driver is gone just exited
                    continue
                if "--driver-url" in command:
                    url = command[command.index("--driver-url") + 1]
                    if int(url.rsplit(":", 1)[1]) in ports:
                        return worker
        return None


def _listening(process: psutil.Process) -> set[int]:
    try:
        connections = process.net_connections("tcp")
    except psutil.NoSuchProcess:  # the launch scripts before a JVM come and go
        return set()
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}


@contextmanager
def others_paused() -> Iterator[None]:
    """The session's own workers (the ``workers`` fixture, when a test before started
    them) stop taking tasks from the shared queues while the cluster runs: on the same
    broker they would take its batches to local Spark and its drivers to the session's
    single ZooKeeper. Each gets back exactly the queues it had."""
    replies = celery_app.control.inspect(timeout=2.0).active_queues() or {}
    paused = {
        worker: [q["name"] for q in queues if q["name"] in SHARED_QUEUES]
        for worker, queues in replies.items()
        if not worker.endswith(f"@{HOST}")
    }
    for worker, queues in paused.items():
        for queue in queues:
            celery_app.control.cancel_consumer(queue, destination=[worker], reply=True)
    try:
        yield
    finally:
        for worker, queues in paused.items():
            for queue in queues:
                celery_app.control.add_consumer(queue, destination=[worker], reply=True)


@pytest.fixture
def cluster(services: Endpoints, django_db_setup: None) -> Iterator[Cluster]:
    base = TEST_VAR_DIR / "cluster"
    # A fresh ensemble: no znode of an earlier test's run (run ids repeat) is left.
    shutil.rmtree(base, ignore_errors=True)
    log_dir = base / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    zookeeper = ZooKeeperEnsemble.create(base / "zookeeper")
    master = SparkMaster.create(log_dir)
    spark_workers = [SparkWorker.create(f"spark-worker{n}", master, log_dir) for n in (1, 2)]
    env = {
        **child_env(services),
        "ZK_HOSTS": zookeeper.hosts,
        "SPARK_MASTER": master.url,
        # Two cores in the cluster, one per application: each Spark worker process and
        # the batch job get a share, and none waits for another to end.
        "SPARK_CORES_MAX": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
    }
    celery = Workers(env, log_dir, host=HOST, beat_schedule=base / "beat-schedule")
    cluster = Cluster(master, spark_workers, zookeeper, celery)
    with others_paused():
        try:
            # Every JVM starts at once; the Celery workers as soon as ZooKeeper serves,
            # since each registers there when ready.
            zookeeper.launch()
            master.daemon.launch()
            for worker in spark_workers:
                worker.daemon.launch()
            zookeeper.wait_ready()
            for name in ("control1", "spark1", "spark2", "beat"):
                celery.start(name)
            master.wait_ready()
            master.daemon.wait_for(
                lambda: master.alive_workers() == len(spark_workers), "workers", 120
            )
            celery.wait_ready(["control1", "spark1", "spark2"])
            yield cluster
        finally:
            celery.stop()
            for worker in cluster.spark_workers:
                worker.daemon.stop()
            master.daemon.stop()
            zookeeper.stop()
