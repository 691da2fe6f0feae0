"""One operator batch against the batch job, on the same bytes, in one Spark session.

    .venv/bin/python bench/bench_operator_job.py [--mb 64] [--segments 8] [--repeat 3] [--peers]
        [--together] [--key-slots LOW,HIGH] [--quota CORES]
    .venv/bin/python bench/bench_operator_job.py --plans 0.5,2,4,8,16,64 [--segments 8] [--peers]

Isolates the Spark side of the streaming pipeline: the operator job over a batch of
segments (what a worker runs: sparkjobs/grouped.py ``grouped_partials``) against the
plain batch job over the same input (``batch_grouped``, as ``run_pipeline --batch`` runs
it). Both compute the reference pipeline's query: a stage's parameters in the key form,
left to their defaults (sparkjobs/key_form.py), read as ``group_by: [key]`` and six named
measures of ``value`` and ``user``.

The input is the console's generator's (400 users), or with ``--peers`` bench_peers.py's
(1,000 users over 243 keys, 35% of the records on one, padded to 150 bytes), cut into
``--segments`` segments. Each segment holds its own partials, or with ``--together`` the
first holds the whole batch's, as in a live run's batch of a stage's siblings (their
segments go to the same sink: orchestrator/worker/batch.py ``_together``).

With ``--plans``, the operator job alone at each batch size (MB), in its two plans, one
after the other ``--repeat`` times after a warm-up: in one task (the batch coalesced to
one partition, no exchange) and in parallel (a task per core or segment, an exchange).
``BPCONSOLE_SPARK_ONE_TASK_MB`` picks the plan (sparkjobs/session.py ``in_one_task``); both
plans' outputs must be byte for byte the same. Medians per plan; where one task is
faster is where the console's threshold belongs.

With ``--key-slots LOW,HIGH`` the operator job keeps only the keys whose slot is in
``[LOW, HIGH)``, as an instance of a keyed stage does with its key group (every
instance reads every segment: sparkjobs/keygroups.py); each line says what share of the
batch's records it kept, so that runs over different ranges show how much of a keyed
instance's batch depends on its share.

With ``--quota CORES`` the bench runs (either mode) inside a cgroup whose CFS quota is
that many cores, as a placed Spark worker does in bench_real_balance.py: the Python
process and its JVM share the quota, the JVM's own threads (JIT, GC) included. Not root,
or no cpu controller: one line says why and the bench exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_peers import Shape
from bench_peers import write_input as peers_input
from bench_real_balance import quota_list, with_quotas
from bench_runtime import tree_cpu_s  # this script's own folder, first on sys.path

from orchestrator.pipeline.generator import GeneratorSpec, write_input
from orchestrator.services.cpu_quota import CpuQuotas
from sparkjobs.grouped import grouped_partials
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup
from sparkjobs.measures import Grouping
from sparkjobs.plain_job import batch_grouped
from sparkjobs.session import operator_session, spark_session

# Set in the bench's own process inside the cgroup ``--quota`` made.
IN_QUOTA = "BPCONSOLE_BENCH_IN_QUOTA"

# bench_peers.py's default input.
PEERS_SHAPE = Shape(keys=243, hot_share=0.35, record_bytes=150, users=1000)


def reference_grouping() -> Grouping:
    """The reference pipeline's grouping: a stage of the key form's defaults."""
    grouping = Grouping.of({})
    if grouping is None:
        raise SystemExit("the key form's defaults name no valid grouping")
    return grouping


def jvm_cpu_s() -> float:
    """CPU seconds of the session's JVM, a child of this process."""
    return tree_cpu_s(os.getpid(), jvm=True)


def generated_batch(
    folder: Path, mb: float, count: int, *, peers: bool = False
) -> tuple[Path, dict[str, Path]]:
    """``mb`` of generated input in ``folder`` (the generator's, or bench_peers.py's
    with ``peers``), as one file and cut at line ends into ``count`` segments."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "input.jsonl"
    if peers:
        written = peers_input(folder / "peers", mb, PEERS_SHAPE, seed=1, file_mb=mb)
        written.whole.rename(source)
    else:
        write_input(source, GeneratorSpec(volume_mb=mb, dominance=0), ["a", "b", "c"], 8.0)
    data = source.read_bytes()
    # The generator writes whole 8 MB packets: a smaller batch is its first mb.
    if len(data) > mb * 2**20:
        data = data[: data.index(b"\n", int(mb * 2**20) - 1) + 1]
        source.write_bytes(data)
    step, position, segments = len(data) // count, 0, {}
    for index in range(count):
        end = len(data) if index == count - 1 else data.index(b"\n", position + step) + 1
        path = folder / f"seg{index}.jsonl"
        path.write_bytes(data[position:end])
        segments[f"seg{index}"] = path
        position = end
    return source, segments


# BPCONSOLE_SPARK_ONE_TASK_MB for each plan: a batch of at most that goes in one task.
PLANS = {"one task": "1024", "in parallel": "0"}


def compare_plans(sizes_mb: list[float], count: int, repeat: int, *, peers: bool) -> None:
    """The operator job in each plan at each batch size (see the module's docstring)."""
    grouping = reference_grouping()
    for mb in sizes_mb:
        folder = Path(tempfile.mkdtemp(prefix="bpconsole-plans-"))
        _, segments = generated_batch(folder, mb, count, peers=peers)
        sizes = [path.stat().st_size for path in segments.values()]
        times: dict[str, list[float]] = {plan: [] for plan in PLANS}
        written: dict[str, dict[str, bytes]] = {}
        # Warm-up rounds: the first size's warm the new JVM's code as well.
        warm = 10 if mb == sizes_mb[0] else 2
        for round_ in range(repeat + warm):
            for plan, one_task_mb in PLANS.items():
                os.environ["BPCONSOLE_SPARK_ONE_TASK_MB"] = one_task_mb
                outputs = {name: folder / plan / f"{name}.jsonl" for name in segments}
                began = time.monotonic()
                grouped_partials(operator_session(sizes), segments, outputs, grouping)
                if round_ >= warm:
                    times[plan].append(time.monotonic() - began)
                written[plan] = {name: path.read_bytes() for name, path in outputs.items()}
        if written["one task"] != written["in parallel"]:
            raise SystemExit(f"{mb:g} MB: the two plans' outputs differ")
        medians = {plan: statistics.median(t) for plan, t in times.items()}
        print(
            f"{mb:g} MB in {count} segments: "
            + ", ".join(f"{plan} {median:.3f} s" for plan, median in medians.items())
            + f" (one task / parallel {medians['one task'] / medians['in parallel']:.2f})",
            flush=True,
        )
        shutil.rmtree(folder, ignore_errors=True)


def key_slots(text: str) -> KeyGroup:
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"two slots, LOW,HIGH: {text!r}") from None
    if not 0 <= low < high <= KEY_SLOTS:
        raise argparse.ArgumentTypeError(f"0 <= LOW < HIGH <= {KEY_SLOTS}: {text!r}")
    return KeyGroup(low, high)


def in_quota(quota: float) -> int:
    """This bench again, with the same arguments, inside a cgroup allowed ``quota``
    cores (removed afterwards); its exit code, or 2 when no cgroup could be made."""
    argv = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]

    def run(quotas: CpuQuotas, cgroups: list[str]) -> dict[str, int]:
        done = subprocess.run(
            quotas.launch_argv(cgroups[0], argv), env=os.environ | {IN_QUOTA: "1"}, check=False
        )
        return {"returncode": done.returncode}

    result = with_quotas("operator-job", [quota], run)
    return 2 if result is None else result["returncode"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", action="store_true", help="bench_peers.py's input")
    parser.add_argument("--plans", help="compare the two plans at these batch sizes, MB")
    parser.add_argument(
        "--together", action="store_true", help="one partial for the batch, in its first segment"
    )
    parser.add_argument(
        "--key-slots", type=key_slots, help="keep only the keys of these slots, LOW,HIGH"
    )
    parser.add_argument(
        "--quota", type=quota_list, help="run inside a cgroup allowed this many cores (root)"
    )
    args = parser.parse_args()
    if args.plans and args.key_slots is not None:
        parser.error("--key-slots is for the operator job against the batch job")
    if args.quota is not None and len(args.quota) != 1:
        parser.error("--quota is one number of cores")
    if args.quota is not None and os.environ.get(IN_QUOTA) != "1":
        return in_quota(args.quota[0])
    if args.plans:
        sizes = [float(mb) for mb in args.plans.split(",")]
        compare_plans(sizes, args.segments, args.repeat, peers=args.peers)
        return 0
    compare_jobs(args)
    return 0


def records_kept(outputs: Iterable[Path]) -> int:
    """The records the operator job's partials hold: each partial line's ``n``."""
    return sum(
        int(json.loads(line)["n"]) for out in outputs for line in out.read_text().splitlines()
    )


def compare_jobs(args: argparse.Namespace) -> None:
    """The operator job against the batch job, ``--repeat`` times (the module's
    docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="bpconsole-opjob-"))
    source, segments = generated_batch(folder, args.mb, args.segments, peers=args.peers)
    data = source.read_bytes()
    records = data.count(b"\n")
    outputs = {name: folder / "out" / f"{name}.jsonl" for name in segments}
    spark = spark_session()
    file_sizes = [path.stat().st_size for path in segments.values()]
    holder = min(segments)
    together = {name: holder for name in segments} if args.together else None
    grouping = reference_grouping()

    def operator_job() -> None:
        grouped_partials(
            operator_session(file_sizes),
            segments,
            outputs,
            grouping,
            together=together,
            key_group=args.key_slots,
        )

    def batch_job() -> None:
        batch_grouped(spark, [str(source)], "jsonl", grouping)

    batch_job()  # warm the session
    for _ in range(args.repeat):
        began, cpu = time.monotonic(), jvm_cpu_s()
        operator_job()
        operator_s, operator_cpu = time.monotonic() - began, jvm_cpu_s() - cpu
        kept = records_kept(outputs.values())
        began, cpu = time.monotonic(), jvm_cpu_s()
        batch_job()
        batch_s, batch_cpu = time.monotonic() - began, jvm_cpu_s() - cpu
        print(
            f"{len(data) / 2**20:.0f} MB: operator job {operator_s:.2f} s "
            f"({operator_cpu:.1f} CPU s), batch job {batch_s:.2f} s ({batch_cpu:.1f} CPU s), "
            f"ratio {batch_s / operator_s:.2f}; kept {kept / records:.1%} of the records"
        )
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
