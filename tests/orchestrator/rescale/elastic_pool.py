"""The elastic Spark-worker pool of ``make run`` (orchestrator/services/spark_pool.py),
run by a test on its own Celery workers' broker and ZooKeeper: ticked in a thread as
``manage.py elastic_workers`` ticks it, its workers killed at the end."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

from orchestrator.services.runconsole import Child
from orchestrator.services.spark_pool import SparkPool
from orchestrator.services.supervisor import Supervisor
from orchestrator.zk.control_plane import ControlPlane
from tests.conftest import WORKER_COMMANDS, Workers

SPARK_WORKER = WORKER_COMMANDS["spark"]


class RunningPool:
    """The elastic pool and its supervisor, ticked in a thread as ``make run`` does."""

    def __init__(self, pool: SparkPool) -> None:
        self.pool = pool
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            self.pool.supervisor.tick()
            self.pool.tick()


@contextlib.contextmanager
def elastic_pool(
    workers: Workers, control: ControlPlane, base: int, room: int = 1
) -> Iterator[RunningPool]:
    """A pool of ``base`` workers and ``room`` more for the runs to ask for, starting
    Celery Spark workers ``elastic<n>@<host>`` as ``workers`` starts its own."""

    def make(number: int) -> Child:
        name = f"elastic{number}"
        args = [a.replace("{name}", name).replace("{host}", workers.host) for a in SPARK_WORKER]
        return Child(
            f"spark worker-{number}",
            [sys.executable, "-m", "celery", "-A", "orchestrator.celery", *args],
            workers.env,
            Path(workers.log_dir) / f"{name}.log",
        )

    # A ZooKeeper that outlives the test database: asks left by the runs of an earlier
    # session would be served, or refuse this run's.
    for run in control.spark_workers_asked():
        control.ask_spark_workers(run, 0, "a run of an earlier test session")
    # Their lines are printed: pytest shows them when the test fails.
    supervisor = Supervisor(say=print)
    pool = SparkPool(base, base + room, make, control, supervisor, print)
    running = RunningPool(pool)
    running.thread.start()
    try:
        yield running
    finally:
        running.stop.set()
        running.thread.join(10)
        for worker in pool.extras + pool.stopping:
            if worker.process is not None and worker.process.poll() is None:
                kill_tree(worker.process.pid)


def kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process under it (pool children, Spark's JVM)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(pid)
        for process in [*parent.children(recursive=True), parent]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)


def tree(pid: int) -> list[psutil.Process]:
    """A process and everything under it."""
    parent = psutil.Process(pid)
    return [parent, *parent.children(recursive=True)]
