"""End-to-end figures of the live runtime, on the project's own embedded stack.

    .venv/bin/python bench/bench_runtime.py throughput [--mb 1024] [--rounds 3] [--warmup-runs 4]
        [--warmup-mb 64] [--spark-workers 1|2]
    .venv/bin/python bench/bench_runtime.py ticks [--nodes 50]
    .venv/bin/python bench/bench_runtime.py rescale [--adjustments 20]

throughput: an unthrottled source -> 3 aggregators -> sink pipeline over a generated
JSON-lines input, against the plain Spark batch job on the same file in the same session
(target: streaming throughput >= 0.8 of the batch job's), with the peak resident memory
of the whole stack (services, workers, this process) sampled every 0.5 s.

ticks: a source -> N-2 aggregators -> sink pipeline with the watermark and migration
layers on; the driver reports its balancer tick durations (target p99 <= 100 ms at 50
nodes).

rescale: a source paced at --source-mbps -> a 3-instance aggregating stage -> sink, and
while it runs, adjustments one after the other (hot-migrate the stage's oldest instance,
add an instance, remove it again, ...); each adjustment's completion time (markers
injected to completion, from the ledger) and the sink's longest pause meanwhile
(target p95 < 2 s); the run must still equal the batch job.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from balancer.document import EdgeDocument, NodeDocument, PipelineDocument  # noqa: E402
from orchestrator.services.embedded import die_with_parent  # noqa: E402
from orchestrator.services.launcher import Launcher  # noqa: E402
from orchestrator.services.runconsole import Child, spark_workers  # noqa: E402

NO_SERVICES = {"DATABASE_URL": "", "REDIS_URL": "", "ZK_HOSTS": ""}


class Stack:
    """Services, migrations and workers under a throw-away state folder."""

    def __init__(self, spark_workers: int) -> None:
        self.var = Path(tempfile.mkdtemp(prefix="bpconsole-bench-"))
        self.launcher = Launcher(self.var, environ=NO_SERVICES)
        self.spark_workers = spark_workers
        self.children: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        endpoints = self.launcher.start()
        self.env = {
            **os.environ,
            **endpoints.as_env(),
            "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
            "BPCONSOLE_VAR_DIR": str(self.var),
        }
        os.environ.update(self.env)
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"], env=self.env, cwd=ROOT, check=True
        )
        celery = [sys.executable, "-m", "celery", "-A", "orchestrator.celery"]
        self.control = self._start(
            [
                *celery,
                "worker",
                "-Q",
                "control",
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "-n",
                "c@b",
                "--loglevel",
                "INFO",
            ],
            "control",
        )
        workers = self.spark_children()
        for worker in workers:
            worker.start()
        self.spark = [w.process for w in workers if w.process is not None]
        self.children += self.spark
        self.beat = self._start([*celery, "beat", "--schedule", str(self.var / "beat")], "beat")
        import django

        django.setup()
        from orchestrator.celery import app

        deadline = time.monotonic() + 120
        while len(app.control.ping(timeout=1.0) or []) < 1 + self.spark_workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start; logs in {self.var}")
        self.wait_for_warm_ups()
        return self

    def wait_for_warm_ups(self, timeout_s: float = 900.0) -> None:
        """Until every Spark worker's JVM has ended its warm-up (sparkjobs/warm_up.py):
        its jobs would otherwise share the machine with a timed side."""
        from django.conf import settings

        from sparkjobs.shared_jvm import warm_ups

        if settings.BPCONSOLE_SPARK_WARM_UP_ROUNDS == 0:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            found = warm_ups(self.var / "run")
            warming = [w for w in found.values() if w is not None and w.state == "warming"]
            if len(found) >= self.spark_workers and not warming:
                print(
                    "warm-ups: "
                    + ", ".join(
                        "none (a JVM started again)"
                        if w is None
                        else f"{w.state} after {w.jobs} jobs, {w.seconds:.0f} s"
                        for w in found.values()
                    ),
                    file=sys.stderr,
                )
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(found) - len(warming)} of {self.spark_workers} Spark workers' "
                    f"warm-ups ended within {timeout_s:.0f} s; logs in {self.var}"
                )
            time.sleep(1.0)

    def spark_children(self) -> list[Child]:
        """The Spark workers to start, as make run starts them: each a pool of one with
        a JVM of its own."""
        return spark_workers(self.spark_workers, sys.executable, self.env, self.var)

    def _start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with (self.var / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                args,
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
            )
        self.children.append(process)
        return process

    def __exit__(self, exc_type: object, *_: object) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            child.wait(30)
        self.launcher.stop()
        # A throughput run leaves gigabytes of inputs and segments: keep them only to
        # read the logs of a failed run.
        if exc_type is None:
            shutil.rmtree(self.var, ignore_errors=True)
        else:
            print(f"state and logs kept in {self.var}", file=sys.stderr)


def pipeline(aggregators: int, *, buffer_mb: float, segment_mb: float) -> PipelineDocument:
    params = {"key": "key", "value": "value", "distinct": "user"}
    nodes: list[NodeDocument] = [
        {
            "name": "source",
            "kind": "source",
            "operator": "read",
            "params": {"format": "jsonl", "route_by": "key", "segment_mb": segment_mb},
        },
        {"name": "output", "kind": "sink", "operator": "merge", "buffer_mb": 1024},
    ]
    edges: list[EdgeDocument] = []
    for i in range(1, aggregators + 1):
        name = f"agg{i}"
        nodes.append(
            {
                "name": name,
                "kind": "operator",
                "stage": "agg",
                "operator": "aggregate",
                "params": params,
                "buffer_mb": buffer_mb,
            }
        )
        edges += [{"from": "source", "to": name}, {"from": name, "to": "output"}]
    return {"name": f"bench-{aggregators}", "nodes": nodes, "edges": edges}


def throughput_pipeline(segment_mb: float) -> tuple[PipelineDocument, dict[str, Any]]:
    """The throughput mode's pipeline (source -> 3 aggregators -> sink) and policy: routed
    by water level, nothing migrated or throttled."""
    from balancer.policy import Policy

    doc = pipeline(3, buffer_mb=512, segment_mb=segment_mb)
    layers = {"routing": "water_level", "migration": "off", "throttling": "none"}
    return doc, Policy.from_mapping(layers).to_dict()


# The longest a benchmark's run may take before the benchmark gives up on it.
RUN_TIMEOUT_S = 3600.0


def run_to_end(
    doc: PipelineDocument,
    policy: dict[str, Any],
    generator: str | None,
    before_start: Callable[[], object] | None = None,
    *,
    input_path: str | None = None,
) -> Any:
    """Create a run over a generated input or over ``input_path``, start it and wait
    until it has ended."""
    from orchestrator.run.lifecycle import create_run
    from orchestrator.run.wakeups import wait_until_ended
    from orchestrator.tasks import start_run

    run = create_run(topology=doc, policy=policy, generator=generator, input_path=input_path)
    if before_start is not None:
        before_start()  # after the run's own input is written, which is not the run
    start_run(run)
    # Woken by the run's own notifications (its end among them), as run_pipeline --wait
    # is: a side timed by its caller's clock around this call is not a poll late, and
    # the waiting takes no CPU from the run it measures (a status read 20 times a second
    # had taken 0.3 CPU seconds of a 5 s run's).
    wait_until_ended(run.pk, RUN_TIMEOUT_S)
    run.refresh_from_db()
    return run


def streamed_to_end(aggregated: Any, name: str, scratch: Path) -> tuple[list[Any], int]:
    """A Structured Streaming aggregation (a streaming DataFrame) run over every file
    there now (``trigger(availableNow=True)``), in complete mode into the memory sink
    ``name``, its checkpoint a fresh folder under ``scratch`` (removed after): its final
    rows (the memory sink keeps only the last trigger's output in complete mode) and how
    many triggers it took."""
    checkpoint = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=scratch))
    try:
        query = (
            aggregated.writeStream.outputMode("complete")
            .format("memory")
            .queryName(name)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"structured streaming failed: {query.exception()}")
        spark = aggregated.sparkSession
        rows = spark.table(name).collect()
        spark.catalog.dropTempView(name)
        return rows, len(query.recentProgress)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def elapsed_s(start: datetime | None, end: datetime | None) -> float:
    """Seconds from ``start`` to ``end``: the times of something that has ended."""
    if start is None or end is None:
        raise RuntimeError(f"no elapsed time from {start} to {end}: not ended")
    return (end - start).total_seconds()


def operator_batches(run: Any) -> list[dict[str, Any]]:
    """The run's operator batches in completion order: node, MB, and when each was done
    (seconds from the run's start). With one Spark worker the batches run one after the
    other, so the gaps between completions are the batch times. A batch that took its
    siblings' data with its own names them all."""
    from django.db.models import Max, Sum

    from orchestrator.models import Segment

    parts = (
        Segment.objects.filter(run=run, upstream="source", state=Segment.State.DONE)
        .values("lease_owner", "node")
        .annotate(size=Sum("bytes"), done=Max("done_at"))
    )
    batches: dict[str, dict[str, Any]] = {}
    for part in parts:
        batch = batches.setdefault(part["lease_owner"], {"nodes": [], "size": 0})
        batch["nodes"].append(part["node"])
        batch["size"] += part["size"]
        batch["done"] = max(batch.get("done", part["done"]), part["done"])
    out, previous = [], 0.0
    for batch in sorted(batches.values(), key=lambda b: b["done"]):
        done = (batch["done"] - run.started_at).total_seconds()
        mb = batch["size"] / 2**20
        out.append(
            {
                "node": "+".join(sorted(batch["nodes"])),
                "mb": round(mb, 1),
                "done_s": round(done, 1),
                "mb_s": round(mb / max(done - previous, 1e-3), 1),
            }
        )
        previous = done
    return out


def emitted_all_s(run: Any) -> float:
    """Seconds from the run's start until its source had emitted its last segment."""
    from orchestrator.models import Segment

    emitted = Segment.objects.filter(run=run, upstream="source").latest("created_at")
    seconds: float = (emitted.created_at - run.started_at).total_seconds()
    return round(seconds, 1)


def tree_cpu_s(pid: int, *, children: bool = True, jvm: bool | None = None) -> float:
    """User plus system CPU seconds of a process and its live descendants (only the
    JVMs among them, or only the others, when ``jvm`` says so)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)] if children else [root]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            if jvm is not None and (proc.name() == "java") != jvm:
                continue
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def cpu_by_part(stack: Stack) -> dict[str, float]:
    """Where the machine's CPU goes: each worker, each service and this process."""
    parts = {
        "control worker": tree_cpu_s(stack.control.pid),
        "spark worker's Python": sum(tree_cpu_s(s.pid, jvm=False) for s in stack.spark),
        "spark worker's JVM": sum(tree_cpu_s(s.pid, jvm=True) for s in stack.spark),
        "beat": tree_cpu_s(stack.beat.pid),
    }
    for service in stack.launcher.started:
        if service.process:
            parts[service.name] = tree_cpu_s(service.process.pid)
    parts["bench (batch job driver)"] = tree_cpu_s(os.getpid(), children=False)
    # The bench's other children are the workers and the services, counted above.
    counted = {c.pid for c in stack.children} | {
        s.process.pid for s in stack.launcher.started if s.process
    }
    parts["bench's Spark JVM"] = sum(
        tree_cpu_s(c.pid) for c in psutil.Process().children() if c.pid not in counted
    )
    machine = psutil.cpu_times()
    parts["machine idle"] = machine.idle + getattr(machine, "iowait", 0.0)
    parts["machine steal"] = getattr(machine, "steal", 0.0)
    return parts


def _snapshot_cpu(stack: Stack, into: dict[str, float]) -> None:
    into.update(cpu_by_part(stack))


class MemorySampler(threading.Thread):
    """Peak resident memory of the given processes and all their descendants, from one
    pass over the process table per sample (not one per root)."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            children: dict[int, list[int]] = {}
            rss: dict[int, int] = {}
            for proc in psutil.process_iter(["ppid", "memory_info"]):
                memory = proc.info["memory_info"]
                if memory is not None:
                    children.setdefault(proc.info["ppid"], []).append(proc.pid)
                    rss[proc.pid] = memory.rss
            total, pending = 0, list(self.roots)
            while pending:
                pid = pending.pop()
                total += rss.get(pid, 0)
                pending.extend(children.get(pid, []))
            self.peak = max(self.peak, total)
            time.sleep(0.5)


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    with Stack(args.spark_workers) as stack:
        from orchestrator.ledger.results import summary
        from orchestrator.models import Segment
        from orchestrator.worker.plain_job import batch_summary, generated_input

        doc, policy = throughput_pipeline(args.segment_mb)
        generator = f"seed=3,volume_mb={args.mb},dominance=0"
        # Both sides warm: deployed workers keep their SparkSession between runs, and the
        # batch job runs on every warm-up input too. Neither JVM start-up nor JIT
        # warm-up is what is compared: the JIT compiles lukewarm planning code for a
        # worker's first 15 or so Spark jobs (2 to 3 CPU s per job at first, 0.5 to 1
        # after; docs/benchmarks.md), and one warm-up run is only 4 or 5 jobs.
        warmup_jobs = 0
        for seed in range(1, args.warmup_runs + 1):
            warm = run_to_end(doc, policy, f"seed={seed},volume_mb={args.warmup_mb},dominance=0")
            warmup_jobs += len(operator_batches(warm))
            batch_summary(topology=doc, input_path=warm.input_spec["paths"], generator=None)
        began = time.monotonic()
        generated_input(doc, generator)
        generation_s = time.monotonic() - began
        sampler = MemorySampler([os.getpid(), *(c.pid for c in stack.children)])
        sampler.start()
        rounds = []
        for _ in range(args.rounds):
            cpu_before: dict[str, float] = {}
            run = run_to_end(
                doc, policy, generator, functools.partial(_snapshot_cpu, stack, cpu_before)
            )
            cpu_after = cpu_by_part(stack)
            result = summary(run)
            batch = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
            cpu_batch = cpu_by_part(stack)
            stream_s = (run.finished_at - run.started_at).total_seconds()
            rounds.append(
                {
                    "stream_s": round(stream_s, 1),
                    "batch_s": batch["seconds"],
                    "throughput_ratio": round(batch["seconds"] / stream_s, 3),
                    "exact": result["rows"] == batch["rows"] and result["coverage"] == "exact",
                    "segments_claimed_more_than_once": Segment.objects.filter(
                        run=run, attempts__gt=1
                    ).count(),
                    "source_emitted_all_s": emitted_all_s(run),
                    "operator_batches": operator_batches(run),
                    "cpu_s_during_run": {
                        k: round(v - cpu_before.get(k, 0.0), 1) for k, v in cpu_after.items()
                    },
                    "cpu_s_during_batch_job": {
                        k: round(v - cpu_after.get(k, 0.0), 1)
                        for k, v in cpu_batch.items()
                        if k.startswith(("bench", "machine"))
                    },
                }
            )
        sampler.stop.set()
        sampler.join()
        launcher_rss = sum(
            psutil.Process(s.process.pid).memory_info().rss
            for s in stack.launcher.started
            if s.process
        )
        size = run.input_spec["extent_total"]
        stream = sorted(r["stream_s"] for r in rounds)[len(rounds) // 2]
        batch_s = sorted(r["batch_s"] for r in rounds)[len(rounds) // 2]
        return {
            "input_mb": round(size / 2**20, 1),
            "warmup": {
                "runs": args.warmup_runs,
                "mb_each": args.warmup_mb,
                "stream_operator_jobs": warmup_jobs,
                "batch_jobs": args.warmup_runs,
            },
            "generation_s": round(generation_s, 1),
            "rounds": rounds,
            "median_stream_s": stream,
            "median_batch_s": batch_s,
            "stream_mb_s": round(size / 2**20 / stream, 2),
            "batch_mb_s": round(size / 2**20 / batch_s, 2),
            "ratio_of_medians": round(batch_s / stream, 3),
            "all_exact": all(r["exact"] for r in rounds),
            "peak_rss_mb_workers_and_bench": round(sampler.peak / 2**20),
            "services_rss_mb_at_end": round(launcher_rss / 2**20),
        }


def ticks(args: argparse.Namespace) -> dict[str, Any]:
    from balancer.policy import Policy

    with Stack(args.spark_workers):
        from orchestrator.models import Event

        doc = pipeline(args.nodes - 2, buffer_mb=0.5, segment_mb=0.0625)
        layers = {"routing": "water_level", "migration": "pressure", "throttling": "watermark"}
        policy = Policy.from_mapping({**layers, "tick_ms": 500}).to_dict()
        run = run_to_end(doc, policy, f"seed=5,volume_mb={args.mb},dominance=0.5")
        stats = Event.objects.filter(run=run, kind="driver_stats").first()
        return {"nodes": args.nodes, "status": run.status, **(stats.data if stats else {})}


def rescale(args: argparse.Namespace) -> dict[str, Any]:
    from balancer.policy import Policy

    with Stack(args.spark_workers):
        from orchestrator.ledger.results import summary
        from orchestrator.models import Adjustment
        from orchestrator.run.lifecycle import create_run, request_adjustment
        from orchestrator.tasks import start_run
        from orchestrator.worker.plain_job import batch_summary

        doc = pipeline(3, buffer_mb=4, segment_mb=0.5)
        doc["nodes"][0]["max_rate_mbps"] = args.source_mbps
        layers = {"routing": "water_level", "migration": "off", "throttling": "none"}
        policy = Policy.from_mapping(layers).to_dict()
        run_to_end(doc, policy, "seed=1,volume_mb=16,dominance=0")  # warm the Spark worker
        run = create_run(topology=doc, policy=policy, generator=f"seed=9,volume_mb={args.mb}")
        start_run(run)
        time.sleep(3)
        added: list[str] = []
        for i in range(args.adjustments):
            run.refresh_from_db()
            if not run.is_active:
                break
            members = [n["name"] for n in run.topology["nodes"] if n.get("stage") == "agg"]
            step = i % 3
            if step == 0:
                request_adjustment(run.pk, "hot_migrate", node=members[0])
            elif step == 1:
                request_adjustment(run.pk, "add_instance", stage="agg")
            else:
                request_adjustment(run.pk, "remove_instance", node=added.pop())
            deadline = time.monotonic() + 120
            while (
                Adjustment.objects.filter(run=run).count() <= i
                or Adjustment.objects.filter(run=run, status="running").exists()
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"adjustment {i + 1} did not end")
                time.sleep(0.05)
            last = Adjustment.objects.filter(run=run).latest("version")
            if step == 1:
                added.extend(last.plan["added"])
            time.sleep(0.5)
        while run.is_active:
            time.sleep(0.5)
            run.refresh_from_db()
        done = list(Adjustment.objects.filter(run=run).order_by("version"))
        durations = {a.pk: elapsed_s(a.started_at, a.finished_at) for a in done}
        seconds = sorted(durations.values())
        gaps = sorted(a.outcome.get("sink_max_gap_s") or 0.0 for a in done)
        result = summary(run)
        batch = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)

        def pct(values: list[float], q: float) -> float:
            # Nearest rank: the smallest value with at least q of the values at or below.
            return round(values[max(0, math.ceil(q * len(values)) - 1)], 3)

        by_kind: dict[str, list[float]] = {}
        for a in done:
            by_kind.setdefault(a.kind, []).append(durations[a.pk])
        return {
            "adjustments": len(done),
            "complete": sum(a.status == "complete" for a in done),
            "completion_s_p50": pct(seconds, 0.5),
            "completion_s_p95": pct(seconds, 0.95),
            "completion_s_max": round(seconds[-1], 3) if seconds else None,
            "completion_s_sorted": [round(x, 2) for x in seconds],
            "by_kind_p50_s": {k: pct(sorted(v), 0.5) for k, v in by_kind.items()},
            "sink_max_gap_s_p95": pct(gaps, 0.95),
            "run_s": round(elapsed_s(run.started_at, run.finished_at), 1),
            "exact": result["rows"] == batch["rows"] and result["coverage"] == "exact",
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--mb", type=int, default=1024)
    t.add_argument("--segment-mb", type=float, default=8.0)
    t.add_argument("--spark-workers", type=int, default=1)
    t.add_argument("--rounds", type=int, default=1, help="stream + batch pairs; medians")
    t.add_argument("--warmup-runs", type=int, default=4, help="warm-up runs (and batch jobs)")
    t.add_argument("--warmup-mb", type=int, default=64, help="input of each warm-up run")
    k = sub.add_parser("ticks")
    k.add_argument("--nodes", type=int, default=50)
    k.add_argument("--mb", type=int, default=24)
    k.add_argument("--spark-workers", type=int, default=2)
    r = sub.add_parser("rescale")
    r.add_argument("--adjustments", type=int, default=20)
    r.add_argument("--mb", type=int, default=384)
    r.add_argument("--source-mbps", type=float, default=32.0)
    r.add_argument("--spark-workers", type=int, default=1)
    args = parser.parse_args()
    result = {"throughput": throughput, "ticks": ticks, "rescale": rescale}[args.what](args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
