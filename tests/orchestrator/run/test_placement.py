"""Placed mode on the real stack, every emulation knob at 0: each operator instance gets
a Spark worker of its own, its batches run there, the driver measures each instance's
capacity from its batches and shows where it runs and how busy that kept it; a keyed
stage whose instance holds a hot key group gets its key groups moved by the balancer;
and each result equals the plain Spark job."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.db.models import Sum

from balancer.document import PipelineDocument, emulated
from orchestrator.ledger import busy, keystate
from orchestrator.ledger.groups import digest
from orchestrator.ledger.results import summary
from orchestrator.models import Adjustment, Event, Instance, Segment
from orchestrator.pipeline.producer import FolderTarget, produce
from orchestrator.rescale.plan import key_groups
from orchestrator.run.lifecycle import set_status
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from sparkjobs.keygroups import KEY_SLOTS, slot_of
from tests.orchestrator.run.scenarios import (
    TOPOLOGIES,
    landed_at_once,
    plain_rows_over_intake,
    policy,
    start,
    two_branches,
    unemulated_reference,
    wait_for_spark_workers,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

TASKS = ("task1", "task2", "task3")


def _states(run_id: int) -> dict[str, dict[str, Any]]:
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        return control.read_states(str(run_id))


@pytest.fixture(scope="module")
def two_spark_workers(workers) -> Iterator[list[str]]:
    """spark1 and a second Spark worker, spark7, both live; spark7 stops afterwards."""
    second = workers.start("spark7")
    try:
        workers.wait_ready(["spark7"])
        yield wait_for_spark_workers("spark1", "spark7")
    finally:
        if second.poll() is None:
            second.terminate()
            second.wait(30)
        workers.processes.pop("spark7", None)


def test_placed_instances_run_on_workers_of_their_own_and_their_capacity_is_measured(
    two_spark_workers: list[str],
) -> None:
    # Given two Spark workers and an unemulated pipeline in placed mode
    names = two_spark_workers
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
    placement = dict(Instance.objects.filter(run=run, name__in=TASKS).values_list("name", "worker"))
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
    # and the records each task's batches counted are every record of the input once,
    # good or malformed: what its capacity in records per second is made of
    counted = Segment.objects.filter(run=run, node__in=TASKS).aggregate(n=Sum("records"))["n"]
    good = sum(row["count"] for row in expected["rows"])
    assert counted == good + expected["malformed_records"] > 0
    # and the sink's batches counted the partial rows they merged, at least one per key
    # of the result, so the sink has a measured capacity in records per second too
    sink = next(n["name"] for n in doc["nodes"] if n["kind"] == "sink")
    merged = Segment.objects.filter(run=run, node=sink).aggregate(n=Sum("records"))["n"]
    assert merged >= len(expected["rows"]) > 0
    sink_batches = [b for b in batches if sink in b.nodes]
    assert sink_batches, "no sink batch in the ledger"
    assert sum(b.records for b in sink_batches) == merged and measured.get(sink, 0) > 0


def _told(run_id: int) -> list[str]:
    """The run's last events, for a failure's message."""
    return [
        f"{e.kind}: {e.reason}"
        for e in Event.objects.filter(run_id=run_id).exclude(kind="set_rate").order_by("-pk")[:25]
    ]


# Key groups are contiguous slot ranges: a move isolates a hot slot near either end of
# the slot space from its instance's other keys (with two instances; with more, one in
# the middle too). HOT_KEY's slot is 1.
HOT_KEY = "hot8"


def hot_key_input(path: Path, records: int, hot_share: float, seed: int) -> Path:
    """JSON lines over 300 keys, one of which (HOT_KEY) takes ``hot_share`` of them."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(records):
            key = HOT_KEY if rng.random() < hot_share else f"k{rng.randrange(300)}"
            value = rng.randrange(1, 100_000) / 100
            out.write(json.dumps({"key": key, "value": value, "user": f"u{i % 997}"}) + "\n")
    return path


def unemulated_running_totals() -> PipelineDocument:
    """The keyed running-totals pipeline, no knob anywhere, small segments and pools."""
    doc: PipelineDocument = yaml.safe_load((TOPOLOGIES / "running-totals.yaml").read_text())
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": 0.25}
        elif node["kind"] == "operator":
            node["buffer_mb"] = 1
    assert not emulated(doc)
    return doc


def test_a_hot_key_group_moves_by_itself_between_placed_instances_and_the_result_is_exact(
    two_spark_workers: list[str], tmp_path: Path
) -> None:
    # Given the keyed stage's two instances on workers of their own and an input whose
    # one key takes 40% of the records: the instance owning its slot takes 70% of them
    doc = unemulated_running_totals()
    path = hot_key_input(tmp_path / "hot.jsonl", 600_000, 0.4, seed=5)
    run = start(
        doc,
        policy(placement="placed", routing="static", migration="off", key_moves="auto"),
        input_path=str(path),
    )
    # When it runs, the balancer moves key groups by itself, once
    deadline = time.monotonic() + 180
    while not Adjustment.objects.filter(run=run, kind="key_move").exclude(status="running"):
        run.refresh_from_db()
        assert run.is_active and time.monotonic() < deadline, (
            f"no key-group move happened; run {run.status}: {_told(run.pk)}"
        )
        time.sleep(0.2)
    move = Adjustment.objects.get(run=run, kind="key_move")
    assert move.status == "complete", move.outcome
    assert move.outcome["state"]["totals"]["identical"] is True
    # from totals1, which held HOT_KEY and 70% of the records, to totals2
    decided = Event.objects.get(run=run, kind="move_key_groups")
    assert decided.actor == "balancer", decided
    assert decided.reason.startswith("totals1 is backpressured holding"), decided.reason
    before, after = decided.data["shares_before"], decided.data["shares_after"]
    assert before["totals1"] > 0.6 and max(after.values()) < before["totals1"] * 0.8, decided.data
    groups = key_groups(move.after, "totals")
    assert slot_of(HOT_KEY) in groups["totals1"].slots
    assert groups["totals1"].high < KEY_SLOTS // 2 and groups["totals2"].high == KEY_SLOTS
    run = wait_until_done(run, timeout_s=300)
    # Then it moved them once, the result equals the plain Spark job's, and every key's
    # state is held once, by the owner of its slot in the moved key groups
    assert Adjustment.objects.filter(run=run, kind="key_move").count() == 1, [
        (e.data["groups"], e.data["shares_before"])
        for e in Event.objects.filter(run=run, kind="move_key_groups")
    ]
    result = summary(run)
    assert result["coverage"] == "exact", result["error"]
    expected = batch_summary(topology=doc, input_path=str(path), generator=None)
    assert result["rows"] == expected["rows"]
    # (A key's state is kept by its group's digest: its slot is its key's.)
    slots = {digest([r["key"]]): slot_of(str(r["key"])) for r in expected["rows"]}
    held = keystate.holders(run.pk, "totals")
    assert held.keys() == {keystate.StateKey(d) for d in slots}, "a key's state is missing"
    for state, holders in held.items():
        assert len(holders) == 1 and slots[state.key] in groups[holders[0]].slots


def test_a_stream_outgrowing_its_measured_capacity_asks_for_instances_sized_by_measurement(
    two_spark_workers: list[str], tmp_path: Path
) -> None:
    # Given two placed branches on two workers, and a landing folder that keeps receiving
    # more than they take in (the backlog is to be drained within a second)
    doc = two_branches()
    source = landed_at_once(tmp_path / "landing", mb=8, seed=5, file_kb=256)
    values = policy(
        placement="placed",
        throttling="credit",
        scale_out="measured",
        scale_out_ticks=2,
        scale_out_horizon_s=1,
    )
    run = start(doc, values, source=source)
    arriving = threading.Event()
    producer = threading.Thread(
        target=produce,
        kwargs={
            "target": FolderTarget(Path(source.folder)),
            "rate_bps": 16 * 1024 * 1024,
            "pattern": "skewed",
            "duration_s": 150,
            "max_bytes": 256 * 1024 * 1024,
            "seed": 6,
            "file_bytes": 256 * 1024,
            "stop": arriving,
            "branches": ("task1", "task2", "task3"),
        },
        name="landing",
    )
    producer.start()
    try:
        # When the balancer has measured both branches' capacities and the source's load
        request = wait_for(
            "a scale-out request",
            lambda: Event.objects.filter(run=run, kind="scale_out_request").first(),
            timeout_s=150,
            detail=lambda: f"the run's events: {_told(run.pk)}",
        )
    finally:
        arriving.set()
        producer.join(30)
    assert not producer.is_alive(), "the producer did not stop"
    # Then it asks for the instances the measured rates need, in one request
    assert request.actor == "balancer" and request.node == "source"
    assert request.data["stage"] == "agg"
    assert request.data["target_bps"] > request.data["capacity_bps"] > 0, request.data
    assert request.data["instances"] >= 1
    assert "overloaded 2 ticks in a row: stage agg: needs" in request.reason
    # and the request is carried out or refused with why (both workers run the stage,
    # so they must come from an elastic pool), never silently dropped
    wait_for(
        "the request carried out or refused",
        lambda: Event.objects.filter(
            run=run, kind__in=("worker_asked", "adjust_refused"), node="agg"
        ).exists(),
        timeout_s=60,
        detail=lambda: f"the run's events: {_told(run.pk)}",
    )
    # and, stopped, the run equals the plain Spark job over what it took in
    set_status(run.pk, "stopping", reason="test: the scale-out was requested")
    run = wait_until_done(run, timeout_s=180)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["rows"] == plain_rows_over_intake(run, doc, tmp_path)
