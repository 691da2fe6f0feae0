"""A Celery worker registers itself in ZooKeeper once ready: what it consumes (placement
picks Spark workers by it) and how many tasks it runs at once (the driver sends no more
of a stage's fusable batches than the Spark workers run). The session's real workers."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.zk.control_plane import ControlPlane

pytestmark = pytest.mark.integration


def test_each_worker_registers_its_queues_and_its_concurrency(services: Any, workers: Any) -> None:
    with ControlPlane.connect(services.zk_hosts) as control:
        registered = control.live_workers()
    by_name = {info["name"].split("@")[0]: info for info in registered.values()}
    spark, control1 = by_name["spark1"], by_name["control1"]
    # Its own queue too: where a hot rescale places an instance on it
    assert spark["queues"] == ["spark", f"{spark['name']}.dq2"]
    assert spark["concurrency"] == 1
    assert "control" in control1["queues"] and "spark" not in control1["queues"]
    assert control1["concurrency"] == 6
