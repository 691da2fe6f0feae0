"""A continuous, skewed run of the demo's shape whose driver dies and is taken over: the
new driver routes by its own balancer's decisions, never by migrations the dead one had
left in force, so the branches the hot one starved take data again; and the run equals
the plain Spark job over what it took in."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from balancer.document import PipelineDocument
from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run, Segment
from orchestrator.pipeline.producer import FolderTarget, produce
from orchestrator.source.replay import write_ingested
from orchestrator.source.spec import LandingSpec
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import (
    SEGMENT_MB,
    TOPOLOGIES,
    driver_pid,
    policy,
    start,
    stop_once_caught_up,
    wait_started,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

BRANCHES = ("task1", "task2", "task3")
IDLE = ("task2", "task3")
# Segments (64 KB) each idle branch must process of what the new driver sends: a fair
# part of it, against the trickle a branch gets through a peer's migration.
TAKEN = 10
# What a dead driver may leave for the source: the shares the demo's run page showed
# after restarts, and the hot branch's peers migrated into it, the full node (the page
# showed task2 -> task1).
LEFT_BEHIND = {
    "shares": {"task1": 0.05, "task2": 0.46, "task3": 0.49},
    "migrations": {"task2": {"task1": 1.0}, "task3": {"task1": 1.0}},
}


def demo_shape() -> PipelineDocument:
    """The landing demo (three aggregating branches behind 8 Mb/s links, 1 MB pools),
    with smaller segments so a few MB make many."""
    doc: PipelineDocument = copy.deepcopy(
        yaml.safe_load((TOPOLOGIES / "landing-demo.yaml").read_text())
    )
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": SEGMENT_MB}
    return doc


class Producer(threading.Thread):
    """The demo's producer (bursty, one hot key) writing into the folder until it is
    stopped, 12 MB at most."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.stopped = threading.Event()

    def run(self) -> None:
        produce(
            FolderTarget(self.folder),
            rate_bps=512 * 1024,
            pattern="bursty-skewed",
            duration_s=None,
            max_bytes=12 * 1024 * 1024,
            seed=21,
            file_bytes=64 * 1024,
            stop=self.stopped,
            branches=BRANCHES,
        )


@pytest.fixture
def victims(workers: Any) -> Iterator[list[str]]:
    """Workers the test killed, started again whatever its outcome."""
    killed: list[str] = []
    yield killed
    for name in killed:
        workers.start(name)
    if killed:
        workers.wait_ready(killed)


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Producer]:
    landing = tmp_path / "landing"
    landing.mkdir()
    started = Producer(landing)
    started.start()
    yield started
    started.stopped.set()
    started.join(timeout=10)


def _kill_the_driver_leaving(
    run: Run, routes: dict[str, Any], workers: Any, services: Any, victims: list[str]
) -> None:
    """Freeze the control worker driving ``run``, write ``routes`` as the source's last
    table in its epoch (what it had in force when it died), then kill it."""
    deadline = time.monotonic() + 60
    pid = driver_pid(run, services)
    while pid is None:
        assert time.monotonic() < deadline, "the run never had a driver"
        time.sleep(0.1)
        pid = driver_pid(run, services)
    victims.append(next(name for name, p in workers.processes.items() if p.pid == pid))
    os.kill(pid, signal.SIGSTOP)
    try:
        epoch = Run.objects.get(pk=run.pk).epoch
        with ControlPlane.connect(services.zk_hosts) as control:
            control.write_routes(str(run.pk), "source", routes, epoch)
    finally:
        os.kill(pid, signal.SIGKILL)


def _taken_over(run: Run, timeout_s: float = 60) -> int:
    """The epoch of the driver that took the run over from the killed one."""
    deadline = time.monotonic() + timeout_s
    while Event.objects.filter(run=run, kind="driver").count() < 2:
        assert time.monotonic() < deadline, f"no driver took over within {timeout_s} s"
        time.sleep(0.2)
    return int(Run.objects.get(pk=run.pk).epoch)


def _done_after(run: Run, epoch: int) -> dict[str, int]:
    """Segments the source sent to each branch from ``epoch`` on, processed."""
    done = Segment.objects.filter(
        run=run, upstream="source", epoch__gte=epoch, state="done", marker=False
    )
    return {node: done.filter(node=node).count() for node in BRANCHES}


def _recent(run: Run, count: int = 12) -> str:
    """The run's last events, for a failure's message."""
    events = Event.objects.filter(run=run).order_by("-time", "-id")[:count]
    return "".join(f"\n  {e.time:%H:%M:%S.%f} {e.kind} {e.node} {e.reason[:160]}" for e in events)


def _routes(run: Run, services: Any) -> Any:
    with ControlPlane.connect(services.zk_hosts) as control:
        return control.read_routes(str(run.pk), "source")


def test_after_a_restart_the_idle_branches_take_data_and_the_run_equals_the_plain_job(
    workers, services, victims, producer, tmp_path
) -> None:
    # Given the demo's shape over a landing folder the skewed producer writes into
    doc = demo_shape()
    spec = LandingSpec(str(producer.folder), "*.jsonl", stable_s=0.2)
    run = start(doc, policy(routing="water_level"), source=spec)
    wait_started(run)
    # When its driver dies with the hot branch's peers migrated into it, and another
    # driver takes the run over
    _kill_the_driver_leaving(run, LEFT_BEHIND, workers, services, victims)
    epoch = _taken_over(run)
    # Then the idle branches take their part of the data the new driver sends
    deadline = time.monotonic() + 45
    done = _done_after(run, epoch)
    while not all(done[node] >= TAKEN for node in IDLE):
        assert time.monotonic() < deadline, (
            f"after the takeover (epoch {epoch}) the branches processed {done} segments, "
            f"not {TAKEN} each on {', '.join(IDLE)}; the source's routes: "
            f"{_routes(run, services)}; its last events:{_recent(run)}"
        )
        time.sleep(0.3)
        done = _done_after(run, epoch)
    # ...and the run, stopped once it has taken in what was produced, equals the plain
    # Spark job over exactly that
    producer.stopped.set()
    run = stop_once_caught_up(run, producer, needs_takeover=False)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    taken = tmp_path / "ingested.jsonl"
    write_ingested(run, taken)
    expected = batch_summary(topology=doc, input_path=str(taken), generator=None)
    assert result["rows"] == expected["rows"]
    assert result["malformed_records"] == expected["malformed_records"]
