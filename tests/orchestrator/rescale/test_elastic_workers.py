"""A placed run's scale-out adds a real Spark worker, and the worker goes back when the
run no longer needs it (orchestrator/rescale/elastic.py, orchestrator/services/
spark_pool.py), on the real stack: the elastic pool starts a Celery Spark worker process
that registers in ZooKeeper, the new instance runs on it, a worker killed in the middle
of the adjustment loses nothing, a scale-out past the maximum is refused with an event,
and the result equals the plain Spark job."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from orchestrator.ledger.results import summary
from orchestrator.models import Adjustment, Event, Instance, Segment
from orchestrator.run.lifecycle import live_workers, request_adjustment
from orchestrator.services.runconsole import Child
from orchestrator.services.spark_pool import SparkPool
from orchestrator.services.supervisor import Supervisor
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import policy, start, wait_until_done
from tests.orchestrator.run.test_placement import unemulated_reference

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


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
def elastic_pool(workers, control: ControlPlane, base: int) -> Iterator[RunningPool]:
    def make(number: int) -> Child:
        name = f"elastic{number}"
        return Child(
            f"spark worker-{number}",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "orchestrator.celery",
                "worker",
                "-Q",
                "spark",
                "--concurrency",
                "1",
                "-n",
                f"{name}@{workers.host}",
                "--loglevel",
                "INFO",
            ],
            workers.env,
            Path(workers.log_dir) / f"{name}.log",
        )

    # Their lines are printed: pytest shows them when the test fails.
    supervisor = Supervisor(say=print)
    pool = SparkPool(base, base + 1, make, control, supervisor, print)
    running = RunningPool(pool)
    running.thread.start()
    try:
        yield running
    finally:
        running.stop.set()
        running.thread.join(10)
        for worker in pool.extras + pool.stopping:
            if worker.process is not None and worker.process.poll() is None:
                _kill_tree(worker.process.pid)


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(pid)
        for process in [*parent.children(recursive=True), parent]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)


def _until(what: str, check, timeout_s: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(0.2)


def test_a_scale_out_starts_a_worker_a_killed_one_loses_nothing_and_the_run_gives_it_back(
    workers,
) -> None:
    base = sorted(live_workers())
    assert base, "the test stack runs a Spark worker"
    with (
        ControlPlane.connect(settings.ZK_HOSTS) as control,
        elastic_pool(workers, control, len(base)) as running,
    ):
        # Given a placed run on the base workers, and an elastic pool one worker wide
        doc = unemulated_reference()
        run = start(
            doc,
            policy(placement="placed", migration="off", routing="static"),
            generator="seed=11,volume_mb=40,dominance=0.6,skew_mean_s=1000",
        )
        _until("the driver placed the tasks", lambda: Event.objects.filter(run=run, kind="placed"))
        _until("a task batch", lambda: Segment.objects.filter(run=run, state="done").exists())
        # When one more instance of the stage is asked for while every worker runs one
        request_adjustment(run.pk, "add_instance", stage="agg")
        asked = _until(
            "the run asked the pool for a worker",
            lambda: Event.objects.filter(run=run, kind="worker_asked").first(),
        )
        assert asked.data["extra"] == 1
        # Then the pool starts a real worker process, which registers in ZooKeeper
        new = _until(
            "the new worker registered",
            lambda: sorted(set(live_workers()) - set(base)),
        )
        (worker,) = new
        assert running.pool.extras and running.pool.extras[0].poll() is None
        # and the new instance is added on it by hot rescale
        adjustment = _until(
            "a scale-out adjustment began",
            lambda: Adjustment.objects.filter(run=run, kind="scale_out").first(),
        )
        (added,) = adjustment.plan["added"]
        assert Instance.objects.get(run=run, name=added).worker == worker
        # When the worker is killed in the middle of it
        victim = running.pool.extras[0].process
        assert victim is not None
        _kill_tree(victim.pid)
        # and one more instance is asked for: the pool is at its maximum
        _until(
            "the adjustment ended",
            lambda: not Adjustment.objects.filter(run=run, status="running").exists(),
            timeout_s=180,
        )
        request_adjustment(run.pk, "add_instance", stage="agg")
        refused = _until(
            "the second scale-out was refused",
            lambda: Event.objects.filter(
                run=run, kind="adjust_refused", reason__startswith="scale out of agg refused"
            ).first(),
        )
        assert "maximum" in refused.reason and "nothing was started" in refused.reason
        assert len(running.pool.extras) == 1
        # Then the run equals the plain Spark job over its input
        run = wait_until_done(run, timeout_s=300)
        result = summary(run)
        assert result["coverage"] == "exact", result["error"]
        expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
        assert result["rows"] == expected["rows"]
        # and its worker goes back: the pool stops it and it leaves ZooKeeper
        _until(
            "the run's ask was cleared", lambda: str(run.pk) not in control.spark_workers_asked()
        )
        _until("the pool stopped its worker", lambda: not running.pool.extras)
        _until(
            "the stopped worker left ZooKeeper",
            lambda: not (set(live_workers()) - set(base)),
            timeout_s=90,
        )
