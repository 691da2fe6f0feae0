"""Live runs over the generator: the input is written by the run's driver on a control
worker (never by the request), the result equals the batch job's over the same spec,
a driver killed while writing it is replaced by one that writes it whole, and a run
whose start message was lost gets its driver from the watchdog."""

from __future__ import annotations

import copy
import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.utils import timezone

from orchestrator import tasks
from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run
from orchestrator.pipeline.generator import partial_paths
from orchestrator.run.generation import input_path
from orchestrator.run.lifecycle import create_run
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import (
    REFERENCE,
    policy,
    skewed_reference,
    start,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_the_driver_writes_the_input_and_the_run_equals_the_batch_job(workers) -> None:
    # Given a run over the generator, created and handed to the workers
    doc = skewed_reference()
    generator = "seed=31,volume_mb=3,dominance=0.7,malformed_every=499"
    run = start(doc, policy(), generator=generator)
    # When it ends
    run = wait_until_done(run)
    # Then its driver wrote the input at the run's own path and recorded it...
    path = input_path(run.pk)
    assert run.input_spec["paths"] == [str(path.resolve())]
    assert run.input_spec["extent_total"] == path.stat().st_size
    written = Event.objects.get(run=run, kind="input_generated")
    assert written.data["bytes"] == path.stat().st_size
    assert run.started_at is not None and run.started_at >= written.time
    # ...and the result is exact and equal to the batch job's over the same spec
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=None, generator=generator)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["malformed_records"] == expected["malformed_records"] > 0
    assert result["rows"] == expected["rows"]


def _unthrottled_reference() -> dict[str, Any]:
    """The reference topology with 4 MB segments: a large input in few segments."""
    doc = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    doc["nodes"][0]["params"]["segment_mb"] = 4.0
    return doc


def test_a_control_worker_killed_while_writing_the_input_is_replaced_and_the_run_is_exact(
    workers, services
) -> None:
    # Given a run of 96 MB whose driver is writing its input
    doc = _unthrottled_reference()
    generator = "seed=17,volume_mb=96,dominance=0.6"
    run = start(doc, policy(migration="off"), generator=generator)
    deadline = time.monotonic() + 120
    while not (Run.objects.get(pk=run.pk).input_spec.get("generating") or {}).get("written"):
        assert time.monotonic() < deadline, "no driver reported writing the input"
        time.sleep(0.05)
    with ControlPlane.connect(services.zk_hosts) as control:
        holder = control.driver_holder(str(run.pk))
    assert holder is not None
    pid = int(holder.split(":")[1])
    victim = next(name for name, p in workers.processes.items() if p.pid == pid)
    # When the control worker running that driver is killed half-way
    os.kill(pid, signal.SIGKILL)
    try:
        assert "paths" not in Run.objects.get(pk=run.pk).input_spec
        # Then the watchdog gives the pending run a new driver (a newer epoch), which
        # writes the input whole, and the run completes exactly, equal to the batch job
        run = wait_until_done(run, timeout_s=300)
        result = summary(run)
        assert result["status"] == "completed", result["error"]
        assert result["coverage"] == "exact"
        assert run.epoch >= 2
        assert Event.objects.filter(run=run, kind="input_generated").count() == 1
        assert partial_paths(input_path(run.pk)) == []
        expected = batch_summary(topology=doc, input_path=None, generator=generator)
        assert result["rows"] == expected["rows"]
    finally:
        # The killed control worker comes back for the tests that follow.
        workers.start(victim)
        workers.wait_ready([victim])


def test_a_run_whose_start_was_lost_is_started_by_the_watchdog_and_is_exact(workers) -> None:
    # Given a run created over a minute ago whose driver never came (the message asking
    # for it was lost with a control worker or Redis: nothing was sent here)
    doc = skewed_reference()
    generator = "seed=32,volume_mb=2,dominance=0.7"
    run = create_run(topology=doc, policy=policy(), generator=generator)
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    # When the watchdog runs (here, with the product's 30 s: the session's own waits an
    # hour, for the ledger tests' bare pending runs)
    assert tasks.watchdog()["drivers_started"] == [run.pk]
    # Then a control worker drives it to the end, and the result equals the batch job's
    run = wait_until_done(run)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    expected = batch_summary(topology=doc, input_path=None, generator=generator)
    assert result["rows"] == expected["rows"]
    assert Event.objects.filter(run=run, kind="driver_resent").count() == 1
