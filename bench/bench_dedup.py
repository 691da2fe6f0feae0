"""A deduplicate stage against the idiomatic Spark job: the same records, redelivered
ones dropped, then counted and summed per key.

    .venv/bin/python bench/bench_dedup.py [--mb 256] [--rounds 2] [--again 3] [--keys 50]
        [--files-per-trigger 7]

One generated JSON-lines input of records ``{"id", "key", "value", "pad"}``: every
``--again``-th record delivered a second time further on (a third by default). Per key:
the records counted once and the sum of their values, computed by

(a) spark: the idiomatic Spark batch job in this process's SparkSession (built as a
    worker builds its own), ``spark.read.schema(...).json(file)``, then
    ``dropDuplicates(["id"]).groupBy("key").agg(count, sum)``, collected;
(b) streaming: Structured Streaming, the same query (``dropDuplicates`` keeps every id
    in its state store, as a stream's exact deduplication must) over the same records
    cut into files of the live source's segment size, file source with the same
    schema, ``maxFilesPerTrigger`` as many files as a live batch takes
    (``--files-per-trigger``), ``trigger(availableNow=True)``, complete mode to the
    memory sink, a fresh checkpoint folder each time;
(c) batch: our plain job (``run_pipeline --batch``) over the same file;
(d) live: a run of source -> deduplicate (``fields: [id]``) -> aggregate -> sink on the
    embedded stack (bench_runtime.py's, one Spark worker), no emulation knob set.

One untimed warm-up of every side on a ``--warmup-mb`` input, then ``--rounds`` rounds,
the sides in a rotating order. Times: (a) to (c) from the call to the rows collected;
(d) the run's own start to finish. Every side's rows are checked against a pure-Python
computation over the file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_runtime import Stack, run_to_end, streamed_to_end  # noqa: E402

SIDES = ("spark", "streaming", "batch", "live")
SCHEMA = "id string, key string, value decimal(38,10), pad string"
SEGMENT_MB = 8.0  # the live source's segments, and the streaming side's files
Rows = dict[str, tuple[int, Decimal]]


def write_input(path: Path, mb: float, *, keys: int, again: int, seed: int) -> Rows:
    """Records up to ``mb`` MB, every ``again``-th delivered a second time at the end;
    the expected rows (per key: records counted once, their values' sum)."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    pad = "x" * 60
    lines: list[str] = []
    expected: dict[str, tuple[int, Decimal]] = {}
    written = 0
    i = 0
    while written < mb * 2**20:
        key = f"key-{rng.randrange(keys):03d}"
        value = Decimal(rng.randrange(-(10**6), 10**6)) / 100
        line = json.dumps({"id": f"r{i}", "key": key, "value": float(value), "pad": pad})
        lines.append(line)
        count, total = expected.get(key, (0, Decimal(0)))
        expected[key] = (count + 1, total + value)
        written += len(line) + 1
        i += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for line in [*lines, *lines[::again]]:
            out.write(line + "\n")
    return expected


def pipeline() -> dict[str, Any]:
    return {
        "name": "bench-dedup",
        "nodes": [
            {
                "name": "source",
                "kind": "source",
                "params": {
                    "format": "jsonl",
                    "route_by": "key",
                    "segment_mb": SEGMENT_MB,
                    "schema": "id string, key string, value double, pad string",
                },
            },
            {
                "name": "once",
                "kind": "operator",
                "operator": "deduplicate",
                "params": {"fields": ["id"]},
            },
            {
                "name": "agg",
                "kind": "operator",
                "operator": "aggregate",
                "params": {
                    "group_by": ["key"],
                    "measures": [
                        {"name": "n", "fn": "count"},
                        {"name": "total", "fn": "sum", "field": "value"},
                    ],
                },
            },
            {"name": "output", "kind": "sink", "operator": "merge"},
        ],
        "edges": [
            {"from": "source", "to": "once"},
            {"from": "once", "to": "agg"},
            {"from": "agg", "to": "output"},
        ],
    }


POLICY = {"routing": "water_level", "migration": "off", "throttling": "none"}


def spark_side(path: Path) -> tuple[float, Rows]:
    from pyspark.sql import functions as F

    from sparkjobs.session import spark_session

    spark = spark_session()
    began = time.monotonic()
    frame = spark.read.schema(SCHEMA).json(str(path))
    rows = (
        frame.dropDuplicates(["id"])
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))
        .collect()
    )
    seconds = time.monotonic() - began
    return seconds, {r["key"]: (int(r["n"]), Decimal(r["total"]).normalize()) for r in rows}


def cut(path: Path, file_mb: float) -> Path:
    """``path``'s lines cut into files of about ``file_mb`` MB, in a folder of their own
    beside it (made once)."""
    folder = path.with_name(f"{path.stem}-parts")
    if folder.exists():
        return folder
    folder.mkdir()
    data = path.read_bytes()
    step, position, index = int(file_mb * 2**20), 0, 0
    while position < len(data):
        end = data.find(b"\n", min(position + step, len(data) - 1)) + 1 or len(data)
        (folder / f"part-{index:05d}.jsonl").write_bytes(data[position:end])
        position, index = end, index + 1
    return folder


def streaming_side(path: Path, files_per_trigger: int) -> tuple[float, Rows]:
    from pyspark.sql import functions as F

    from sparkjobs.session import spark_session

    parts = cut(path, SEGMENT_MB)
    began = time.monotonic()
    aggregated = (
        spark_session()
        .readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(str(parts))
        .dropDuplicates(["id"])
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))
    )
    rows, _ = streamed_to_end(aggregated, f"dedup_streaming_{time.monotonic_ns()}", path.parent)
    seconds = time.monotonic() - began
    return seconds, {r["key"]: (int(r["n"]), Decimal(r["total"]).normalize()) for r in rows}


def batch_side(path: Path) -> tuple[float, Rows]:
    from orchestrator.worker.plain_job import batch_summary

    began = time.monotonic()
    result = batch_summary(topology=pipeline(), input_path=str(path), generator=None)  # type: ignore[arg-type]
    seconds = time.monotonic() - began
    return seconds, _rows(result["rows"])


def live_side(path: Path) -> tuple[float, Rows]:
    from orchestrator.ledger.results import summary

    run = run_to_end(pipeline(), POLICY, None, input_path=str(path))  # type: ignore[arg-type]
    result = summary(run)
    if result["coverage"] != "exact":
        raise RuntimeError(f"run {run.pk} ended {result['status']}: {result['error']}")
    return (run.finished_at - run.started_at).total_seconds(), _rows(result["rows"])


def _rows(rows: list[dict[str, Any]]) -> Rows:
    return {str(r["key"]): (int(r["n"]), Decimal(str(r["total"])).normalize()) for r in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--again", type=int, default=3, help="every n-th record twice")
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--warmup-mb", type=float, default=32.0)
    parser.add_argument(
        "--files-per-trigger",
        type=int,
        default=7,
        help="Structured Streaming's maxFilesPerTrigger (a live batch takes 7 segments here)",
    )
    args = parser.parse_args()
    with Stack(1) as stack:
        inputs = stack.var / "inputs"
        warm = inputs / "warm.jsonl"
        write_input(warm, args.warmup_mb, keys=args.keys, again=args.again, seed=2)
        path = inputs / "redelivered.jsonl"
        expected = write_input(path, args.mb, keys=args.keys, again=args.again, seed=1)
        want = {k: (n, total.normalize()) for k, (n, total) in expected.items()}
        sides: dict[str, Callable[[Path], tuple[float, Rows]]] = {
            "spark": spark_side,
            "streaming": lambda p: streaming_side(p, args.files_per_trigger),
            "batch": batch_side,
            "live": live_side,
        }
        for side in SIDES:
            sides[side](warm)
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        exact = dict.fromkeys(SIDES, True)
        for number in range(args.rounds):
            order = SIDES[number % len(SIDES) :] + SIDES[: number % len(SIDES)]
            for side in order:
                seconds, rows = sides[side](path)
                times[side].append(round(seconds, 2))
                exact[side] = exact[side] and rows == want
        mb = path.stat().st_size / 2**20
        print(
            f"input: {mb:.0f} MB, {sum(n for n, _ in want.values())} records once, "
            f"every {args.again}th twice, {args.keys} keys"
        )
        print("| side | median s | MB/s | rounds s | exact | x Spark job |")
        print("|---|---|---|---|---|---|")
        spark_s = statistics.median(times["spark"])
        for side in SIDES:
            median = statistics.median(times[side])
            print(
                f"| {side} | {median:.2f} | {mb / median:.1f} | {times[side]} | {exact[side]} "
                f"| {spark_s / median:.2f} |"
            )
    return 0 if all(exact.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
