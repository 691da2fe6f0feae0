"""A run's driver holds a thread of its own beside the control worker's pool, never one
of the pool's: more idle stream runs than the pool has threads each get a driver, and
the pool still runs the watchdog at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Run
from orchestrator.run.driver_threads import DriverThreads
from orchestrator.run.lifecycle import set_status
from orchestrator.services.launcher import PROJECT_ROOT
from orchestrator.source.spec import LandingSpec
from orchestrator.tasks import watchdog
from orchestrator.zk.control_plane import ControlPlane
from tests.conftest import WORKER_COMMANDS
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done
from tests.waiting import wait_for

WAIT_S = 10.0


def _pool_threads() -> int:
    """The threads of the test session's two control workers' pools."""
    args = WORKER_COMMANDS["control"]
    return 2 * int(args[args.index("--concurrency") + 1])


# -- the threads alone --------------------------------------------------------------


def test_a_run_is_driven_once_per_worker_and_the_worker_drives_at_most_its_limit() -> None:
    threads = DriverThreads(limit=2)
    release = threading.Event()
    assert threads.start(1, lambda: str(release.wait(WAIT_S))) == "started"
    assert threads.start(1, lambda: "twice") == "this worker drives the run already"
    assert threads.start(2, lambda: str(release.wait(WAIT_S))) == "started"
    assert threads.start(3, lambda: "a third") == "this worker drives 2 runs, its most"
    assert threads.running() == [1, 2]
    # Once the runs end, their places are free again
    release.set()
    assert threads.join(WAIT_S) == []
    assert threads.running() == []
    assert threads.start(3, lambda: "done") == "started"
    assert threads.join(WAIT_S) == []


def test_a_driver_that_fails_frees_its_place_and_join_names_the_ones_still_going() -> None:
    threads = DriverThreads(limit=2)

    def fails() -> str:
        raise RuntimeError("the driver broke")

    stuck = threading.Event()
    assert threads.start(1, fails) == "started"
    assert threads.start(2, lambda: str(stuck.wait(WAIT_S))) == "started"
    deadline = time.monotonic() + WAIT_S
    while 1 in threads.running():
        assert time.monotonic() < deadline, "the failed driver's place was never freed"
        time.sleep(0.01)
    assert threads.join(0.05) == [2]
    stuck.set()
    assert threads.join(WAIT_S) == []


def test_a_driver_that_never_gives_its_run_up_does_not_keep_its_worker_up() -> None:
    """A worker's shutdown waits ``JOIN_S`` for its drivers; one still going then (it
    waits for a database gone with the machine's services) ends with the process."""
    script = (
        "import threading\n"
        "from orchestrator.run.driver_threads import DriverThreads\n"
        "threads = DriverThreads(limit=1)\n"
        "print(threads.start(1, lambda: str(threading.Event().wait())), flush=True)\n"
        "print(threads.join(0.1), flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["started", "[1]"]


# -- on the real stack --------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_more_idle_stream_runs_than_pool_threads_each_get_a_driver_and_the_pool_stays_free(
    workers: Any, services: Any, tmp_path: Path
) -> None:
    # Given more landing-folder runs, with nothing landing, than the control workers'
    # pools have threads
    runs: list[Run] = []
    for number in range(_pool_threads() + 2):
        landing = tmp_path / f"landing-{number}"
        landing.mkdir()
        runs.append(start(skewed_reference(), policy(), source=LandingSpec(str(landing))))
    try:
        # Then every run gets a driver
        deadline = time.monotonic() + 120
        with ControlPlane.connect(services.zk_hosts) as control:
            while True:
                driven = [r.pk for r in runs if control.driver_holder(str(r.pk)) is not None]
                if len(driven) == len(runs):
                    break
                assert time.monotonic() < deadline, (
                    f"only runs {driven} of {[r.pk for r in runs]} got a driver"
                )
                time.sleep(0.2)
        # and a short task on the control queue still runs at once
        began = time.monotonic()
        answer = watchdog.apply_async(queue="control").get(timeout=30)
        assert answer["drivers_started"] == [], "every run still has its driver"
        assert time.monotonic() - began < 30
    finally:
        for run in runs:
            set_status(run.pk, Run.Status.CANCELLED, reason="test: done")
    for run in runs:
        assert wait_until_done(run, timeout_s=60).status == Run.Status.CANCELLED
    # and every driver lets its run go: one still winding down after its run was
    # cancelled holds locks the next test's flush of the database would wait for.
    with ControlPlane.connect(services.zk_hosts) as control:
        wait_for(
            "every cancelled run's driver to let it go",
            lambda: all(control.driver_holder(str(r.pk)) is None for r in runs),
            timeout_s=60,
            detail=lambda: str([r.pk for r in runs if control.driver_holder(str(r.pk))]),
        )
