"""Continuous runs (issue 17): how fast, how fresh and how steady an unbounded run is.

    .venv/bin/python bench/bench_unbounded.py sustained [--stream] [--start-mbps 1]
        [--step-s 40] [--bisect 2] [--json FILE]
    .venv/bin/python bench/bench_unbounded.py freshness [--stream] [--rate MBPS] [--seconds 60]
    .venv/bin/python bench/bench_unbounded.py soak [--stream] [--rate MBPS] [--minutes 30]

The pipeline is the published reference topology (webapp/console/topologies/reference.yaml:
source -> task1, task2, task3 -> output) unthrottled: its emulated link bandwidths are
removed (0 = unlimited) and no node has a rate limit; routed by water level, nothing
migrated or throttled (bench_runtime.py's throughput policy). The run reads a landing
folder (``LandingSpec``, merged files archived) or, with ``--stream``, a Redis stream
(``StreamSpec``) on the stack's own Redis, fed by the producer
(orchestrator/pipeline/producer.py, steady pattern, 1 MB part files) in a thread of this
process. The stack is bench_runtime.py's (embedded PostgreSQL, Redis, ZooKeeper; a
control worker, one Spark worker, beat) under ``var/bench-unbounded``, warmed up as
bench_runtime's throughput mode does (generated runs, each also through the plain job).

sustained: steps of ``--step-s`` at a rate that doubles from ``--start-mbps`` until a step
is not sustained, then ``--bisect`` bisections; one fresh run (and folder or stream) per
step. A step is sustained when, over its second half, the source's lag age (the live
snapshot's ``source.lag.age_s``) has p90 < ``--age-limit-s`` and does not grow (median of
the last quarter minus that of the third < 1 s), and when the oldest unmerged file in the
landing folder (merged files are archived out of it, so what is left is not merged yet)
does not grow either (for a stream: the oldest unfinished segment in the run). The lag
counts only what waits outside the run: data read into the ledger but waiting in the
pools (64 MB a node) is not in it, so the snapshot's lag alone misses a growing backlog. The highest
sustained rate (the producer's achieved rate) is compared with the bounded-input
throughput of the same pipeline in the same session: the same records (same seed, same
file size), as many bytes as that step's run took in, written as files first, then one
bounded run over them: MB / its wall time (started to finished), as bench_runtime's
throughput mode measures.

freshness: one run at ``--rate`` (default: half the sustained rate found by a shorter
search) for ``--seconds``. Per landing file: the last ``merged_at`` of the ledger's merged
chunks from that file minus the file's mtime (written, fsynced, then renamed in by the
producer: the mtime is at most the fsync earlier than the rename, so this overstates a
little); per stream entry: its chunk's last ``merged_at`` minus the entry id's
milliseconds. The merge commits the result rows with the merged chunk, so this is the time
from the producer making a record visible to its key's result being updated.

soak: one run at ``--rate`` for ``--minutes``; every 10 s the disk used (blocks) by the
run folder and by the landing and archive folders, ``pg_database_size``, the run's
Segment and MergedChunk rows, and the memory of every process of the stack (psutil over
the process trees started: workers and their children, the services, this process and its
Spark JVM), both resident (RSS) and proportional (PSS: shared pages divided among the
processes sharing them, so PostgreSQL's shared buffers count once however many backends
touched them). Growth after the first 5 minutes: last sample / the sample at
5 minutes - 1, per metric. The landing folder is cleaned by ``archive`` (``delete`` would
leave nothing to check exactness against), so the archive folder grows by the data
itself, by design.

Every subcommand ends by stopping its run (``set_status(run, "stopping")``) and checking it
is exact: the run's result rows against the plain Spark job over what it took in
(orchestrator/source/replay.py ``write_ingested``), and its coverage. One JSON object is
printed per subcommand (``--json FILE`` also writes it).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_peers import machine_parts, rss_of  # noqa: E402
from bench_runtime import (  # noqa: E402
    NO_SERVICES,
    Stack,
    elapsed_s,
    operator_batches,
    run_to_end,
    throughput_pipeline,
)

from balancer.document import PipelineDocument  # noqa: E402
from orchestrator.services.launcher import Launcher  # noqa: E402

MB = 2**20
REFERENCE = ROOT / "webapp/console/topologies/reference.yaml"
BRANCHES = ("task1", "task2", "task3")
VAR = ROOT / "var" / "bench-unbounded"
SAMPLE_S = 0.5
SOAK_SAMPLE_S = 10.0
GROWTH_LIMIT_S = 1.0  # a lag age "grows" when its last quarter's median is this much higher


class UnboundedStack(Stack):
    """bench_runtime's stack under a fixed folder of its own (not a temporary one), so
    it never meets the tests' ``var/test-*`` folders."""

    def __init__(self, var: Path, spark_workers: int) -> None:
        shutil.rmtree(var, ignore_errors=True)
        var.mkdir(parents=True)
        self.var = var
        self.launcher = Launcher(var, environ=NO_SERVICES)
        self.spark_workers = spark_workers
        self.children = []


def reference_unthrottled() -> PipelineDocument:
    """The published reference topology without its emulated link bandwidths (0 is
    unlimited) and without any node rate limit."""
    doc: PipelineDocument = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    for edge in doc["edges"]:
        edge.pop("bandwidth_mbps", None)
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
    doc["name"] = "reference-unthrottled"
    return doc


def policy() -> dict[str, Any]:
    return throughput_pipeline(8.0)[1]


def pct(values: list[float], q: float) -> float:
    """Nearest rank, as bench_runtime's rescale mode."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# -- producing ------------------------------------------------------------------------


class Producer(threading.Thread):
    """The producer in a thread: the same records for the same seed, at a paced rate."""

    def __init__(
        self,
        target: Any,
        *,
        rate_bps: float,
        seconds: float | None,
        seed: int,
        file_bytes: int,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.target, self.rate_bps, self.seconds = target, rate_bps, seconds
        self.seed, self.file_bytes, self.max_bytes = seed, file_bytes, max_bytes
        self.stop = threading.Event()
        self.report: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from orchestrator.pipeline.producer import produce

        try:
            self.report = produce(
                self.target,
                rate_bps=self.rate_bps,
                pattern="steady",
                duration_s=self.seconds,
                seed=self.seed,
                file_bytes=self.file_bytes,
                max_bytes=self.max_bytes,
                stop=self.stop,
                branches=BRANCHES,
            ).to_json()
        except Exception as error:  # noqa: BLE001 (reported by the caller)
            self.error = error

    def result(self) -> dict[str, Any]:
        self.join()
        if self.error is not None or self.report is None:
            raise RuntimeError(f"the producer failed: {self.error!r}")
        return self.report


@dataclass(frozen=True)
class Source:
    """Where one run reads from: a landing folder (with its archive) or a stream."""

    stream: str | None
    landing: Path | None
    archive: Path | None

    @classmethod
    def make(cls, var: Path, name: str, *, stream: bool) -> Source:
        if stream:
            return cls(f"bench-{name}-{uuid.uuid4().hex[:8]}", None, None)
        landing, archive = var / "landing" / name, var / "archive" / name
        landing.mkdir(parents=True)
        return cls(None, landing, archive)

    def spec(self, stable_s: float) -> Any:
        from orchestrator.source.spec import LandingSpec, StreamSpec

        if self.stream is not None:
            return StreamSpec(self.stream, linger_s=0.5)
        if self.landing is None or self.archive is None:
            raise RuntimeError("a folder source without its folders")
        return LandingSpec(
            str(self.landing),
            "*.jsonl",
            stable_s=stable_s,
            clean="archive",
            archive=str(self.archive),
        )

    def target(self) -> Any:
        from django.conf import settings

        from orchestrator.pipeline.producer import FolderTarget, StreamTarget

        if self.stream is not None:
            return StreamTarget(settings.REDIS_URL, self.stream)
        if self.landing is None:
            raise RuntimeError("a folder source without its folder")
        return FolderTarget(self.landing)

    def unmerged(self, run: Any) -> tuple[int, int, float]:
        """Files still in the landing folder (merged ones are archived out of it): their
        number, bytes and the oldest one's age. For a stream, whose entries are
        acknowledged once read into the ledger, the unfinished segments in the run: their
        number, bytes and the oldest one's age."""
        if self.landing is None:
            from django.db.models import Count, Min, Sum
            from django.utils import timezone

            from orchestrator.models import Segment

            open_ = (
                Segment.objects.filter(run=run)
                .exclude(state=Segment.State.DONE)
                .aggregate(n=Count("id"), size=Sum("bytes"), first=Min("created_at"))
            )
            first = open_["first"]
            age = (timezone.now() - first).total_seconds() if first is not None else 0.0
            return int(open_["n"]), int(open_["size"] or 0), max(0.0, age)
        count = size = 0
        oldest = math.inf
        for entry in os.scandir(self.landing):
            if entry.name.startswith(".") or not entry.name.endswith(".jsonl"):
                continue
            try:
                stat = entry.stat()
            except OSError:
                continue  # archived between the listing and the look
            count += 1
            size += stat.st_size
            oldest = min(oldest, stat.st_mtime)
        return count, size, (max(0.0, time.time() - oldest) if count else 0.0)

    def remove(self) -> None:
        from django.conf import settings

        if self.stream is not None:
            import redis

            from orchestrator.pipeline.streams import STREAM_PREFIX

            client = redis.Redis.from_url(settings.REDIS_URL)
            client.delete(STREAM_PREFIX + self.stream)
            client.close()
        for folder in (self.landing, self.archive):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


# -- one continuous run ---------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the producer started
    lag_entries: int
    lag_bytes: int
    lag_age_s: float
    unmerged_files: int
    unmerged_bytes: int
    unmerged_age_s: float
    exact_up_to: str | None


def source_view(run_id: int) -> dict[str, Any] | None:
    from orchestrator.run.lifecycle import snapshot

    view = snapshot(run_id).get("source")
    return dict(view) if view else None


def start_unbounded(
    doc: PipelineDocument, spec: Any, run_policy: dict[str, Any] | None = None
) -> Any:
    """Create and start the run (with ``run_policy``, else the throughput policy);
    return once its driver reports the source's lag."""
    from orchestrator.run.lifecycle import create_run
    from orchestrator.tasks import start_run

    run = create_run(topology=doc, policy=run_policy or policy(), source=spec)
    start_run(run)
    deadline = time.monotonic() + 180
    while True:
        view = source_view(run.pk)
        if view is not None and view.get("lag") is not None:
            return run
        run.refresh_from_db()
        if not run.is_active or time.monotonic() > deadline:
            raise RuntimeError(f"run {run.pk} did not start: {run.status} {run.error}")
        time.sleep(0.2)


def feed(
    run: Any,
    source: Source,
    *,
    rate_bps: float,
    seconds: float,
    seed: int,
    file_bytes: int,
    every: Callable[[float], None] | None = None,
) -> tuple[list[Sample], dict[str, Any]]:
    """Produce into the run's source for ``seconds``, sampling its lag meanwhile;
    ``every(t)`` is called at each sample too."""
    producer = Producer(
        source.target(), rate_bps=rate_bps, seconds=seconds, seed=seed, file_bytes=file_bytes
    )
    samples: list[Sample] = []
    began = time.monotonic()
    producer.start()
    try:
        while producer.is_alive():
            t = time.monotonic() - began
            view = source_view(run.pk) or {}
            lag = view.get("lag") or {"entries": 0, "bytes": 0, "age_s": 0.0}
            files, size, age = source.unmerged(run)
            samples.append(
                Sample(
                    round(t, 2),
                    int(lag["entries"]),
                    int(lag["bytes"]),
                    float(lag["age_s"]),
                    files,
                    size,
                    round(age, 2),
                    view.get("exact_up_to"),
                )
            )
            if every is not None:
                every(t)
            run.refresh_from_db(fields=["status", "error"])
            if not run.is_active:
                raise RuntimeError(f"run {run.pk} ended while fed: {run.status} {run.error}")
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - began - t)))
    finally:
        producer.stop.set()
    return samples, producer.result()


def stop_run(run: Any, *, drain_s: float) -> Any:
    """Let the run take in what waits (up to ``drain_s``), stop it, wait for its end."""
    from orchestrator.run.lifecycle import set_status

    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        view = source_view(run.pk) or {}
        lag = view.get("lag") or {}
        if not lag.get("entries"):
            break
        time.sleep(0.5)
    set_status(run.pk, "stopping", reason="benchmark: the producer is done")
    stopped = time.monotonic()
    while True:
        run.refresh_from_db()
        if not run.is_active:
            break
        if time.monotonic() - stopped > 900:
            raise RuntimeError(f"run {run.pk} still {run.status} 15 minutes after stopping")
        time.sleep(0.5)
    run.stop_s = round(time.monotonic() - stopped, 1)
    return run


def exactness(run: Any, doc: PipelineDocument, scratch: Path, source: Source) -> dict[str, Any]:
    """The run's rows against the plain Spark job over exactly what it took in.

    A landing folder's run, once stopped, has read every file it took whole and archived
    it: the plain job reads the archive folder itself (which must hold exactly the bytes
    the run emitted), so the check needs nothing of the run's own record of its files
    (rows of files merged long ago are deleted, BPCONSOLE_SOURCE_FILES_KEEP_S). A
    stream's entries are read back from the stream (``write_ingested``)."""
    from orchestrator.ledger.results import summary
    from orchestrator.source.replay import write_ingested
    from orchestrator.worker.plain_job import batch_summary

    result = summary(run)
    emitted = ingested_bytes(run)
    if source.archive is not None:
        files = sorted(source.archive.glob("*.jsonl"))
        taken = sum(f.stat().st_size for f in files)
        batch = batch_summary(
            topology=doc, input_path=str(source.archive / "*.jsonl"), generator=None
        )
        whole = taken == emitted
    else:
        path = scratch / f"ingested-{run.pk}.jsonl"
        try:
            taken = write_ingested(run, path)
            batch = batch_summary(topology=doc, input_path=str(path), generator=None)
        finally:
            path.unlink(missing_ok=True)
        whole = True
    return {
        "run": run.pk,
        "status": result["status"],
        "ingested_mb": round(taken / MB, 1),
        "emitted_equals_archived": whole,
        "rows": len(result["rows"]),
        "coverage": result["coverage"],
        "exact": result["status"] == "completed"
        and result["coverage"] == "exact"
        and whole
        and result["rows"] == batch["rows"]
        and result["malformed_records"] == batch["malformed_records"],
        "stop_to_completed_s": getattr(run, "stop_s", None),
    }


def ingested_bytes(run: Any) -> int:
    """Bytes the run's source emitted (a stream's extent counts entries, not bytes)."""
    run.refresh_from_db(fields=["input_bytes"])
    return int(run.input_bytes)


# -- the stack ------------------------------------------------------------------------


def warm_up(doc: PipelineDocument, runs: int, mb: int) -> int:
    """Warm runs over generated inputs, each through the plain job too (as bench_runtime's
    throughput mode): neither JVM start-up nor JIT warm-up is measured."""
    from orchestrator.worker.plain_job import batch_summary

    jobs = 0
    for seed in range(1, runs + 1):
        warm = run_to_end(doc, policy(), f"seed={seed},volume_mb={mb},dominance=0")
        if warm.status != "completed":
            raise RuntimeError(f"warm-up run {warm.pk} {warm.status}: {warm.error}")
        jobs += len(operator_batches(warm))
        batch_summary(topology=doc, input_path=warm.input_spec["paths"], generator=None)
    return jobs


# -- sustained ------------------------------------------------------------------------


def judge(samples: list[Sample], seconds: float, age_limit_s: float) -> dict[str, Any]:
    """Is the lag bounded over the step's second half?"""
    half = [s for s in samples if s.t >= seconds / 2]
    third = [s for s in half if s.t < seconds * 3 / 4]
    last = [s for s in half if s.t >= seconds * 3 / 4]
    if not third or not last:
        raise RuntimeError("too few samples to judge a step")

    def growth(field: str) -> float:
        late = statistics.median(float(getattr(s, field)) for s in last)
        return late - statistics.median(float(getattr(s, field)) for s in third)

    lag_p90 = pct([s.lag_age_s for s in half], 0.9)
    lag_growth = growth("lag_age_s")
    unmerged_growth = growth("unmerged_age_s")
    return {
        "lag_age_s_p90": round(lag_p90, 2),
        "lag_age_s_max": round(max(s.lag_age_s for s in half), 2),
        "lag_age_growth_s": round(lag_growth, 2),
        "lag_mb_end": round(half[-1].lag_bytes / MB, 1),
        "unmerged_age_s_p90": round(pct([s.unmerged_age_s for s in half], 0.9), 2),
        "unmerged_age_growth_s": round(unmerged_growth, 2),
        "unmerged_mb_end": round(half[-1].unmerged_bytes / MB, 1),
        "sustained": lag_p90 < age_limit_s
        and lag_growth < GROWTH_LIMIT_S
        and unmerged_growth < GROWTH_LIMIT_S,
    }


def step(
    stack: Stack, doc: PipelineDocument, args: argparse.Namespace, number: int, mbps: float
) -> tuple[dict[str, Any], Any, Source]:
    source = Source.make(stack.var, f"step{number}", stream=args.stream)
    run = start_unbounded(doc, source.spec(args.stable_s))
    samples, report = feed(
        run,
        source,
        rate_bps=mbps * MB,
        seconds=args.step_s,
        seed=args.seed,
        file_bytes=int(args.file_mb * MB),
    )
    verdict = judge(samples, args.step_s, args.age_limit_s)
    # The producer must have offered the rate, or the step says nothing of the run.
    offered = report["rate_bps"] / MB
    if offered < 0.95 * mbps:
        verdict["sustained"] = False
        verdict["producer_short"] = True
    stop_run(run, drain_s=0.0)
    outcome = {
        "step": number,
        "target_mb_s": round(mbps, 3),
        "produced_mb_s": round(offered, 3),
        "produced_mb": round(report["bytes"] / MB, 1),
        "run": run.pk,
        "ingested_mb": round(ingested_bytes(run) / MB, 1),
        **verdict,
        "lag_age_s_by_5s": [s.lag_age_s for s in samples[:: int(5 / SAMPLE_S)]],
        "unmerged_age_s_by_5s": [s.unmerged_age_s for s in samples[:: int(5 / SAMPLE_S)]],
    }
    print(json.dumps({k: v for k, v in outcome.items() if "by_5s" not in k}), file=sys.stderr)
    return outcome, run, source


def search(
    stack: Stack, doc: PipelineDocument, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], tuple[Any, Source] | None]:
    """Double from the start rate until a step fails, then bisect; return the steps and
    the highest sustained step's run and source (kept for the exactness check)."""
    steps: list[dict[str, Any]] = []
    best: tuple[float, Any, Source] | None = None

    def attempt(mbps: float) -> bool:
        nonlocal best
        outcome, run, source = step(stack, doc, args, len(steps) + 1, mbps)
        steps.append(outcome)
        if outcome["sustained"] and (best is None or mbps > best[0]):
            if best is not None:
                best[2].remove()
            best = (mbps, run, source)
        else:
            source.remove()
        return bool(outcome["sustained"])

    low, high = 0.0, args.start_mbps
    while high <= args.max_mbps and attempt(high):
        low, high = high, high * 2
    rate = high
    while low == 0.0 and len(steps) < 4:  # the start rate failed: halve until one holds
        rate /= 2
        if attempt(rate):
            low = rate
        else:
            high = rate
    for _ in range(args.bisect):
        if best is None or high > args.max_mbps:
            break
        middle = (low + high) / 2
        if attempt(middle):
            low = middle
        else:
            high = middle
    return steps, (best[1], best[2]) if best is not None else None


def bounded(
    stack: Stack, doc: PipelineDocument, args: argparse.Namespace, volume: int
) -> dict[str, Any]:
    """The same records, as many bytes, written as files first, then one bounded run."""
    from orchestrator.pipeline.producer import MAX_RATE_BPS, FolderTarget
    from orchestrator.worker.plain_job import batch_summary

    folder = stack.var / "bounded"
    shutil.rmtree(folder, ignore_errors=True)
    writer = Producer(
        FolderTarget(folder),
        rate_bps=MAX_RATE_BPS,
        seconds=None,
        seed=args.seed,
        file_bytes=int(args.file_mb * MB),
        max_bytes=volume,
    )
    writer.start()
    written = writer.result()
    paths = sorted(str(p) for p in folder.glob("part-*.jsonl"))
    run = run_to_end(doc, policy(), None, input_path=str(folder / "part-*.jsonl"))
    from orchestrator.ledger.results import summary

    result = summary(run)
    batch = batch_summary(topology=doc, input_path=paths, generator=None)
    wall = elapsed_s(run.started_at, run.finished_at)
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "run": run.pk,
        "mb": round(written["bytes"] / MB, 1),
        "files": len(paths),
        "wall_s": round(wall, 1),
        "mb_s": round(written["bytes"] / MB / wall, 3),
        "plain_job_s": batch["seconds"],
        "exact": result["rows"] == batch["rows"] and result["coverage"] == "exact",
    }


def sustained(args: argparse.Namespace) -> dict[str, Any]:
    with UnboundedStack(VAR, args.spark_workers) as stack:
        doc = reference_unthrottled()
        jobs = warm_up(doc, args.warmup_runs, args.warmup_mb)
        steps, best = search(stack, doc, args)
        if best is None:
            return {"steps": steps, "sustained_mb_s": None, "note": "no rate was sustained"}
        run, source = best
        top = next(s for s in steps if s["run"] == run.pk)
        exact = exactness(run, doc, stack.var, source)
        source.remove()
        reference = bounded(stack, doc, args, ingested_bytes(run))
        return {
            "source": "stream" if args.stream else "landing folder (clean: archive)",
            "pipeline": "reference.yaml unthrottled; water-level routing, no migration/throttling",
            "warmup": {"runs": args.warmup_runs, "mb_each": args.warmup_mb, "operator_jobs": jobs},
            "step_s": args.step_s,
            "age_limit_s": args.age_limit_s,
            "stable_s": args.stable_s,
            "file_mb": args.file_mb,
            "sustained_mb_s": top["produced_mb_s"],
            "sustained_target_mb_s": top["target_mb_s"],
            "bounded": reference,
            "ratio_to_bounded": round(top["produced_mb_s"] / reference["mb_s"], 3),
            "exactness": exact,
            "steps": steps,
        }


# -- freshness ------------------------------------------------------------------------


def file_freshness(run: Any) -> list[float]:
    """Per file taken in whole: its last chunk's merge minus its mtime."""
    from django.db.models import Max

    from orchestrator.ledger.ingested import ingested_extent
    from orchestrator.models import MergedChunk, SourceFile

    extent = ingested_extent(run)
    merged = dict(
        MergedChunk.objects.filter(run=run)
        .values("origin_file")
        .annotate(last=Max("merged_at"))
        .values_list("origin_file", "last")
    )
    out = []
    for row in SourceFile.objects.filter(run=run).order_by("index"):
        start, end = extent[row.index]
        if end < row.size or end <= start or row.index not in merged:
            continue  # not taken in whole (the run stopped in it)
        out.append(merged[row.index].timestamp() - row.mtime_ns / 1e9)
    return out


def entry_freshness(run: Any, stream: str) -> list[float]:
    """Per stream entry the run took in: its chunk's last merge minus its id's time."""
    import numpy as np
    import redis
    from django.conf import settings
    from django.db.models import Max

    from orchestrator.models import MergedChunk
    from orchestrator.pipeline.streams import STREAM_PREFIX

    taken = int((run.source_position or {}).get("offset", 0))
    client = redis.Redis.from_url(settings.REDIS_URL)
    millis: list[int] = []
    low = "-"
    while len(millis) < taken:
        page: Any = client.xrange(STREAM_PREFIX + stream, min=low, count=10_000)
        if not page:
            break
        for ident, _ in page:
            millis.append(int(ident.split(b"-")[0]))
        last = page[-1][0].decode()
        low = f"({last}"
    client.close()
    written = np.array(millis[:taken], dtype=np.float64) / 1000
    fresh = np.full(len(written), np.nan)
    chunks = (
        MergedChunk.objects.filter(run=run)
        .values("origin_offset", "origin_length")
        .annotate(last=Max("merged_at"))
    )
    for chunk in chunks:
        low_i, high_i = chunk["origin_offset"], chunk["origin_offset"] + chunk["origin_length"]
        fresh[low_i:high_i] = chunk["last"].timestamp() - written[low_i:high_i]
    return [float(x) for x in fresh[~np.isnan(fresh)]]


def half_sustained(stack: Stack, doc: PipelineDocument, args: argparse.Namespace) -> float:
    """``--rate``, or half the sustained rate a search in this session finds."""
    if args.rate is not None:
        return float(args.rate)
    steps, best = search(stack, doc, args)
    if best is None:
        raise RuntimeError(f"no rate was sustained: {steps}")
    run, source = best
    source.remove()
    top = next(s for s in steps if s["run"] == run.pk)
    return float(top["produced_mb_s"]) / 2


def freshness(args: argparse.Namespace) -> dict[str, Any]:
    with UnboundedStack(VAR, args.spark_workers) as stack:
        doc = reference_unthrottled()
        warm_up(doc, args.warmup_runs, args.warmup_mb)
        mbps = half_sustained(stack, doc, args)
        source = Source.make(stack.var, "freshness", stream=args.stream)
        run = start_unbounded(doc, source.spec(args.stable_s))
        samples, report = feed(
            run,
            source,
            rate_bps=mbps * MB,
            seconds=args.seconds,
            seed=args.seed,
            file_bytes=int(args.file_mb * MB),
        )
        run = stop_run(run, drain_s=60.0)
        if args.stream:
            values = entry_freshness(run, str(source.stream))
            unit = "stream entries"
        else:
            values = file_freshness(run)
            unit = "files"
        exact = exactness(run, doc, stack.var, source)
        source.remove()
        return {
            "source": "stream" if args.stream else "landing folder (clean: archive)",
            "stable_s": args.stable_s,
            "rate_mb_s": round(mbps, 3),
            "produced_mb_s": round(report["rate_bps"] / MB, 3),
            "seconds": args.seconds,
            "measured": f"{len(values)} {unit}",
            "freshness_s_p50": round(pct(values, 0.5), 3),
            "freshness_s_p99": round(pct(values, 0.99), 3),
            "freshness_s_max": round(max(values), 3),
            "freshness_s_min": round(min(values), 3),
            "lag_age_s_p99": round(pct([s.lag_age_s for s in samples], 0.99), 2),
            "target_p99_met": pct(values, 0.99) <= 5.0,
            "exactness": exact,
        }


# -- soak -----------------------------------------------------------------------------


def disk_bytes(path: Path | None) -> int:
    """Disk blocks in use under ``path`` (as ``du``)."""
    if path is None or not path.exists():
        return 0
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += (Path(folder) / name).lstat().st_blocks * 512
            except OSError:
                continue  # deleted meanwhile
    return total


SOAK_TABLES = tuple(
    f"orchestrator_{name}"
    for name in ("segment", "mergedchunk", "resultgroup", "sourcefile", "event")
)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    with UnboundedStack(VAR, args.spark_workers) as stack:
        from django.db import connection

        from orchestrator.models import MergedChunk, Segment
        from orchestrator.pipeline.layout import run_dir

        doc = reference_unthrottled()
        warm_up(doc, args.warmup_runs, args.warmup_mb)
        mbps = half_sustained(stack, doc, args)
        parts = machine_parts(stack)  # the bench's Spark JVM runs since the warm-up
        source = Source.make(stack.var, "soak", stream=args.stream)
        run = start_unbounded(doc, source.spec(args.stable_s))
        samples: list[dict[str, Any]] = []

        def take(t: float) -> None:
            if samples and t - samples[-1]["t"] < SOAK_SAMPLE_S:
                return
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_database_size(current_database())")
                database = int(cursor.fetchone()[0])
                # Where the database's growth is: each table with its indexes and TOAST.
                cursor.execute(
                    "SELECT relname, pg_total_relation_size(oid) FROM pg_class "
                    "WHERE relname = ANY(%s)",
                    [list(SOAK_TABLES)],
                )
                tables = {str(name): int(size) for name, size in cursor.fetchall()}
            memory = rss_of(parts)
            shared_once = rss_of(parts, proportional=True)
            sample = {
                "t": round(t, 1),
                "run_dir_mb": disk_bytes(run_dir(run.pk)) / MB,
                "landing_mb": disk_bytes(source.landing) / MB,
                "archive_mb": disk_bytes(source.archive) / MB,
                "database_mb": database / MB,
                "segment_rows": Segment.objects.filter(run=run).count(),
                "merged_chunk_rows": MergedChunk.objects.filter(run=run).count(),
                **{f"table_mb {t}": tables.get(t, 0) / MB for t in SOAK_TABLES},
                **{f"rss_mb {name}": size / MB for name, size in memory.items()},
                "rss_mb all": sum(memory.values()) / MB,
                **{f"pss_mb {name}": size / MB for name, size in shared_once.items()},
                "pss_mb all": sum(shared_once.values()) / MB,
            }
            samples.append(sample)
            print(json.dumps({k: round(v, 1) for k, v in sample.items()}), file=sys.stderr)

        seconds = args.minutes * 60
        lag, report = feed(
            run,
            source,
            rate_bps=mbps * MB,
            seconds=seconds,
            seed=args.seed,
            file_bytes=int(args.file_mb * MB),
            every=take,
        )
        run = stop_run(run, drain_s=60.0)
        exact = exactness(run, doc, stack.var, source)
        source.remove()
        base_t = 300.0 if seconds > 300 else seconds / 2  # after the first 5 minutes
        base = min(samples, key=lambda s: abs(s["t"] - base_t))
        end = samples[-1]
        growth = {k: (round(end[k] / base[k] - 1, 4) if base[k] else None) for k in end if k != "t"}
        # The same over a minute's median at each end: a process's memory moves a few
        # percent from one sample to the next (PostgreSQL's backends, a JVM's GC), so
        # one sample against one other can cross 5% by chance.
        at = samples.index(base)
        first = samples[max(0, at - 3) : at + 3]
        last = samples[-6:]
        steady = {
            k: (
                round(
                    statistics.median(s[k] for s in last) / statistics.median(s[k] for s in first)
                    - 1,
                    4,
                )
            )
            for k in end
            if k != "t" and statistics.median(s[k] for s in first)
        }
        from django.conf import settings

        return {
            "source": "stream" if args.stream else "landing folder (clean: archive)",
            "rate_mb_s": round(mbps, 3),
            "produced_mb_s": round(report["rate_bps"] / MB, 3),
            "minutes": args.minutes,
            "segment_rows_keep_s": settings.BPCONSOLE_SEGMENT_ROWS_KEEP_S,
            "growth_from_s": base["t"],
            "growth_to_s": end["t"],
            "growth": growth,
            "over_5_percent": sorted(k for k, v in growth.items() if v is not None and v > 0.05),
            "growth_of_minute_medians": steady,
            "over_5_percent_of_minute_medians": sorted(k for k, v in steady.items() if v > 0.05),
            "at_base": {k: round(v, 1) for k, v in base.items()},
            "at_end": {k: round(v, 1) for k, v in end.items()},
            "lag_age_s_p99": round(pct([s.lag_age_s for s in lag], 0.99), 2),
            "lag_age_s_max": round(max(s.lag_age_s for s in lag), 2),
            "unmerged_age_s_max": round(max(s.unmerged_age_s for s in lag), 2),
            "exactness": exact,
            "samples": samples,
        }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("sustained", "freshness", "soak"):
        p = sub.add_parser(name)
        p.add_argument("--stream", action="store_true", help="a Redis stream, not a folder")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--file-mb", type=float, default=1.0, help="the producer's part files")
        p.add_argument(
            "--stable-s",
            type=float,
            default=0.0,
            help="landing folder: age a file must have to be taken; the producer renames "
            "whole files in, so none is needed",
        )
        p.add_argument("--spark-workers", type=int, default=1)
        p.add_argument("--warmup-runs", type=int, default=2)
        p.add_argument("--warmup-mb", type=int, default=64)
        # The search (sustained; freshness and soak without --rate).
        p.add_argument("--start-mbps", type=float, default=1.0, help="MB/s of the first step")
        p.add_argument("--max-mbps", type=float, default=128.0)
        p.add_argument("--step-s", type=float, default=40.0)
        p.add_argument("--bisect", type=int, default=2)
        p.add_argument("--age-limit-s", type=float, default=5.0)
        p.add_argument("--json", type=Path, default=None, help="also write the result here")
        if name != "sustained":
            p.add_argument(
                "--rate", type=float, default=None, help="MB/s (default: half sustained)"
            )
        if name == "freshness":
            p.add_argument("--seconds", type=float, default=60.0)
        if name == "soak":
            p.add_argument("--minutes", type=float, default=30.0)
            p.add_argument(
                "--segment-rows-keep-s",
                type=float,
                default=None,
                help="BPCONSOLE_SEGMENT_ROWS_KEEP_S for the stack (default: the setting's)",
            )
    args = parser.parse_args()
    if getattr(args, "segment_rows_keep_s", None) is not None:
        # Read by the workers the stack starts, which inherit this environment.
        os.environ["BPCONSOLE_SEGMENT_ROWS_KEEP_S"] = str(args.segment_rows_keep_s)
    commands: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "sustained": sustained,
        "freshness": freshness,
        "soak": soak,
    }
    result = {"benchmark": args.what, **commands[args.what](args)}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
