"""One operator batch against the batch job, on the same bytes, in one Spark session.

    .venv/bin/python bench/bench_operator_job.py [--mb 64] [--segments 8]

Isolates the Spark side of the streaming pipeline: the partial-aggregate job over a
batch of segments (what a worker runs) against the plain batch job over the same input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_runtime import tree_cpu_s  # this script's own folder, first on sys.path

from orchestrator.pipeline.generator import GeneratorSpec, write_input
from sparkjobs.aggregate import AggregateParams, partial_aggregate
from sparkjobs.plain_job import batch_aggregate
from sparkjobs.session import operator_session, spark_session


def jvm_cpu_s() -> float:
    """CPU seconds of the session's JVM, a child of this process."""
    return tree_cpu_s(os.getpid(), jvm=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bpconsole-opjob-"))
    source = folder / "input.jsonl"
    write_input(source, GeneratorSpec(volume_mb=args.mb, dominance=0), ["a", "b", "c"], 8.0)
    data = source.read_bytes()
    step, position, segments = len(data) // args.segments, 0, {}
    for index in range(args.segments):
        end = len(data) if index == args.segments - 1 else data.index(b"\n", position + step) + 1
        path = folder / f"seg{index}.jsonl"
        path.write_bytes(data[position:end])
        segments[f"seg{index}"] = path
        position = end
    outputs = {name: folder / "out" / f"{name}.jsonl" for name in segments}
    spark = spark_session()
    batch_aggregate(spark, [str(source)], "jsonl", AggregateParams())  # warm the session
    largest = max(path.stat().st_size for path in segments.values())
    for _ in range(args.repeat):
        began, cpu = time.monotonic(), jvm_cpu_s()
        partial_aggregate(operator_session(largest), segments, outputs, AggregateParams())
        operator_s, operator_cpu = time.monotonic() - began, jvm_cpu_s() - cpu
        began, cpu = time.monotonic(), jvm_cpu_s()
        batch_aggregate(spark, [str(source)], "jsonl", AggregateParams())
        batch_s, batch_cpu = time.monotonic() - began, jvm_cpu_s() - cpu
        print(
            f"{len(data) / 2**20:.0f} MB: operator job {operator_s:.2f} s "
            f"({operator_cpu:.1f} CPU s), batch job {batch_s:.2f} s ({batch_cpu:.1f} CPU s), "
            f"ratio {batch_s / operator_s:.2f}"
        )
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
