"""The chaos suite's workload: runs one after the other in lanes (threads), each run
judged against the plain Spark batch job once it has ended.

- a **bounded** lane: a generated input (``--generator``) through the reference pipeline;
- a **continuous** lane: a landing folder fed by the producer in a thread for a while
  (bench_unbounded.py's ``Source`` and ``Producer``), then stopped as an operator stops
  it (``stopping``), its merged files archived; the plain job reads the archive folder.

Each run's verdict: ended ``completed`` within the timeout with no one's help (the lane
never resumes, retries or repairs a run: it only cancels one that outlived the timeout,
and that run counts as not completed), exact (rows, coverage and malformed records equal
the plain job's), and per key the records lost (the plain job counts more) and
duplicated (the run counts more).

Every call to the stack goes through :func:`durable`: the faults take PostgreSQL and Redis
away for seconds, and the lane, like a user's client, tries again rather than give up.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench_unbounded import Producer, Source, reference_unthrottled
from bench_unbounded import policy as throughput_policy

from balancer.document import PipelineDocument

MB = 2**20
T = TypeVar("T")
_batch_job = threading.Lock()  # one plain job at a time in this process's SparkSession


def pipeline(segment_mb: float) -> PipelineDocument:
    """The reference topology, unthrottled, with small segments: a few MB make many
    batches and merges, so progress (and its absence) shows within a second or two."""
    doc = copy.deepcopy(reference_unthrottled())
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**(node.get("params") or {}), "segment_mb": segment_mb}
    doc["name"] = "chaos-reference"
    return doc


def durable(call: Callable[[], T], what: str, timeout_s: float = 180.0) -> T:
    """``call()``, again after any error until ``timeout_s``: the database or Redis may be
    down for a fault's while. A broken database connection is closed so the next try
    opens a new one."""
    from django.db import connection

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception:  # noqa: BLE001 - any outage; re-raised after the timeout
            with contextlib.suppress(Exception):
                connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: still failing after {timeout_s:.0f} s") from None
            time.sleep(0.5)


@dataclass
class Outcome:
    """One run's verdict."""

    run: int
    mode: str  # "bounded" or "continuous"
    status: str
    completed: bool  # ended completed within the timeout, no one helping
    exact: bool
    lost: int  # records the plain job counts and the run does not (sum over keys)
    duplicated: int  # records the run counts beyond the plain job's (sum over keys)
    keys: int
    input_mb: float
    seconds: float
    coverage: Any
    error: str | None = None
    timed_out: bool = False  # cancelled by the lane after the timeout
    started_at: float = 0.0  # seconds from the session's start
    ended_at: float = 0.0


def key_differences(
    run_rows: list[dict[str, Any]], job_rows: list[dict[str, Any]]
) -> tuple[int, int]:
    """Lost and duplicated records: per key, the plain job's count minus the run's (when
    positive, lost) and the run's minus the plain job's (when positive, duplicated)."""
    ran = {str(r["key"]): int(r["count"]) for r in run_rows}
    job = {str(r["key"]): int(r["count"]) for r in job_rows}
    lost = sum(max(0, n - ran.get(k, 0)) for k, n in job.items())
    duplicated = sum(max(0, n - job.get(k, 0)) for k, n in ran.items())
    return lost, duplicated


def _batch(doc: PipelineDocument, input_path: str | list[str]) -> dict[str, Any]:
    from orchestrator.worker.plain_job import batch_summary

    with _batch_job:
        return batch_summary(topology=doc, input_path=input_path, generator=None)


def _verdict(
    run: Any, mode: str, doc: PipelineDocument, job: dict[str, Any], *, whole: bool, began: float
) -> Outcome:
    from orchestrator.ledger.results import summary

    result = durable(lambda: summary(run), f"run {run.pk}'s summary")
    lost, duplicated = key_differences(result["rows"], job["rows"])
    completed = result["status"] == "completed"
    return Outcome(
        run=run.pk,
        mode=mode,
        status=result["status"],
        completed=completed,
        exact=completed
        and whole
        and result["coverage"] == "exact"
        and result["rows"] == job["rows"]
        and result["malformed_records"] == job["malformed_records"],
        lost=lost,
        duplicated=duplicated,
        keys=len(result["rows"]),
        input_mb=round(int(run.input_bytes) / MB, 2),
        seconds=round(time.monotonic() - began, 1),
        coverage=result["coverage"],
        error=result["error"],
    )


def _wait_end(run: Any, timeout_s: float) -> bool:
    """Wait until the run has ended; False (and the run cancelled, so the lane can go
    on) when it has not within ``timeout_s``."""
    from orchestrator.run.lifecycle import set_status

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        durable(run.refresh_from_db, f"run {run.pk}")
        if not run.is_active:
            return True
        time.sleep(0.5)
    with contextlib.suppress(Exception):
        durable(
            lambda: set_status(run.pk, "cancelled", reason="chaos: not ended in time"),
            f"cancelling run {run.pk}",
            timeout_s=30,
        )
    durable(run.refresh_from_db, f"run {run.pk}")
    return False


def _wait_started(run: Any, timeout_s: float) -> bool:
    """Wait until the run has left ``pending``; False when it has not within
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        durable(run.refresh_from_db, f"run {run.pk}")
        if run.status != "pending":
            return True
        time.sleep(0.5)
    return False


def _start(doc: PipelineDocument, **inputs: Any) -> Any:
    from orchestrator.run.lifecycle import create_run
    from orchestrator.tasks import start_run

    run = durable(
        lambda: create_run(topology=doc, policy=throughput_policy(), **inputs), "creating a run"
    )
    durable(lambda: start_run(run), f"starting run {run.pk}")
    return run


def bounded_run(doc: PipelineDocument, *, seed: int, mb: float, timeout_s: float) -> Outcome:
    began = time.monotonic()
    run = _start(doc, generator=f"seed={seed},volume_mb={mb:g},dominance=0")
    in_time = _wait_end(run, timeout_s)
    paths = (run.input_spec or {}).get("paths")
    if not paths:  # the input was never written: nothing to compare with
        return Outcome(
            run=run.pk,
            mode="bounded",
            status=run.status,
            completed=False,
            exact=False,
            lost=0,
            duplicated=0,
            keys=0,
            input_mb=0.0,
            seconds=round(time.monotonic() - began, 1),
            coverage=None,
            error=run.error or "the generated input was never written",
        )
    job = _batch(doc, paths)
    outcome = _verdict(run, "bounded", doc, job, whole=True, began=began)
    outcome.completed, outcome.timed_out = outcome.completed and in_time, not in_time
    return outcome


def continuous_run(
    doc: PipelineDocument,
    folder: Path,
    *,
    name: str,
    seed: int,
    rate_mbps: float,
    feed_s: float,
    file_mb: float,
    timeout_s: float,
    stop: threading.Event,
) -> Outcome:
    """A landing-folder run fed for ``feed_s`` (less if ``stop`` is set), then stopped;
    ``timeout_s`` counts from the stop."""
    from orchestrator.run.lifecycle import RunError, set_status

    began = time.monotonic()
    source = Source.make(folder, name, stream=False)
    run = _start(doc, source=source.spec(0.0))
    try:
        producer = Producer(
            source.target(),
            rate_bps=rate_mbps * MB,
            seconds=feed_s,
            seed=seed,
            file_bytes=int(file_mb * MB),
        )
        producer.start()
        while producer.is_alive() and not stop.is_set():
            producer.join(0.5)
        producer.stop.set()
        producer.result()

        def stopping() -> None:
            # A run that already ended (failed) is judged as it is.
            with contextlib.suppress(RunError):
                set_status(run.pk, "stopping", reason="chaos: the producer is done")

        # A run whose start was lost with a process is still pending until the watchdog
        # gives it a driver; stopped then, it would be cancelled, having taken nothing
        # in. Its operator waits for it to run, and so does the lane.
        started = _wait_started(run, timeout_s)
        durable(stopping, f"stopping run {run.pk}")
        in_time = started and _wait_end(run, timeout_s)
        if source.archive is None:
            raise RuntimeError("a landing folder without its archive")
        files = sorted(source.archive.glob("*.jsonl"))
        emitted = int(run.input_bytes)
        archived = sum(f.stat().st_size for f in files)
        if files:
            job = _batch(doc, str(source.archive / "*.jsonl"))
        else:
            job = {"rows": [], "malformed_records": 0}
        # The archive must hold exactly the bytes the run emitted (bench_unbounded's
        # check): a file taken and never archived would escape the plain job too.
        outcome = _verdict(run, "continuous", doc, job, whole=archived == emitted, began=began)
        outcome.completed, outcome.timed_out = outcome.completed and in_time, not in_time
        if archived != emitted and outcome.error is None:
            outcome.error = f"emitted {emitted} bytes, archived {archived}"
        return outcome
    finally:
        source.remove()


class Lane(threading.Thread):
    """Runs of one mode one after the other until stopped; each one's outcome kept."""

    def __init__(
        self, mode: str, make: Callable[[int, threading.Event], Outcome], clock: Callable[[], float]
    ) -> None:
        super().__init__(name=f"chaos-{mode}", daemon=True)
        self.mode, self.make, self.clock = mode, make, clock
        self.stop = threading.Event()
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            number += 1
            began = self.clock()
            try:
                outcome = self.make(number, self.stop)
            except Exception as error:  # noqa: BLE001 - reported, and the lane goes on
                self.errors.append(f"{self.mode} run {number}: {error!r}")
                time.sleep(1.0)
                continue
            outcome.started_at, outcome.ended_at = round(began, 1), round(self.clock(), 1)
            self.outcomes.append(outcome)


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    return asdict(outcome)


def clear(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
