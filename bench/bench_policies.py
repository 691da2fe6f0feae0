"""Every balancing policy live, on the reference topology, against the live fluid bound.

    .venv/bin/python bench/bench_policies.py [--mb 128] [--seed 1] [--scale 4] [--buffer-mb 8]
        [--dominance 0.8] [--skew-mean-s 20] [--rounds 1]
        [--policies credit,pressure,ours] [--spark-workers 1|2] [--plot PNG]
        [--replay-out FILE] [--json]

The reference topology (webapp/console/topologies/reference.yaml) with every link's
bandwidth divided by ``--scale`` and every buffer set to ``--buffer-mb``, on the
project's embedded stack with one Spark worker. One generated input (the generator's
seed, volume and skew as options) is run once per policy per round, the policies'
order rotating by one each round, after a warm-up run. The policies are the simulator's
(``balancer.sim.control.BENCHMARK_POLICIES``), so the two benchmarks compare the same
arms.

Per run: completion (the ledger's start to finish), the completed share of the input
every second (merged chunks' input bytes, from the ledger), segments migrated, and
exactness: the run's rows equal the plain Spark batch job's over the same file, and
its merged chunks tile the input once.

The **live fluid bound**: no policy can finish before the input has crossed the
topology at its max flow. Operators shrink their data (an aggregation sends on a few
per cent of what it reads), so max flow is counted in the source's bytes with each
operator's reduction as measured in these runs (output bytes over input bytes, the
median over runs): ``balancer.sim.bound.reduced_max_flow``. The input is a file, all
of it there at the start, so the bound is its size over that rate
(``schedule_bound`` with one arrival at 0).

The **simulator's prediction**: a runtime model fitted to the runs' batches (fixed cost
and rate of an operator batch on the shared Spark worker, the sink's merges, the
reductions; ``balancer.sim.calibration``) and the input's chunks as the source cut them
make a replay (``balancer.sim.replay``), on which every policy runs in virtual time;
each policy's prediction is set beside its live median. The prediction has the live
ranking when it orders every two policies whose rounds do not overlap as they finished
(``balancer.sim.ranking``); the order of the medians is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_runtime import Stack, run_to_end  # noqa: E402
from bench_unbounded import Source, exactness, start_unbounded, stop_run  # noqa: E402

from balancer.document import PipelineDocument  # noqa: E402
from balancer.sim.bound import reduced_max_flow  # noqa: E402
from balancer.sim.calibration import BatchSample, fit_runtime  # noqa: E402
from balancer.sim.control import BENCHMARK_POLICIES  # noqa: E402
from balancer.sim.engine import SimResult  # noqa: E402
from balancer.sim.ranking import check_ranking  # noqa: E402
from balancer.sim.replay import Replay  # noqa: E402
from balancer.sim.workload import Workload  # noqa: E402
from balancer.units import MB  # noqa: E402

REFERENCE = ROOT / "webapp" / "console" / "topologies" / "reference.yaml"
WARMUP_MB = 16


def reference_document(scale: float, buffer_mb: float) -> PipelineDocument:
    """The reference pipeline with its links ``scale`` times narrower and its buffers
    ``buffer_mb`` each."""
    doc: PipelineDocument = yaml.safe_load(REFERENCE.read_text())
    doc["name"] = f"reference-scaled-{scale:g}"
    for node in doc["nodes"]:
        node["buffer_mb"] = buffer_mb
    for edge in doc.get("edges", []):
        edge["bandwidth_mbps"] = float(edge.get("bandwidth_mbps", 0)) / scale
    return doc


def completed_share(run: Any, every_s: float = 1.0) -> list[tuple[float, float]]:
    """The share of the input merged by the sink at each ``every_s`` since the start
    (of a run that merged all of its input: a file's or a stream's)."""
    from orchestrator.models import MergedChunk
    from sparkjobs.keygroups import KEY_SLOTS

    rows = sorted(
        MergedChunk.objects.filter(run=run).values_list(
            "merged_at", "origin_length", "slots_from", "slots_to"
        )
    )
    times = np.array([(at - run.started_at).total_seconds() for at, *_ in rows])
    sizes = np.array([length * (high - low) / KEY_SLOTS for _, length, low, high in rows])
    total = float(sizes.sum())
    done = np.cumsum(sizes) / total if total else np.zeros(len(rows))
    end = float(times[-1]) if len(times) else 0.0
    points = []
    for step in range(int(np.ceil(end / every_s)) + 1):
        t = step * every_s
        index = int(np.searchsorted(times, t, side="right"))
        points.append((t, float(done[index - 1]) if index else 0.0))
    return points


@dataclass(frozen=True)
class Trial:
    """One live run of a policy: its completion, whether it was exact, and for a stream
    when each entry was added (seconds after the first)."""

    run: Any
    completion_s: float
    exact: bool
    entry_times: tuple[float, ...] = ()


class FileInput:
    """The generated input as one file, all of it there when the run starts; each run
    compared with the plain Spark job over the file."""

    def __init__(self, doc: PipelineDocument, args: argparse.Namespace) -> None:
        fields = f"dominance={args.dominance},skew_mean_s={args.skew_mean_s}"
        self.doc, self.seed, self.fields = doc, args.seed, fields
        self.generator = f"seed={args.seed},volume_mb={args.mb},{fields}"
        self.label = self.generator

    def prepare(self, warm_policy: dict[str, Any]) -> None:
        from orchestrator.worker.plain_job import batch_summary, generated_input

        run_to_end(
            self.doc, warm_policy, f"seed={self.seed + 1},volume_mb={WARMUP_MB},{self.fields}"
        )
        generated_input(self.doc, self.generator)
        self.plain = batch_summary(topology=self.doc, input_path=None, generator=self.generator)

    def run(self, policy: dict[str, Any]) -> Trial:
        from orchestrator.ledger.results import summary

        run = run_to_end(self.doc, policy, self.generator)
        result = summary(run)
        exact = result["rows"] == self.plain["rows"] and result["coverage"] == "exact"
        return Trial(run, float(result["seconds"] or 0.0), exact and run.status == "completed")


class BurstyStream:
    """A Redis stream the producer fills while the run reads it: ``--mb`` of records
    (35% of them on one hot key) at a mean of ``--bursty-mb-s``, in bursts of 4x that
    rate for 1 s, then 3 s quiet. A run is complete when it has merged every entry: from
    the first entry's time to its last merge. Each run is compared with the plain Spark
    job over the entries it took in, read back from the stream."""

    def __init__(self, doc: PipelineDocument, args: argparse.Namespace) -> None:
        self.doc, self.seed, self.mb, self.rate = doc, args.seed, args.mb, args.bursty_mb_s
        self.label = f"stream, bursty-skewed, {args.mb:g} MB at {args.bursty_mb_s:g} MB/s"

    def prepare(self, warm_policy: dict[str, Any]) -> None:
        run_to_end(self.doc, warm_policy, f"seed={self.seed + 1},volume_mb={WARMUP_MB}")

    def run(self, policy: dict[str, Any]) -> Trial:
        from django.conf import settings

        from orchestrator.pipeline.producer import StreamTarget, produce
        from orchestrator.source.spec import StreamSpec

        stream = f"bench-policies-{uuid.uuid4().hex[:8]}"
        source = Source(stream, None, None)
        run = start_unbounded(self.doc, StreamSpec(stream, linger_s=0.5), policy)
        try:
            produce(
                StreamTarget(settings.REDIS_URL, stream),
                rate_bps=self.rate * MB,
                pattern="bursty-skewed",
                duration_s=None,
                seed=self.seed,
                max_bytes=int(self.mb * MB),
            )
            times = entry_times(settings.REDIS_URL, stream)
            last_merge = caught_up(run, len(times))
            completion = last_merge - times[0]
            stop_run(run, drain_s=0)
            scratch = Path(tempfile.mkdtemp(prefix="bpconsole-policies-"))
            exact = exactness(run, self.doc, scratch, source)["exact"]
            shutil.rmtree(scratch, ignore_errors=True)
        finally:
            source.remove()
        return Trial(run, completion, bool(exact), tuple(t - times[0] for t in times))


def entry_times(url: str, stream: str) -> list[float]:
    """When each entry of the stream was added (its id's milliseconds), in seconds."""
    import redis

    from orchestrator.pipeline.streams import STREAM_PREFIX

    client = redis.Redis.from_url(url, decode_responses=True)
    times: list[float] = []
    after = "-"
    while True:
        page = client.xrange(STREAM_PREFIX + stream, min=after, count=10_000)
        if not page:
            break
        ids = [str(entry_id) for entry_id, _ in page]
        times += [int(entry_id.split("-")[0]) / 1000 for entry_id in ids]
        after = f"({ids[-1]}"
    client.close()
    return times


def caught_up(run: Any, entries: int, timeout_s: float = 900) -> float:
    """Wait until the run has read every entry and merged all it read; the epoch
    seconds of its last merge."""
    from django.db.models import Max

    from orchestrator.models import MergedChunk, Segment

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        read = int((run.source_position or {}).get("offset", 0))
        if not run.is_active:
            raise RuntimeError(f"run {run.pk} ended before catching up: {run.error}")
        pending = Segment.objects.filter(run=run).exclude(state=Segment.State.DONE).exists()
        if read >= entries and not pending:
            last = MergedChunk.objects.filter(run=run).aggregate(at=Max("merged_at"))["at"]
            return float(last.timestamp())
        time.sleep(0.2)
    raise RuntimeError(f"run {run.pk} did not catch up with {entries} entries")


def measured_run(
    trial: Trial, name: str, round_number: int, batches: list[BatchSample]
) -> dict[str, Any]:
    """One live run's figures, printed as they come."""
    from orchestrator.ledger.calibration import operator_reductions
    from orchestrator.ledger.results import summary

    run = trial.run
    result = summary(run)
    busy_s = sum(b.done_s - b.began_s for b in batches)
    found = {
        "policy": name,
        "round": round_number,
        "status": run.status,
        "completion_s": round(trial.completion_s, 2),
        "migrated_segments": result["migrated_segments"],
        "exact": trial.exact,
        "operator_batches": len(batches),
        "spark_busy_share": round(busy_s / max(trial.completion_s, 1e-3), 3),
        "reductions": operator_reductions(run),
        "completed": completed_share(run),
    }
    print(
        f"round {round_number} {name}: {found['completion_s']} s, "
        f"{found['migrated_segments']} migrated, {len(batches)} batches, "
        f"Spark busy {found['spark_busy_share']:.0%}, exact {found['exact']}",
        file=sys.stderr,
    )
    return found


def run_policies(args: argparse.Namespace) -> dict[str, Any]:
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARK_POLICIES))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {sorted(BENCHMARK_POLICIES)}")
    doc = reference_document(args.scale, args.buffer_mb)
    live = BurstyStream(doc, args) if args.bursty_mb_s else FileInput(doc, args)
    with Stack(args.spark_workers):
        from django.conf import settings

        from orchestrator.ledger.calibration import batches as batches_of
        from orchestrator.ledger.calibration import recorded_workload

        live.prepare(BENCHMARK_POLICIES[names[0]].policy().to_dict())
        max_batch_bytes = float(settings.BPCONSOLE_BATCH_MB) * 2**20
        runs: list[dict[str, Any]] = []
        batches: list[list[BatchSample]] = []
        merges: list[list[BatchSample]] = []
        workload: Workload | None = None
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                began = time.monotonic()
                trial = live.run(BENCHMARK_POLICIES[name].policy().to_dict())
                batches.append(batches_of(trial.run))
                merges.append(batches_of(trial.run, "sink"))
                workload = workload or recorded_workload(trial.run, trial.entry_times)
                runs.append(measured_run(trial, name, round_index + 1, batches[-1]))
                runs[-1]["wall_s"] = round(time.monotonic() - began, 2)
    if workload is None:
        raise SystemExit("no run: give at least one round and one policy")
    # One runtime for every policy: fitted to all runs' batches, the reductions the
    # median over runs.
    operators = sorted({node for r in runs for node in r["reductions"]})
    measured = {
        node: statistics.median(r["reductions"][node] for r in runs if node in r["reductions"])
        for node in operators
    }
    model = fit_runtime(
        batches,
        workers=args.spark_workers,
        max_batch_bytes=max_batch_bytes,
        reductions=measured,
        sink_runs=merges,
    )
    replay = Replay(doc, model, workload)
    if args.replay_out:
        Path(args.replay_out).write_text(json.dumps(replay.to_json()), encoding="utf-8")
    bound = replay.live_bound_s()
    predicted = {name: replay.run(name) for name in names}
    per_policy = {}
    for name in names:
        mine = [r for r in runs if r["policy"] == name]
        completion = statistics.median(r["completion_s"] for r in mine)
        simulated = predicted[name].completion_s
        per_policy[name] = {
            "label": BENCHMARK_POLICIES[name].label,
            "completion_s": completion,
            "rounds_s": [r["completion_s"] for r in mine],
            "ratio_to_bound": round(completion / bound, 3),
            "migrated_segments": statistics.median(r["migrated_segments"] for r in mine),
            "all_exact": all(r["exact"] and r["status"] == "completed" for r in mine),
            "simulated_s": round(simulated, 2),
            "simulated_error": round(simulated / completion - 1, 3),
            "simulated_migrated_share": round(predicted[name].migrated_share, 3),
        }
    volume = workload.volume_bytes
    rate = reduced_max_flow(replay.topology, measured)
    report = {
        "input": {"input": live.label, "source_mb": round(volume / 2**20, 2)},
        "topology": {"scale": args.scale, "buffer_mb": args.buffer_mb},
        "reductions": {k: round(v, 4) for k, v in measured.items()},
        "max_flow_source_mbps": round(rate * 8 / 1e6, 2),
        "live_bound_s": round(bound, 2),
        "runtime_model": model.to_json(),
        "ranking": ranking_report(per_policy, predicted),
        "policies": per_policy,
        "runs": runs,
    }
    if args.plot:
        plot(runs, names, Path(args.plot), f"Live, reference topology / {args.scale:g}", bound)
    return report


def ranking_report(
    per_policy: dict[str, dict[str, Any]], predicted: dict[str, SimResult]
) -> dict[str, Any]:
    check = check_ranking(
        {name: row["rounds_s"] for name, row in per_policy.items()},
        {name: result.completion_s for name, result in predicted.items()},
    )
    return {
        "same_ranking": check.same_ranking,
        "separated": [list(p) for p in check.separated],
        "overlapping": [list(p) for p in check.overlapping],
        "misordered": [list(p) for p in check.misordered],
        "medians_in_order": check.medians_in_order,
    }


def plot(
    runs: list[dict[str, Any]], names: list[str], path: Path, title: str, bound: float
) -> None:
    """Each policy's first run: its completed share every second."""
    from balancer.sim.plot import plot_completion

    first = {name: next(r["completed"] for r in runs if r["policy"] == name) for name in names}
    curves = {BENCHMARK_POLICIES[n].label: points for n, points in first.items()}
    plot_completion(curves, path, title=title, bound_s=bound)


def print_table(report: dict[str, Any]) -> None:
    print(
        f"input {report['input']['input']} ({report['input']['source_mb']} MB cut by the "
        f"source); links / {report['topology']['scale']}, buffers "
        f"{report['topology']['buffer_mb']} MB"
    )
    print(
        f"operator reductions {report['reductions']}; max flow "
        f"{report['max_flow_source_mbps']} Mb/s of source data; live bound "
        f"{report['live_bound_s']} s"
    )
    print(f"runtime model (fitted): {report['runtime_model']}")
    print("| policy | completion (median) | rounds | x live bound | migrated | exact | simulated |")
    print("|---|---|---|---|---|---|---|")
    for name, row in report["policies"].items():
        rounds = ", ".join(f"{s:.1f}" for s in row["rounds_s"])
        print(
            f"| {row['label']} (`{name}`) | {row['completion_s']:.1f} s | {rounds} | "
            f"{row['ratio_to_bound']:.2f}x | {row['migrated_segments']:g} | "
            f"{'yes' if row['all_exact'] else 'NO'} | {row['simulated_s']:.1f} s "
            f"({row['simulated_error']:+.0%}) |"
        )
    ranking = report["ranking"]
    print(
        f"same ranking live and simulated: {ranking['same_ranking']} (pairs that every round "
        f"sets apart: {pairs_text(ranking['separated'], ' before ')}; overlapping, not "
        f"ranked live: {pairs_text(ranking['overlapping'], ' ~ ')}; misordered: "
        f"{pairs_text(ranking['misordered'], ' before ')}); medians in the simulated "
        f"order: {ranking['medians_in_order']}"
    )


def pairs_text(pairs: list[list[str]], joint: str) -> str:
    return ", ".join(joint.join(pair) for pair in pairs) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=128.0, help="generated input, MB")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dominance", type=float, default=0.8, help="key skew (0 = none)")
    parser.add_argument("--skew-mean-s", type=float, default=20.0)
    parser.add_argument("--scale", type=float, default=4.0, help="divide every bandwidth")
    parser.add_argument("--buffer-mb", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--bursty-mb-s",
        type=float,
        default=0.0,
        help="read a Redis stream filled in bursts at this mean rate, MB/s (0: one file)",
    )
    parser.add_argument("--spark-workers", type=int, default=1, choices=(1, 2))
    parser.add_argument("--policies", default="credit,pressure,ours")
    parser.add_argument("--plot", default="", help="write the completion curves here")
    parser.add_argument(
        "--replay-out", default="", help="write the calibrated replay here (simulate --replay)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run_policies(args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
