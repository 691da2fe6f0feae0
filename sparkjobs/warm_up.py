"""A Spark worker's new JVM, warmed on generated records before its first batch.

A JVM runs Spark's planning, code generation and a batch's per-record code interpreted
until its JIT has seen them often, and a placed worker on a small CPU share runs only a
few batches a run: on a quarter core a new JVM's 8 MB aggregate batches took 33, 8.9,
3.4, 3.2 and 2.5 s and then about 2.3 s, and after this module's four rounds 6.8, 3.2
and then 1.2 to 1.7 s (docs/benchmarks.md, "A worker's JVM warmed while idle"). Its
first run's batches were its slowest, and the balancer measured its capacity from them.

So a Spark worker's main process starts this module in a process of its own once its
JVM is up (``sparkjobs/shared_jvm.py``, ``WorkerJvm``): it attaches to the JVM as a
pool process does, tags its jobs with its pid and runs ``rounds`` rounds of the jobs a
worker runs, on generated records in a folder of its own beside the JVM's file.
It yields to work: a pool process that starts a batch stops it and cancels its jobs
(``shared_jvm.stop_warm_up``), so a batch never waits for more than that. What it did
is kept beside the JVM's file (``shared_jvm.WarmUp``): warming, warm, or stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# Records per generated segment: enough for the per-record code to be compiled too.
RECORDS = 20_000
# The grouped measures' job (sparkjobs/grouped.py), as a user's own query runs it.
_MEASURES = {
    "group_by": ["key"],
    "measures": [
        {"name": "count", "fn": "count"},
        {"name": "sum", "fn": "sum", "field": "value"},
        {"name": "max", "fn": "max", "field": "value"},
        {"name": "users", "fn": "count_distinct", "field": "user"},
    ],
}


def write_records(folder: Path, count: int = RECORDS) -> dict[str, Path]:
    """Two generated segments of ``count`` records each (one malformed line in each,
    as a quarantine's path is code too), by segment id."""
    segments = {}
    for index in (1, 2):
        path = folder / f"seg-{index:06d}.jsonl"
        lines = [
            json.dumps({"key": f"k{i % 97}", "value": i / 4, "user": f"u{i % 331}"})
            for i in range(index, count + index)
        ]
        path.write_text("\n".join([*lines, "not json", '{"key": 1}']) + "\n")
        segments[path.stem] = path
    return segments


def one_round(folder: Path) -> int:
    """Run, on generated records, the batches a worker runs: the key form per segment
    and together, a keyed part, other grouped measures, a filter and a projection.
    Returns the jobs run."""
    from sparkjobs.grouped import aggregate_batch
    from sparkjobs.keygroups import KeyGroup
    from sparkjobs.session import operator_session
    from sparkjobs.transform import record_batch

    inputs = write_records(folder)
    first = next(iter(inputs))
    spark = operator_session([path.stat().st_size for path in inputs.values()])

    def outputs(name: str) -> dict[str, Path]:
        return {seg: folder / f"{seg}.{name}" for seg in inputs}

    together = {seg: first for seg in inputs}
    jobs: list[Callable[[], object]] = [
        lambda: aggregate_batch(spark, "aggregate", {}, inputs, outputs("a"), key_group=None),
        lambda: aggregate_batch(
            spark, "aggregate", {}, inputs, outputs("t"), key_group=None, together=together
        ),
        lambda: aggregate_batch(
            spark, "running", {}, inputs, outputs("k"), key_group=KeyGroup.even(1, 2)
        ),
        lambda: aggregate_batch(
            spark, "aggregate", _MEASURES, inputs, outputs("m"), key_group=None
        ),
        lambda: record_batch(spark, "filter", {"condition": "value > 10"}, inputs, outputs("f")),
        lambda: record_batch(
            spark, "project", {"columns": ["key", "value * 2 AS value"]}, inputs, outputs("p")
        ),
    ]
    for job in jobs:
        job()
    return len(jobs)


def warm(rounds: int, folder: Path) -> tuple[int, float]:
    """``rounds`` rounds in this process's Spark session, its jobs tagged with its pid,
    on records in ``folder`` (the owner's only; removed after); the jobs run and the
    seconds they took."""
    from sparkjobs.session import operator_session, tag_jobs

    began = time.monotonic()
    tag_jobs(operator_session())
    jobs = 0
    folder.mkdir(mode=0o700, exist_ok=True)
    try:
        for _ in range(rounds):
            jobs += one_round(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return jobs, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    from sparkjobs import shared_jvm

    parser = argparse.ArgumentParser(description="Warm a Spark worker's JVM while it is idle.")
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    path = shared_jvm.info_path()
    info = None if path is None else shared_jvm.read_info(path)
    if path is None or info is None:
        log.error("no worker JVM to warm: %s is not set or names no JVM", shared_jvm.INFO_ENV)
        return 2
    jobs, seconds = warm(args.rounds, shared_jvm.warm_up_folder(path, info.pid))
    shared_jvm.warm_up_done(path, info.pid, jobs=jobs, seconds=seconds)
    log.info("Spark JVM %s warmed: %d jobs in %.1f s", info.pid, jobs, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
