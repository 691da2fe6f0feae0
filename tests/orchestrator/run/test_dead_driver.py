"""One driver per run: a second one steps aside quietly, and the watchdog breaks a
driver's lock only when the holder is a process of this machine that is gone (another
machine's driver is left to its session's expiry)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from orchestrator.models import Event, Run
from orchestrator.run.driver import RunDriver
from orchestrator.tasks import died_here
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.runs import pending_run


def _a_dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_gone_process_of_this_machine_died() -> None:
    assert died_here(f"{socket.gethostname()}:{_a_dead_pid()}:task-id") is True


def test_a_live_process_of_this_machine_did_not() -> None:
    assert died_here(f"{socket.gethostname()}:{os.getpid()}:task-id") is False


def test_another_machines_driver_is_never_judged_here() -> None:
    assert died_here(f"not-{socket.gethostname()}:{_a_dead_pid()}:task-id") is False


def test_a_holder_that_names_no_pid_is_never_judged() -> None:
    assert died_here(f"{socket.gethostname()}:not-a-pid:task-id") is False
    assert died_here("") is False


@pytest.mark.integration
def test_a_second_driver_steps_aside_without_an_error(services) -> None:
    with (
        ControlPlane.connect(services.zk_hosts) as first,
        ControlPlane.connect(services.zk_hosts) as second,
    ):
        assert first.driver_lock("9999", "host-a:1:task").acquire(timeout=5)
        late = RunDriver(
            9999,
            second,
            "host-b:2:task",
            dispatch=lambda *_: None,
            publish=lambda *_: None,
        )
        assert late.drive(lock_timeout_s=0.2) == "another driver holds this run"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_driver_that_gets_the_lock_after_the_run_ended_does_not_take_it_over(
    services,
) -> None:
    # Drivers queue for a run's lock; one that gets it after another finished the run
    # (or after the watchdog broke dead drivers' locks) must leave the run as it is.
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    epoch = Run.objects.get(pk=run.pk).epoch
    with ControlPlane.connect(services.zk_hosts) as control:
        late = RunDriver(
            run.pk, control, "host-a:1:task", dispatch=lambda *_: None, publish=lambda *_: None
        )
        assert late.drive(lock_timeout_s=2) == Run.Status.COMPLETED
    ended = Run.objects.get(pk=run.pk)
    assert (ended.status, ended.epoch) == (Run.Status.COMPLETED, epoch)
    assert not Event.objects.filter(run=run, kind="driver").exists()
