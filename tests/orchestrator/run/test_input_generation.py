"""A run's generated input is written by its driver (orchestrator/run/generation.py), not by
the request: whole or not at all, at a path every driver of the run shares, with its
progress on the run, stopped when the run is, and resumed by the next driver after a
crash (the watchdog starts it)."""

from __future__ import annotations

import datetime as dt
import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from orchestrator import tasks
from orchestrator.ledger import segments
from orchestrator.models import Event, Run
from orchestrator.pipeline.generator import partial_paths
from orchestrator.run import generation
from orchestrator.run.generation import PROGRESS_EVERY_S, input_path, prepare_input
from orchestrator.run.lifecycle import create_run, set_status
from orchestrator.services.launcher import PROJECT_ROOT
from orchestrator.worker.plain_job import generated_input
from orchestrator.zk.control_plane import ControlPlane
from tests.conftest import child_env
from tests.orchestrator.run.scenarios import policy, skewed_reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MB = 1024 * 1024


def pending(generator: str) -> Run:
    return create_run(topology=skewed_reference(), policy=policy(), generator=generator)


def as_next_driver(run: Run, **hooks: Any) -> str | None:
    """What a new driver of ``run`` does before its source opens."""
    epoch = segments.bump_epoch(run.pk)
    run.refresh_from_db()
    hooks.setdefault("alive", lambda: True)
    hooks.setdefault("publish", lambda final: None)
    return prepare_input(run, epoch, **hooks)


def digest(path: str | Path) -> str:
    sha = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(4 * MB):
            sha.update(block)
    return sha.hexdigest()


def test_the_driver_writes_the_input_records_its_progress_and_then_the_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a pending run of 40 MB, its input not written by the request that made it
    # (a fast machine writes it in under PROGRESS_EVERY_S: report more often to see the
    # reports spaced as the interval says)
    every_s = PROGRESS_EVERY_S / 10
    monkeypatch.setattr(generation, "PROGRESS_EVERY_S", every_s)
    generator = "seed=4,volume_mb=40,dominance=0.8"
    run = pending(generator)
    assert not input_path(run.pk).exists()
    seen: list[tuple[float, dict[str, int] | None, bool]] = []

    def publish(final: bool) -> None:
        now = time.monotonic()  # before the read, whose time varies
        spec = Run.objects.get(pk=run.pk).input_spec
        seen.append((now, spec.get("generating"), bool(spec.get("paths"))))

    # When its driver prepares the input
    assert as_next_driver(run, publish=publish) is None
    # Then the file is whole, byte for byte what the batch job generates for this spec
    path = input_path(run.pk)
    size = path.stat().st_size
    assert digest(path) == digest(generated_input(skewed_reference(), generator))
    assert partial_paths(path) == []
    # ...the run records its paths and extent (what coverage and the page use)...
    run.refresh_from_db()
    assert run.input_spec["paths"] == [str(path.resolve())]
    assert run.input_spec["extent_total"] == size
    assert run.input_spec["generating"] == {"written": size, "total": size}
    event = Event.objects.get(run=run, kind="input_generated")
    assert event.data["bytes"] == size
    # ...and while it wrote, its progress went to the page at most every interval
    writing = [(t, g) for t, g, ready in seen if not ready]
    assert writing[0][1] == {"written": 0, "total": 40 * MB}
    middle = [(t, g) for t, g in writing if 0 < g["written"] < size]
    assert middle, f"no progress was recorded: {seen}"
    # (counted over the whole writing, not pair by pair: one report's database write,
    # slow on a loaded machine, brings the next report's snapshot closer to it; a
    # report per chunk would make one every few milliseconds)
    times = [t for t, _ in writing]
    assert len(times) - 1 <= (times[-1] - times[0]) / every_s + 1, times
    written = [g["written"] for _, g in writing]
    assert written == sorted(written)
    assert seen[-1][2], "the last snapshot shows the input ready"


@pytest.mark.django_db(transaction=True)
def test_a_driver_killed_half_way_leaves_no_input_and_the_next_writes_it_whole(
    services,
) -> None:
    # Given a pending run of 160 MB whose first driver (a process) writes its input...
    generator = "seed=8,volume_mb=160,dominance=0.8"
    run = pending(generator)
    # (this test plays both drivers, so it holds the run's driver lock as they would: the
    # watchdog of a session's workers must not start a third one meanwhile)
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        lock = control.driver_lock(str(run.pk), "test: both drivers")
        assert lock.acquire(timeout=10)
        try:
            kill_the_first_driver_then_take_over(run, generator, services)
        finally:
            lock.release()


def kill_the_first_driver_then_take_over(run: Run, generator: str, services: Any) -> None:
    code = (
        "import django; django.setup()\n"
        "from tests.orchestrator.run.test_input_generation import as_next_driver\n"
        "from orchestrator.models import Run\n"
        f"as_next_driver(Run.objects.get(pk={run.pk}))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=child_env(services),
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            state = Run.objects.get(pk=run.pk).input_spec.get("generating") or {}
            if state.get("written"):
                break
            assert child.poll() is None, child.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the first driver never reported progress"
            time.sleep(0.05)
        # ...when it is killed half-way
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    path = input_path(run.pk)
    # Then there is no input file, only a partial one no reader takes for the input
    assert not path.exists()
    assert len(partial_paths(path)) == 1
    assert "paths" not in Run.objects.get(pk=run.pk).input_spec
    # When the next driver takes over
    assert as_next_driver(run) is None
    # Then it deleted the partial file and wrote the whole input at the same path
    assert partial_paths(path) == []
    assert digest(path) == digest(generated_input(skewed_reference(), generator))
    run.refresh_from_db()
    assert run.input_spec["paths"] == [str(path.resolve())]
    assert run.input_spec["extent_total"] == path.stat().st_size


@pytest.mark.parametrize(
    ("what", "outcome"),
    [("stop", "cancelled"), ("lose", "lost"), ("supersede", "superseded by a newer driver")],
)
def test_writing_stops_when_the_run_stops_or_another_driver_owns_it(
    what: str, outcome: str
) -> None:
    # Given a driver writing a 64 MB input
    run = pending("seed=5,volume_mb=64")
    owner = {"alive": True}

    def publish(final: bool) -> None:
        state = Run.objects.get(pk=run.pk).input_spec.get("generating") or {}
        if state.get("written") and not final and not owner.get("done"):
            owner["done"] = True
            # When, half-way, the run is stopped, the driver's session lost or a new
            # driver takes over
            if what == "stop":
                set_status(run.pk, "cancelled")
            elif what == "lose":
                owner["alive"] = False
            else:
                segments.bump_epoch(run.pk)

    result = as_next_driver(run, alive=lambda: owner["alive"], publish=publish)
    # Then it stops at its next progress report, leaving no file behind
    assert result == outcome
    assert not input_path(run.pk).exists()
    assert partial_paths(input_path(run.pk)) == []
    assert "paths" not in Run.objects.get(pk=run.pk).input_spec


def test_a_limit_lowered_since_the_run_was_made_fails_it_before_writing(settings) -> None:
    # Given a pending run of 16 MB, then a limit lowered to 8 MB
    run = pending("seed=1,volume_mb=16")
    settings.BPCONSOLE_GENERATOR_MAX_MB = 8
    # When its driver starts
    outcome = as_next_driver(run)
    # Then the run fails naming the field and the limit, and nothing was written
    run.refresh_from_db()
    assert outcome == "failed" and run.status == "failed"
    assert "volume_mb: 16 MB is over the limit of 8 MB" in run.error
    assert Event.objects.filter(run=run, kind="run_failed").exists()
    assert not input_path(run.pk).parent.exists() or not any(input_path(run.pk).parent.iterdir())


def test_an_input_that_does_not_fit_on_the_disk_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a data folder with 10 MB free and a run of 64 MB
    run = pending("seed=2,volume_mb=64")

    class Usage:
        free = 10 * MB

    monkeypatch.setattr(generation.shutil, "disk_usage", lambda path: Usage())
    # When its driver starts
    outcome = as_next_driver(run)
    # Then the run fails saying why, and nothing was written
    run.refresh_from_db()
    assert outcome == "failed" and run.status == "failed"
    assert "64 MB do not fit in the 10 MB free" in run.error
    assert not input_path(run.pk).exists()
    assert partial_paths(input_path(run.pk)) == []


def test_the_watchdog_gives_a_pending_run_whose_generation_began_a_new_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a pending run whose driver died while writing its input (no driver holds it)
    # and a pending run never started
    begun = pending("seed=3,volume_mb=8")
    spec = {**begun.input_spec, "generating": {"written": 2 * MB, "total": 8 * MB}}
    Run.objects.filter(pk=begun.pk).update(input_spec=spec)
    never = pending("seed=3,volume_mb=8")
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(tasks.drive_run, "apply_async", lambda **kw: sent.append(kw))
    # When the watchdog runs
    report = tasks.watchdog()
    # Then only the first gets a driver, on the control queue: the second was created
    # just now, and its driver may still be on its way
    assert report["drivers_started"] == [begun.pk]
    assert sent == [{"kwargs": {"run_id": begun.pk}, "queue": "control"}]
    assert never.pk not in report["drivers_started"]


def test_the_watchdog_sends_a_driver_again_for_a_run_whose_start_was_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a run created longer ago than a driver takes to start (its message was lost
    # with a control worker or Redis), and one created just now
    start_s = settings.BPCONSOLE_DRIVER_START_S
    lost = pending("seed=3,volume_mb=8")
    Run.objects.filter(pk=lost.pk).update(created_at=ago(start_s + 1))
    fresh = pending("seed=3,volume_mb=8")
    sent: list[int] = []
    monkeypatch.setattr(
        tasks.drive_run, "apply_async", lambda **kw: sent.append(kw["kwargs"]["run_id"])
    )
    # When the watchdog runs
    report = tasks.watchdog()
    # Then the late one gets a driver, and its timeline says why
    assert report["drivers_started"] == [lost.pk] and sent == [lost.pk]
    (event,) = Event.objects.filter(run=lost, kind="driver_resent")
    assert "was lost" in event.reason
    assert not Event.objects.filter(run=fresh, kind="driver_resent").exists()
    # ...and not another at each pass (every 2 s) while that one may be queued, nor by
    # a second watchdog running at the same time, but after twice the wait, then four
    # times
    assert tasks.watchdog()["drivers_started"] == []
    assert tasks.claim_resend(lost.pk) is False
    for waited, resent in [(start_s * 2 - 1, 0), (start_s * 2 + 1, 1)]:
        Event.objects.filter(run=lost, kind="driver_resent").update(time=ago(waited))
        assert len(tasks.watchdog()["drivers_started"]) == resent
    Event.objects.filter(run=lost, kind="driver_resent").update(time=ago(start_s * 3))
    assert tasks.watchdog()["drivers_started"] == []
    assert sent == [lost.pk, lost.pk]
    # ...and none once a driver holds it
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        lock = control.driver_lock(str(lost.pk), "test: the driver")
        assert lock.acquire(timeout=10)
        try:
            Event.objects.filter(run=lost, kind="driver_resent").update(time=ago(3600))
            assert tasks.watchdog()["drivers_started"] == []
        finally:
            lock.release()


def ago(seconds: float) -> dt.datetime:
    return timezone.now() - dt.timedelta(seconds=seconds)
