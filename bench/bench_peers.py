"""The live run against its peers: the same exact aggregation done four ways.

    .venv/bin/python bench/bench_peers.py [--mb 1024] [--keys 243] [--hot-share 0.35]
        [--record-bytes 150] [--users 1000] [--seed 1] [--file-mb 8] [--trigger-mb 512]
        [--warmup-mb 64] [--warmup-rounds 1] [--rounds 3] [--live-input files|whole]
        [--json]

One generated JSON-lines input (``{"key", "value", "user", "pad"}``; ``--hot-share`` of
the records on one key, the rest spread evenly over the other keys; values with four
decimals; ``pad`` fills a record to about ``--record-bytes``), written once as one file
and once cut at line ends into ``--file-mb`` files. Per key: count, sum, min, max, avg
and distinct users, computed by

(a) spark: the idiomatic Spark batch job, ``spark.read.schema(...).json(folder)`` of the
    one file, then ``groupBy("key").agg(count, sum, min, max, avg, countDistinct("user"))``,
    collected;
(b) structured streaming: the same query over the cut files (distinct users as
    ``size(collect_set(user))``, as a streaming aggregate cannot count distinct), file
    source with the same schema, ``trigger(availableNow=True)``, output mode complete to
    the memory sink, a fresh checkpoint folder per execution. The JSON file source has
    no ``maxBytesPerTrigger`` (only ``maxFilesPerTrigger``), so each trigger reads
    ``--trigger-mb / --file-mb`` files, by default our batch size
    (``BPCONSOLE_BATCH_MB``);
(c) our --batch: ``sparkjobs.plain_job.batch_grouped`` over the one file, as
    ``run_pipeline --batch`` calls it (orchestrator/worker/plain_job.py);

(d) our live run: bench_runtime.py's throughput pipeline (source -> 3 aggregators ->
    sink, 8 MB segments, one Spark worker) on its embedded stack, over the cut files as
    (b) reads them (each one whole segment, read in place: ADR 11), or with
    ``--live-input whole`` over the one file (cut into segments and copied).

(a), (b) and (c) run in this process's SparkSession, built as a worker builds its own
(sparkjobs/session.py); (d) in the Celery workers. Every side's result is checked
against a pure-Python computation over the file (sums as Decimal). One thing runs at a
time: a warm-up (each side once on a ``--warmup-mb`` input, then ``--warmup-rounds``
rounds of every side on the input itself, the live side three times a round as the
bench's JVM runs three sides, untimed but reported), then ``--rounds``
rounds, each side once per round in an order that rotates by one side each round.
Reported per side: median wall time, MB/s, and throughput ratios (the live run's MB/s
over (a)'s and over (b)'s, (c)'s over (a)'s); per process, CPU seconds (median over the
rounds) and peak resident memory (highest over the rounds), JVMs included.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_runtime import (  # noqa: E402
    Stack,
    emitted_all_s,
    operator_batches,
    run_to_end,
    streamed_to_end,
    throughput_pipeline,
    tree_cpu_s,
)

MB = 2**20
SCHEMA = "key STRING, value DECIMAL(38,10), user STRING"
SIDES = ("spark", "streaming", "batch", "live")
IN_THIS_JVM = ("spark", "streaming", "batch")  # the bench's own SparkSession's sides
SEGMENT_MB = 8.0  # the live run's segments, as in bench_runtime.py's throughput mode

# Per key: count, sum, min, max, distinct users. avg is sum / count on every side.
Result = dict[str, tuple[int, Decimal, Decimal, Decimal, int]]


@dataclass(frozen=True)
class Shape:
    keys: int
    hot_share: float
    record_bytes: int
    users: int


@dataclass(frozen=True)
class Input:
    whole: Path  # the one file, alone in its folder
    parts: Path  # the folder of cut files
    bytes: int
    files: int

    @property
    def mb(self) -> float:
        return self.bytes / MB


def write_input(folder: Path, mb: float, shape: Shape, seed: int, file_mb: float) -> Input:
    """The input, ending with the first record past ``mb`` MB; then the same bytes cut."""
    rng = np.random.default_rng(seed)
    names = [f"key-{i:03d}" for i in range(shape.keys)]
    whole = folder / "whole" / "input.jsonl"
    whole.parent.mkdir(parents=True)
    written = 0
    with whole.open("w") as out:
        while written < mb * MB:
            # Blocks of 50,000 records, the last one cut to end near ``mb``.
            block = min(50_000, int((mb * MB - written) / shape.record_bytes) + 1)
            hot = rng.random(block) < shape.hot_share
            # Key 0 is the hot key; the others share the rest evenly.
            keys = np.where(hot, 0, rng.integers(1, max(2, shape.keys), size=block))
            # Values from -100,000 to 100,000 with four decimals, written exactly.
            values = rng.integers(-(10**9), 10**9, size=block)
            users = rng.integers(shape.users, size=block)
            lines = []
            for k, v, u in zip(keys.tolist(), values.tolist(), users.tolist(), strict=True):
                whole_part, frac = divmod(abs(v), 10_000)
                value = f"{'-' if v < 0 else ''}{whole_part}.{frac:04d}"
                head = f'{{"key":"{names[k]}","value":{value},"user":"u{u}","pad":"'
                lines.append(head + "x" * max(0, shape.record_bytes - len(head) - 3) + '"}\n')
            body = "".join(lines)
            out.write(body)
            written += len(body)
    parts = folder / "parts"
    parts.mkdir()
    count = 0
    with whole.open("rb") as source:
        while chunk := source.read(int(file_mb * MB)):
            (parts / f"part-{count:05d}.jsonl").write_bytes(chunk + source.readline())
            count += 1
    return Input(whole=whole, parts=parts, bytes=written, files=count)


def reference(path: Path) -> Result:
    """The exact answer, in plain Python over the file's lines."""
    acc: dict[str, list[Any]] = {}
    with path.open("rb") as lines:
        for line in lines:
            record = json.loads(line, parse_float=Decimal, parse_int=Decimal)
            value = record["value"]
            row = acc.get(record["key"])
            if row is None:
                acc[record["key"]] = [1, value, value, value, {record["user"]}]
                continue
            row[0] += 1
            row[1] += value
            row[2] = min(row[2], value)
            row[3] = max(row[3], value)
            row[4].add(record["user"])
    return {k: (c, s, lo, hi, len(users)) for k, (c, s, lo, hi, users) in acc.items()}


def from_rows(rows: list[Any]) -> Result:
    return {
        r["key"]: (int(r["count"]), r["sum"], r["min"], r["max"], int(r["distinct"])) for r in rows
    }


@dataclass
class Outcome:
    result: Result
    extra: dict[str, Any] = field(default_factory=dict)


def aggregates(distinct: Any) -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.avg("value").alias("avg"),
        distinct.alias("distinct"),
    ]


def spark_job(data: Input) -> Outcome:
    from pyspark.sql import functions as F

    from sparkjobs.session import spark_session

    frame = spark_session().read.schema(SCHEMA).json(str(data.whole.parent))
    rows = frame.groupBy("key").agg(*aggregates(F.countDistinct("user"))).collect()
    return Outcome(from_rows(rows))


def streaming_job(data: Input, files_per_trigger: int, serial: int) -> Outcome:
    from pyspark.sql import functions as F

    from sparkjobs.session import spark_session

    aggregated = (
        spark_session()
        .readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(str(data.parts))
        .groupBy("key")
        .agg(*aggregates(F.size(F.collect_set("user"))))
    )
    rows, triggers = streamed_to_end(aggregated, f"peers_streaming_{serial}", data.parts.parent)
    return Outcome(from_rows(rows), {"triggers": triggers})


def live_pipeline() -> tuple[Any, dict[str, Any]]:
    """bench_runtime.py's throughput pipeline: its stages in the key form, read as
    ``group_by: [key]`` and six named measures (sparkjobs/key_form.py)."""
    return throughput_pipeline(SEGMENT_MB)


def _measured(values: Mapping[str, Any]) -> tuple[int, Decimal, Decimal, Decimal, int]:
    return (
        int(values["count"]),
        values["sum"],
        values["min"],
        values["max"],
        int(values["distinct_users"]),
    )


def batch_job(data: Input, params: Mapping[str, Any]) -> Outcome:
    from sparkjobs.measures import Grouping
    from sparkjobs.plain_job import batch_grouped
    from sparkjobs.session import spark_session

    grouping = Grouping.of(params)
    if grouping is None:
        raise SystemExit(f"the pipeline's stage names no valid grouping: {params}")
    grouped = batch_grouped(spark_session(), [str(data.whole)], "jsonl", grouping)
    measured = {str(group[0]): _measured(values) for group, values in grouped.rows}
    return Outcome(measured, {"malformed": grouped.malformed})


def live_run(data: Input, doc: Any, policy: dict[str, Any], *, whole: bool) -> Outcome:
    path = data.whole if whole else data.parts / "*.jsonl"
    return ledger_outcome(run_to_end(doc, policy, None, input_path=str(path)))


def ledger_outcome(run: Any) -> Outcome:
    """A finished run's result as the ledger holds it, how the run ended, and its
    operator batches (bench_runtime.operator_batches)."""
    from orchestrator.ledger.groups import restored
    from orchestrator.ledger.results import summary
    from orchestrator.models import ResultGroup
    from orchestrator.pipeline.graph import result_grouping

    # The ledger's own values (Decimal), not the summary's floats.
    grouping = result_grouping(run.topology)
    found = ResultGroup.objects.filter(run=run).values_list("group", "states", "finished")
    rows = {
        str(group[0]): _measured(
            grouping.finish(states) if finished is None else restored(grouping, finished)
        )
        for group, states, finished in found
    }
    done = summary(run)
    return Outcome(
        rows,
        {
            "run": run.pk,
            "status": done["status"],
            "coverage": done["coverage"],
            "malformed": done["malformed_records"],
            "ledger_s": done["seconds"],
            "source_emitted_all_s": emitted_all_s(run),
            "operator_batches": operator_batches(run),
        },
    )


# A part of the machine: a process (and its descendants when ``children``), only the
# JVMs among them or only the others when ``jvm`` says so; as bench_runtime.tree_cpu_s.
Part = tuple[int, bool, bool | None]


def machine_parts(stack: Stack) -> dict[str, Part]:
    import os

    (spark,) = stack.spark  # one Spark worker, as the memory target says
    parts: dict[str, Part] = {
        "bench Python": (os.getpid(), False, None),
        "control worker": (stack.control.pid, True, None),
        "spark worker Python": (spark.pid, True, False),
        "spark worker JVM": (spark.pid, True, True),
        "beat": (stack.beat.pid, True, None),
    }
    services = {s.name: s.process.pid for s in stack.launcher.started if s.process}
    for name, pid in services.items():
        parts[name] = (pid, True, None)
    # This process's other child is the JVM of its own SparkSession (sides a to c).
    known = {c.pid for c in stack.children} | set(services.values())
    jvms = [c.pid for c in psutil.Process().children() if c.pid not in known]
    if len(jvms) != 1:
        raise RuntimeError(f"expected one Spark JVM child of the bench, found {jvms}")
    parts["bench JVM"] = (jvms[0], True, None)
    return parts


def cpu_of(parts: dict[str, Part]) -> dict[str, float]:
    return {name: tree_cpu_s(pid, children=ch, jvm=jvm) for name, (pid, ch, jvm) in parts.items()}


def rss_of(parts: dict[str, Part], *, proportional: bool = False) -> dict[str, int]:
    """Resident memory per part now, from one pass over the process table.

    ``proportional``: each process's PSS instead of its RSS, so that memory shared
    between processes (PostgreSQL's shared buffers, touched by every backend) is
    counted once over the part, not once per process that touched it. Slower (it reads
    every process's smaps): for samples every few seconds, not for peaks."""
    children: dict[int, list[int]] = {}
    rss: dict[int, tuple[int, bool]] = {}
    for proc in psutil.process_iter(["ppid", "name", "memory_info"]):
        memory = proc.info["memory_info"]
        if memory is not None:
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
            rss[proc.pid] = (memory.rss, proc.info["name"] == "java")
    out: dict[str, int] = {}
    for name, (root, with_children, jvm) in parts.items():
        total, pending = 0, [root]
        while pending:
            pid = pending.pop()
            size, is_jvm = rss.get(pid, (0, False))
            if jvm is None or is_jvm == jvm:
                total += _pss(pid) if proportional else size
            if with_children:
                pending.extend(children.get(pid, []))
        out[name] = total
    return out


def _pss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0  # gone since the listing (a backend that closed)


class PeakSampler(threading.Thread):
    """Peak resident memory per part, from one pass over the process table every 0.25 s;
    :meth:`take` returns the peaks since the last call."""

    def __init__(self, parts: dict[str, Part]) -> None:
        super().__init__(daemon=True)
        self.parts = parts
        self.peaks: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            sample = rss_of(self.parts)
            # At one instant, not the sum of each process's own peak: the console's
            # processes (issue 19's memory target), then those and the bench's.
            sample["stack"] = sum(v for k, v in sample.items() if not k.startswith("bench"))
            sample["all"] = sample["stack"] + sum(
                v for k, v in sample.items() if k.startswith("bench")
            )
            with self.lock:
                for name, size in sample.items():
                    self.peaks[name] = max(self.peaks.get(name, 0), size)
            time.sleep(0.25)

    def take(self) -> dict[str, int]:
        with self.lock:
            peaks, self.peaks = self.peaks, {}
        return peaks


def spark_settings() -> dict[str, str]:
    from sparkjobs.session import spark_session

    spark = spark_session()
    names = [
        "spark.master",
        "spark.driver.memory",
        "spark.sql.shuffle.partitions",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.adaptive.enabled",
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold",
        "spark.sql.session.timeZone",
        "spark.sql.streaming.stateStore.providerClass",
    ]
    return {"spark.version": spark.version, **{n: str(spark.conf.get(n)) for n in names}}


def compare(got: Result, want: Result) -> str | None:
    """None when exact, else what differs first."""
    if set(got) != set(want):
        return f"keys differ: {sorted(set(got) ^ set(want))[:5]}"
    for key, row in want.items():
        if got[key] != row:
            return f"{key}: got {got[key]}, want {row}"
    return None


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def peers(args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(args.keys, args.hot_share, args.record_bytes, args.users)
    folder = Path(tempfile.mkdtemp(prefix="bpconsole-peers-"))
    try:
        with Stack(spark_workers=1) as stack:
            from django.conf import settings

            from sparkjobs.session import spark_session

            trigger_mb = args.trigger_mb or settings.BPCONSOLE_BATCH_MB
            files_per_trigger = max(1, round(trigger_mb / args.file_mb))
            doc, policy = live_pipeline()
            params = next(n for n in doc["nodes"] if n["kind"] == "operator")["params"]
            serial = iter(range(10**6))  # a fresh memory-sink name per streaming query
            sides: dict[str, Callable[[Input], Outcome]] = {
                "spark": spark_job,
                "streaming": lambda d: streaming_job(d, files_per_trigger, next(serial)),
                "batch": lambda d: batch_job(d, params),
                "live": lambda d: live_run(d, doc, policy, whole=args.live_input == "whole"),
            }
            began = time.monotonic()
            warm = write_input(
                folder / "warmup", args.warmup_mb, shape, args.seed + 1, args.file_mb
            )
            data = write_input(folder / "input", args.mb, shape, args.seed, args.file_mb)
            generation_s = time.monotonic() - began
            began = time.monotonic()
            want = reference(data.whole)
            reference_s = time.monotonic() - began
            spark_session()  # started before the parts are listed: its JVM is one of them
            parts = machine_parts(stack)
            sampler = PeakSampler(parts)
            sampler.start()
            for run in sides.values():
                run(warm)
            # Whole rounds on the input itself: after the small warm-up alone the live
            # worker's JVM ran its first 512 MB job partly in code the JIT had not yet
            # compiled at its top tier (21.6 CPU s, against 14.6 to 16.9 in the rounds
            # after it), as a worker that has run for a minute no longer does. In a
            # round the bench's JVM runs three sides' jobs over the input and the live
            # worker's JVM one, so the live side runs once per side of the bench's JVM:
            # with one run a round its times still fell through five timed rounds
            # (4.33 to 3.82 s on 512 MB) while the others' did not (docs/benchmarks.md,
            # "2026-12-02 (late night)").
            warmup_s: dict[str, list[float]] = {side: [] for side in SIDES}
            for _ in range(args.warmup_rounds):
                for side in SIDES:
                    for _ in range(len(IN_THIS_JVM) if side == "live" else 1):
                        began = time.monotonic()
                        sides[side](data)
                        warmup_s[side].append(round(time.monotonic() - began, 2))
            sampler.take()
            records: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
            for round_ in range(args.rounds):
                order = SIDES[round_ % len(SIDES) :] + SIDES[: round_ % len(SIDES)]
                for side in order:
                    cpu_before = cpu_of(parts)
                    began = time.monotonic()
                    outcome = sides[side](data)
                    seconds = time.monotonic() - began
                    cpu_after = cpu_of(parts)
                    wrong = compare(outcome.result, want)
                    if side == "live" and outcome.extra["coverage"] != "exact":
                        wrong = f"coverage {outcome.extra['coverage']}"
                    records[side].append(
                        {
                            "round": round_ + 1,
                            "position": order.index(side) + 1,
                            "seconds": round(seconds, 2),
                            "exact": wrong is None,
                            "difference": wrong,
                            "cpu_s": {k: round(cpu_after[k] - cpu_before[k], 1) for k in parts},
                            "peak_rss_mb": {k: round(v / MB) for k, v in sampler.take().items()},
                            **outcome.extra,
                        }
                    )
            sampler.stop.set()
            sampler.join()
            settings_shown = spark_settings()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary: dict[str, Any] = {}
    for side, rounds in records.items():
        seconds = median([r["seconds"] for r in rounds])
        summary[side] = {
            "median_s": seconds,
            "mb_s": round(data.mb / seconds, 1),
            "seconds": [r["seconds"] for r in rounds],
            "exact": all(r["exact"] for r in rounds),
            "cpu_s_median": {k: median([r["cpu_s"][k] for r in rounds]) for k in parts},
            "peak_rss_mb": {
                k: max(r["peak_rss_mb"].get(k, 0) for r in rounds) for k in [*parts, "stack", "all"]
            },
        }
    times = {side: summary[side]["median_s"] for side in SIDES}
    return {
        "input": {
            "mb": round(data.mb, 1),
            "records": sum(row[0] for row in want.values()),
            "keys": len(want),
            "hot_share": args.hot_share,
            "record_bytes": args.record_bytes,
            "users": args.users,
            "seed": args.seed,
            "cut_files": data.files,
            "file_mb": args.file_mb,
            "live_input": args.live_input,
        },
        "generation_s": round(generation_s, 1),
        "reference_s": round(reference_s, 1),
        "warmup_mb": args.warmup_mb,
        "warmup_rounds_s": warmup_s,
        "rounds": args.rounds,
        "streaming_files_per_trigger": files_per_trigger,
        "spark_settings": settings_shown,
        "sides": summary,
        # Throughput ratios: the first side's MB/s over the second's.
        "ratios": {
            "live/spark": round(times["spark"] / times["live"], 3),
            "live/streaming": round(times["streaming"] / times["live"], 3),
            "batch/spark": round(times["spark"] / times["batch"], 3),
        },
        "per_round": records,
    }


def table(result: dict[str, Any]) -> str:
    sides = result["sides"]
    lines = [
        f"input: {result['input']}",
        f"spark settings (a, b, c): {result['spark_settings']}",
        f"streaming: {result['streaming_files_per_trigger']} files per trigger",
        f"warm-up rounds on the input, untimed, s: {result['warmup_rounds_s']}",
        "",
        "| side | median s | MB/s | rounds s | exact | CPU s (all processes) "
        "| peak RSS MB (all) | peak RSS MB (console's processes) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side, s in sides.items():
        cpu = round(sum(s["cpu_s_median"].values()), 1)
        lines.append(
            f"| {side} | {s['median_s']} | {s['mb_s']} | {s['seconds']} | {s['exact']} "
            f"| {cpu} | {s['peak_rss_mb']['all']} | {s['peak_rss_mb']['stack']} |"
        )
    lines += ["", f"throughput ratios: {result['ratios']}", ""]
    names = list(next(iter(sides.values()))["cpu_s_median"])
    lines.append("| process | " + " | ".join(f"{side} CPU s / peak MB" for side in sides) + " |")
    lines.append("|---|" + "---|" * len(sides))
    for name in names:
        cells = [
            f"{s['cpu_s_median'][name]} / {s['peak_rss_mb'].get(name, 0)}" for s in sides.values()
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=1024.0, help="input size")
    parser.add_argument("--keys", type=int, default=243)
    parser.add_argument("--hot-share", type=float, default=0.35, help="records on one key")
    parser.add_argument("--record-bytes", type=int, default=150, help="padded record size")
    parser.add_argument("--users", type=int, default=1000, help="distinct user values")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--file-mb", type=float, default=8.0, help="cut files for (b), (d)")
    parser.add_argument(
        "--live-input",
        choices=("files", "whole"),
        default="files",
        help="(d) over the cut files (default) or the one file",
    )
    parser.add_argument(
        "--trigger-mb", type=float, help="(b) per trigger; default BPCONSOLE_BATCH_MB"
    )
    parser.add_argument("--warmup-mb", type=float, default=64.0)
    parser.add_argument(
        "--warmup-rounds", type=int, default=1, help="untimed rounds on the input itself"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = peers(args)
    print(json.dumps(result, indent=2, default=str) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
