"""Stepwise backpressure on a live run: a task buffering past the overload slows its
direct upstream, and once it stays underloaded the upstream is restored to full speed.

A driver that did not report task speeds back to the balancer once slowed the source and
never restored it (the balancer saw every task at full speed, never in backpressure).
"""

from __future__ import annotations

import pytest

from orchestrator.ledger.results import summary
from orchestrator.models import Event
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_slowed_source_is_restored_to_full_speed_and_the_result_is_exact(workers) -> None:
    # Given slow branches, and an output slower still, so that the run goes on while the
    # branches' pools empty
    doc = skewed_reference(slow_mbps=3.0)
    for node in doc["nodes"]:
        if node["kind"] == "sink":
            node["max_rate_mbps"] = 2.0
    values = policy(
        migration="off",
        throttling="stepwise",
        overload_mb=0.25,
        underload_kb=64,
        sensitivity_ms=400,
    )
    run = wait_until_done(start(doc, values, generator="seed=5,volume_mb=2,dominance=0.6"))
    assert run.status == "completed", run.error
    speeds = [
        e.data
        for e in Event.objects.filter(run=run, kind="set_speed", node="source").order_by(
            "time", "id"
        )
    ]
    # Then the source was slowed...
    assert any(s["speed"] < 1.0 and s["in_backpressure"] for s in speeds), speeds
    # ...and restored: back at its origin speed, out of backpressure
    restored = [s for s in speeds if s["speed"] == 1.0 and not s["in_backpressure"]]
    assert restored, speeds
    # ...and the result is exactly the plain Spark job's over the same input
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    assert result["coverage"] == "exact"
    assert result["rows"] == expected["rows"]
