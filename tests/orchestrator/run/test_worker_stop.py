"""A worker that stops (Ctrl-C, or its broker connection died under it) is not held up
by the driver it runs: a run goes on for days, so the driver gives its run up, the
worker exits, and another driver carries on."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from orchestrator.models import Event, Run
from orchestrator.run.lifecycle import set_status
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    policy,
    skewed_reference,
    start,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def _driver_worker(run: Run, services, workers) -> str:
    deadline = time.monotonic() + 60
    with ControlPlane.connect(services.zk_hosts) as control:
        while time.monotonic() < deadline:
            holder = control.driver_holder(str(run.pk))
            if holder is not None:
                pid = int(holder.split(":")[1])
                return next(name for name, p in workers.processes.items() if p.pid == pid)
            time.sleep(0.1)
    raise AssertionError("no driver took the run")


def test_a_stopping_worker_gives_its_run_up_and_exits(workers, services, tmp_path: Path) -> None:
    # Given a run that never ends by itself (a landing folder)
    run = start(
        skewed_reference(),
        policy(),
        source=landed_at_once(tmp_path / "landing", mb=1, seed=5, file_kb=64),
    )
    victim = _driver_worker(run, services, workers)
    process = workers.processes[victim]
    # When the worker running its driver is asked to stop (a warm shutdown)
    process.send_signal(signal.SIGTERM)
    # Then it exits within seconds, not when the run ends, and another driver goes on
    process.wait(timeout=30)
    deadline = time.monotonic() + 60
    while Event.objects.filter(run=run, kind="driver").count() < 2:
        assert time.monotonic() < deadline, "no other driver took the run over"
        time.sleep(0.2)
    set_status(run.pk, "stopping", reason="test: done")
    run = wait_until_done(run, timeout_s=120)
    assert run.status == "completed", run.error
    # The stopped worker comes back for the tests that follow.
    workers.start(victim)
    workers.wait_ready([victim])
