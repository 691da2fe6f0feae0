"""Stepwise backpressure on a live run: a task buffering past the overload slows its
direct upstream, and once it stays underloaded the upstream is restored to full speed.

A driver that did not report task speeds back to the balancer once slowed the source and
never restored it (the balancer saw every task at full speed, never in backpressure).

The run reads a landing folder, so it goes on after its data is read: the restore is
watched to the end (over a bounded input, the run could complete between two steps of
the restore, as its last batches drained).
"""

from __future__ import annotations

import time

import pytest

from orchestrator.ledger.results import summary
from orchestrator.models import Event
from orchestrator.run.lifecycle import set_status
from orchestrator.source.replay import write_ingested
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    start,
    stepwise_slowed,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_slowed_source_is_restored_to_full_speed_and_the_result_is_exact(
    workers, tmp_path
) -> None:
    # Given 2 MB landed at once, slow branches, and an output slower still
    source = landed_at_once(tmp_path / "landing", mb=2, seed=5, file_kb=256)
    doc, values = stepwise_slowed(output_mbps=2.0)
    run = start(doc, values, source=source)

    def speeds() -> list[dict]:
        events = Event.objects.filter(run=run, kind="set_speed", node="source")
        return [e.data for e in events.order_by("time", "id")]

    # When the branches fill up and then drain (nothing more lands)
    deadline = time.monotonic() + 120
    while not any(s["speed"] == 1.0 and not s["in_backpressure"] for s in speeds()):
        assert time.monotonic() < deadline, f"the source was never restored: {speeds()}"
        time.sleep(0.5)
    # Then the source was slowed first...
    assert any(s["speed"] < 1.0 and s["in_backpressure"] for s in speeds()), speeds()
    # ...and restored to its origin speed, out of backpressure (the wait above); and the
    # stopped run is exactly the plain Spark job over what it took in
    set_status(run.pk, "stopping", reason="test: restored")
    run = wait_until_done(run)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    taken = tmp_path / "ingested.jsonl"
    write_ingested(run, taken)
    expected = batch_summary(topology=doc, input_path=str(taken), generator=None)
    assert result["rows"] == expected["rows"]
