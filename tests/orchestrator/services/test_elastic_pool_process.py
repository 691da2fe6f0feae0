"""``make run``'s path to the elastic Spark workers, end to end: the process runconsole
builds for the pool (``manage.py elastic_workers``) serves an ask written in ZooKeeper
(``orchestrator/zk/spark_pool.py``) with a real Celery Spark worker process of its own,
which registers in ZooKeeper, and stops that worker when the ask goes back to 0."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Any

import psutil
import pytest

from orchestrator.services.launcher import Endpoints
from orchestrator.services.runconsole import elastic_workers
from orchestrator.zk.control_plane import ControlPlane
from tests.conftest import TEST_VAR_DIR, child_env
from tests.waiting import alive, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

# Not a run's id: the pool serves what all asks add up to, whoever made them.
ASKER = "elastic-pool-test"


def _parent(pid: object) -> int | None:
    """The parent of the process ``pid``, or None when there is no such process."""
    if not isinstance(pid, int):
        return None
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def test_an_ask_in_zookeeper_starts_a_real_spark_worker_and_an_ask_of_0_stops_it(
    services: Endpoints,
) -> None:
    # Given the pool's process as make run builds it for one base worker and two at
    # most, started on the test services
    pool = elastic_workers(1, 2, sys.executable, child_env(services), TEST_VAR_DIR / "log")
    assert pool is not None
    with ControlPlane.connect(services.zk_hosts) as control:
        # (the test ZooKeeper outlives the test database: no run of an earlier session
        # may still ask)
        for asker in control.spark_workers_asked():
            control.ask_spark_workers(asker, 0, "a run of an earlier test session")
        pool.start()
        assert pool.process is not None
        pool_pid = pool.process.pid
        try:
            # When one worker is asked for
            control.ask_spark_workers(ASKER, 1, "test: one worker beyond the base")

            # Then the pool starts a Celery Spark worker process of its own, which
            # registers in ZooKeeper
            def registered() -> dict[str, Any] | None:
                assert pool.poll() is None, f"the pool's process exited with {pool.poll()}"
                for name, info in control.live_workers().items():
                    if _parent(info.get("pid")) == pool_pid:
                        return {**info, "znode": name}
                return None

            worker = wait_for("a Spark worker of the pool registered", registered, timeout_s=90)
            assert "spark" in worker["queues"]
            assert worker["name"].startswith("spark-2@")  # runconsole's second Spark worker
            assert control.spark_pool() == {"base": 1, "maximum": 2, "extra": 1}
            parent = psutil.Process(worker["pid"])
            processes = [parent, *parent.children(recursive=True)]
            # When the ask goes back to 0
            control.ask_spark_workers(ASKER, 0, "test: done")
            # Then the pool stops the worker: its processes exit and it leaves ZooKeeper
            wait_for(
                "the worker's processes exited",
                lambda: not [p for p in processes if alive(p)],
            )
            wait_for(
                "the worker left ZooKeeper",
                lambda: worker["znode"] not in control.live_workers(),
            )
            wait_for(
                "the pool said it keeps no worker",
                lambda: control.spark_pool() == {"base": 1, "maximum": 2, "extra": 0},
            )
            assert pool.poll() is None
        finally:
            control.ask_spark_workers(ASKER, 0, "test: done")
            pool.process.terminate()  # its workers, if any, are stopped first
            with contextlib.suppress(subprocess.TimeoutExpired):
                pool.process.wait(30)
            if pool.process.poll() is None:
                pool.process.kill()
                pool.process.wait()
