"""Pipelines that never end: a landing folder and a Redis stream, fed by the producer at
a bursty rate while a Spark worker and the driver's worker are killed, then stopped.
Each run equals the plain Spark job over exactly what it took in, merged exactly once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run, Segment, SourceFile
from orchestrator.pipeline.producer import FolderTarget, StreamTarget, Target, produce
from orchestrator.run.lifecycle import set_status, snapshot
from orchestrator.run.snapshot import source_view
from orchestrator.source.replay import write_ingested
from orchestrator.source.spec import LandingSpec, StreamSpec
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    policy,
    skewed_reference,
    start,
    stepwise_slowed,
    stop_once_caught_up,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

BRANCHES = ("task1", "task2", "task3")
RATE = 256 * 1024  # bytes/s on average; bursts of 4x


class Producer(threading.Thread):
    """``manage.py produce`` in a thread: records keep arriving while the run goes on."""

    def __init__(self, target: Target, *, seconds: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.target, self.seconds, self.seed = target, seconds, seed
        self.stopped = threading.Event()

    def run(self) -> None:
        produce(
            self.target,
            rate_bps=RATE,
            pattern="bursty",
            duration_s=self.seconds,
            seed=self.seed,
            file_bytes=64 * 1024,
            stop=self.stopped,
            branches=BRANCHES,
        )


@pytest.fixture
def victims(workers: Any) -> Iterator[list[str]]:
    """Workers a test killed, started again whatever its outcome: the tests after it
    need their drivers."""
    killed: list[str] = []
    yield killed
    for name in killed:
        workers.start(name)
    if killed:
        workers.wait_ready(killed)


@pytest.fixture
def producing() -> Iterator[list[Producer]]:
    started: list[Producer] = []
    yield started
    for producer in started:
        producer.stopped.set()
        producer.join(timeout=10)


def _kill_a_spark_child_and_the_driver(
    run: Run, workers: Any, services: Any, victims: list[str]
) -> None:
    deadline = time.monotonic() + 120
    while not Segment.objects.filter(run=run, state="claimed").exists():
        assert time.monotonic() < deadline, "no batch was ever claimed"
        time.sleep(0.05)
    for child in psutil.Process(workers.processes["spark1"].pid).children(recursive=False):
        child.send_signal(signal.SIGKILL)
    with ControlPlane.connect(services.zk_hosts) as control:
        holder = control.driver_holder(str(run.pk))
    assert holder, "the run has a driver"
    pid = int(holder.split(":")[1])
    victims.append(next(name for name, p in workers.processes.items() if p.pid == pid))
    os.kill(pid, signal.SIGKILL)


def _driver_gone(run: Run, services: Any, timeout_s: float = 30) -> Run:
    """The run's driver has let go of it: whatever it does after completing is done."""
    deadline = time.monotonic() + timeout_s
    with ControlPlane.connect(services.zk_hosts) as control:
        while control.driver_holder(str(run.pk)) is not None:
            assert time.monotonic() < deadline, "the driver of a finished run holds on"
            time.sleep(0.2)
    run.refresh_from_db()
    return run


def _coalesces(run: Run, timeout_s: float = 60) -> None:
    """While the run goes on, its merged chunks' rows coalesce into its merged prefix.
    (Checked before the stop: a chunk merged in the run's last second is still recent
    when it ends, and its rows stay, so a short run may end with nothing coalesced.)"""
    deadline = time.monotonic() + timeout_s
    while int((Run.objects.get(pk=run.pk).merged_prefix or {}).get("chunk", 0)) == 0:
        first = Segment.objects.filter(run=run, chunk=0).values_list("state", flat=True)
        assert time.monotonic() < deadline, f"no merged chunk coalesced; chunk 0: {list(first)}"
        time.sleep(0.5)


def _takes_every_file(
    run: Run, producer: Producer, folders: list[Path], before: int = 0, timeout_s: float = 120
) -> list[str]:
    """Wait for the producer to finish and the run to take in each of its files (but the
    ``before`` an earlier run took): a landing folder's lag counts only the files it has
    listed, so a file written after its last listing is not in it yet. The files' names."""
    producer.join(timeout=timeout_s)
    produced = sorted(p.name for folder in folders for p in folder.glob("part-*"))
    deadline = time.monotonic() + timeout_s
    while SourceFile.objects.filter(run=run).count() < len(produced) - before:
        assert time.monotonic() < deadline, "the run did not take every produced file in"
        time.sleep(0.2)
    return produced


def _assert_equals_the_plain_job(run: Run, doc: Any, tmp_path: Path) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    taken = tmp_path / "ingested.jsonl"
    write_ingested(run, taken)
    expected = batch_summary(topology=doc, input_path=str(taken), generator=None)
    assert result["rows"] == expected["rows"]
    assert result["malformed_records"] == expected["malformed_records"]
    return result


def test_a_landing_folder_run_survives_kills_and_equals_the_plain_job(
    workers, services, producing, victims, tmp_path
) -> None:
    # Given a landing folder the producer keeps writing files into, at a bursty rate
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    producer = Producer(FolderTarget(landing), seconds=10, seed=3)
    producing.append(producer)
    producer.start()
    doc = skewed_reference()
    spec = LandingSpec(str(landing), "*.jsonl", stable_s=0.2, clean="archive", archive=str(archive))
    run = start(doc, policy(), source=spec)
    # When a Spark worker process and the driver's worker are killed mid-run
    _kill_a_spark_child_and_the_driver(run, workers, services, victims)
    # ...and the run is stopped once the producer is done and the folder is read
    produced = _takes_every_file(run, producer, [landing, archive])
    _coalesces(run)
    run = stop_once_caught_up(run, producer)
    # Then it took every file in once, in arrival order, and equals the plain job
    _assert_equals_the_plain_job(run, doc, tmp_path)
    files = list(SourceFile.objects.filter(run=run).order_by("index"))
    assert sorted(Path(f.path).name for f in files) == produced
    assert [Path(f.path).name for f in files] == sorted(Path(f.path).name for f in files)
    assert Event.objects.filter(run=run, kind="driver").count() >= 2, "a new driver took over"
    # ...and the merged files were moved to the archive folder, and the segment files of
    # merged data deleted
    run = _driver_gone(run, services)
    assert any(archive.glob("part-*")), "merged files are archived"
    segments = Path(workers.env["BPCONSOLE_DATA_DIR"], "runs", str(run.pk), "segments")
    assert not [f for f in segments.rglob("*") if f.is_file()], "no segment file is left"
    assert source_view(run, None)["exact_up_to"] != "nothing merged yet"


def test_a_redis_stream_run_survives_a_killed_driver_and_equals_the_plain_job(
    workers, services, producing, victims, tmp_path
) -> None:
    # Given a Redis stream the producer keeps adding entries to
    stream = f"test-orders-{uuid.uuid4().hex[:8]}"
    producer = Producer(StreamTarget(services.redis_url, stream), seconds=10, seed=4)
    producing.append(producer)
    producer.start()
    doc = skewed_reference()
    run = start(doc, policy(), source=StreamSpec(stream, linger_s=0.2))
    # When a Spark worker process and the driver's worker are killed mid-run
    _kill_a_spark_child_and_the_driver(run, workers, services, victims)
    run = stop_once_caught_up(run, producer)
    # Then every entry it took in was merged once and acknowledged
    result = _assert_equals_the_plain_job(run, doc, tmp_path)
    assert result["rows"], "records were aggregated"
    import redis

    client = redis.Redis.from_url(services.redis_url)
    (key,) = StreamSpec(stream).streams
    pending = client.xpending(key, f"bpconsole.run.{run.pk}")
    assert pending["pending"] == 0, "every entry in the ledger is acknowledged"
    assert run.source_position["offset"] == client.xlen(key), "it took in the whole stream"


@pytest.mark.parametrize("clean", ["archive", "keep"])
def test_a_stopped_landing_run_and_the_next_one_take_every_file_once(
    workers, services, producing, tmp_path, clean
) -> None:
    # Given a folder the producer keeps writing into, read by a run that archives, or
    # that keeps the files and names a checkpoint (the folder then says nothing)
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    producer = Producer(FolderTarget(landing), seconds=12, seed=5)
    producing.append(producer)
    producer.start()
    doc = skewed_reference()
    if clean == "archive":
        spec = LandingSpec(str(landing), stable_s=0.2, clean="archive", archive=str(archive))
    else:
        spec = LandingSpec(str(landing), stable_s=0.2, checkpoint=f"c-{uuid.uuid4().hex[:8]}")
    first = start(doc, policy(), source=spec)
    # When it is stopped while data keeps arriving, and a new run starts over the folder
    deadline = time.monotonic() + 60
    while SourceFile.objects.filter(run=first).count() < 3:
        assert time.monotonic() < deadline, "the first run took no files"
        time.sleep(0.2)
    set_status(first.pk, "stopping", reason="test: stop mid-stream")
    first = _driver_gone(wait_until_done(first), services)
    second = start(doc, policy(), source=spec)
    before = SourceFile.objects.filter(run=first).count()
    _takes_every_file(second, producer, [landing, archive], before)
    second = stop_once_caught_up(second, producer, needs_takeover=False)
    second = _driver_gone(second, services)
    # Then each equals the plain job over what it took in, and together they took every
    # produced file exactly once, in order: nothing lost, nothing read twice
    taken = b""
    for index, run in enumerate((first, second)):
        _assert_equals_the_plain_job(run, doc, tmp_path / f"run{index}")
        taken += (tmp_path / f"run{index}" / "ingested.jsonl").read_bytes()
    if clean == "archive":
        assert not list(landing.glob("part-*")), "every file was taken and archived"
    produced = b"".join(
        p.read_bytes() for p in sorted((archive if clean == "archive" else landing).glob("part-*"))
    )
    assert taken == produced


def test_backpressure_on_a_landing_folder_keeps_the_backlog_in_the_folder(
    workers, services, tmp_path
) -> None:
    # Given 3 MB of files already landed, and branches and an output far slower
    source = landed_at_once(tmp_path / "landing", mb=3, seed=9, file_kb=64)
    doc, values = stepwise_slowed(output_mbps=4.0)
    run = start(doc, values, source=source)
    # When the slow branches fill up, the balancer slows the source: what it takes in
    deadline = time.monotonic() + 90
    while not Event.objects.filter(
        run=run, kind="set_speed", node="source", data__in_backpressure=True
    ).exists():
        assert time.monotonic() < deadline, "the source was never slowed"
        time.sleep(0.2)
    # Then the backlog waits in the folder, not in the run: files not read into the
    # ledger yet, and the ledger holding only what the pools and the read-ahead allow
    lags = []
    for _ in range(6):
        lag = snapshot(run.pk)["source"]["lag"]
        if lag is not None:
            lags.append(lag)
        time.sleep(0.5)
    assert any(lag["entries"] > 0 and lag["bytes"] > 0 for lag in lags), lags
    # ...and once stopped the run equals the plain job over what it took in
    set_status(run.pk, "stopping", reason="test: backlog seen")
    run = wait_until_done(run, timeout_s=180)
    _assert_equals_the_plain_job(run, doc, tmp_path / "check")
