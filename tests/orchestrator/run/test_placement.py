"""Placed mode on the real stack, every emulation knob at 0: each operator instance gets
a Spark worker of its own, its batches run there, the driver measures each instance's
capacity from its batches and shows where it runs and how busy that kept it, and the
result equals the plain Spark job."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import yaml
from django.conf import settings

from balancer.document import PipelineDocument, emulated
from orchestrator.ledger import busy
from orchestrator.ledger.results import summary
from orchestrator.models import Event, Instance, Segment
from orchestrator.run.lifecycle import live_workers
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import REFERENCE, policy, start, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

TASKS = ("task1", "task2", "task3")


def unemulated_reference() -> PipelineDocument:
    """The reference pipeline with no link bandwidth and no node rate anywhere."""
    doc: PipelineDocument = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
        if node["kind"] == "operator":
            node["buffer_mb"] = 4
    for edge in doc["edges"]:
        edge["bandwidth_mbps"] = 0
    assert not emulated(doc)
    return doc


def _wait_for_spark_workers(*prefixes: str) -> list[str]:
    """The live Spark workers once they are exactly those named ``prefixes``: a worker
    an earlier test killed stays registered until ZooKeeper expires its session."""
    deadline = time.monotonic() + 90
    names: list[str] = []
    while time.monotonic() < deadline:
        names = sorted(live_workers())
        if len(names) == len(prefixes) and all(
            any(n.startswith(f"{p}-") for n in names) for p in prefixes
        ):
            return names
        time.sleep(0.2)
    raise AssertionError(f"the live Spark workers are {names}, not {list(prefixes)}")


def _states(run_id: int) -> dict[str, dict[str, Any]]:
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        return control.read_states(str(run_id))


def test_placed_instances_run_on_workers_of_their_own_and_their_capacity_is_measured(
    workers,
) -> None:
    # Given two Spark workers and an unemulated pipeline in placed mode
    second = workers.start("spark7")
    try:
        workers.wait_ready(["spark7"])
        names = _wait_for_spark_workers("spark1", "spark7")
        doc = unemulated_reference()
        run = start(
            doc,
            policy(placement="placed", routing="water_level", migration="proportional"),
            generator="seed=7,volume_mb=32,dominance=0.6,skew_mean_s=1000",
        )
        # When it runs, each task is placed on a live worker, the stage spread over both
        deadline = time.monotonic() + 120
        while not Event.objects.filter(run=run, kind="placed").exists():
            assert time.monotonic() < deadline, "the driver placed no instance"
            time.sleep(0.2)
        placement = dict(
            Instance.objects.filter(run=run, name__in=TASKS).values_list("name", "worker")
        )
        assert set(placement) == set(TASKS)
        assert set(placement.values()) <= set(names)
        assert len(set(placement.values())) == 2, placement
        # and each task's node shows the worker it runs on
        seen: dict[str, dict[str, Any]] = {}
        while {t: seen.get(t, {}).get("resource") for t in TASKS} != placement:
            assert time.monotonic() < deadline, f"the nodes do not show {placement}: {seen}"
            seen = _states(run.pk)
            time.sleep(0.3)
        run = wait_until_done(run, timeout_s=300)
        # Then each task's capacity was measured from its batches, and every batch of a
        # task ran where it was placed: none took a sibling's data (each ran one node)
        measured = busy.measured_capacities(run)
        assert all(measured.get(t, 0) > 0 for t in TASKS), measured
        batches = busy.completed_since(run.pk, None).batches
        task_batches = [b for b in batches if set(b.nodes) & set(TASKS)]
        assert task_batches, "no task batch in the ledger"
        assert all(len(b.nodes) == 1 for b in task_batches)
        assert Segment.objects.filter(run=run, node__in=TASKS, state="done").exists()
        # and the result equals the plain Spark job's over the same input
        result = summary(run)
        assert result["coverage"] == "exact", result["error"]
        expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
        assert result["rows"] == expected["rows"]
    finally:
        if second.poll() is None:
            second.terminate()
            second.wait(30)
        workers.processes.pop("spark7", None)
