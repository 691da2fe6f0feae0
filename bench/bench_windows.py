"""Event-time windows: how soon a window's rows are committed once the watermark passes
its end, and what windowing costs in throughput.

    .venv/bin/python bench/bench_windows.py [--mb 128] [--rounds 3] [--window-s 10]
        [--lateness-s 2] [--late-share 0.01] [--seed 1] [--json]

One generated input: bench_peers.py's records (243 keys, 35% on one, ~150 bytes) with an
event time ``ts`` that advances ``--events-per-s`` records per second of event time,
each up to 2 s early (out of order), and ``--late-share`` of them 30 to 60 s behind
(late). The throughput pipeline (bench_runtime.py: source -> 3 aggregators -> sink, 8 MB
segments, one Spark worker) runs it live with and without windows on the aggregators,
alternating, ``--rounds`` times after an untimed warm-up of each.

Reported:
- **cost**: the windowed run's median wall time over the plain one's, minus one (the
  target: at most 15%);
- **close latency** of every window the watermark passed (not those closed by the end
  of the input): from the moment the sink's watermark passed its end (the merge of the
  last chunk it needed) to the commit that closed it, p50 and p99 (the target: p99 at
  most 2 s);
- **exactness**: every windowed run's closed windows against a pure-Python computation
  over the input (chunk by chunk, as the ledger cut it: the watermark of each chunk is
  the largest event time before it), and its late count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_peers import SEGMENT_MB, _measured, median  # noqa: E402
from bench_runtime import Stack, run_to_end, throughput_pipeline  # noqa: E402

MB = 2**20
T0 = 1_790_000_000
KEYS = 243
HOT_SHARE = 0.35
RECORD_BYTES = 150
USERS = 1000


def write_events(path: Path, mb: float, seed: int, events_per_s: float, late: float) -> int:
    """The input; returns its number of records."""
    rng = np.random.default_rng(seed)
    names = [f"key-{i:03d}" for i in range(KEYS)]
    written, count = 0, 0
    with path.open("w") as out:
        while written < mb * MB:
            block = min(50_000, int((mb * MB - written) / RECORD_BYTES) + 1)
            index = np.arange(count, count + block)
            t = T0 + index / events_per_s - rng.uniform(0, 2, size=block)
            behind = rng.random(block) < late
            t = np.where(behind, t - rng.uniform(30, 60, size=block), t)
            hot = rng.random(block) < HOT_SHARE
            keys = np.where(hot, 0, rng.integers(1, KEYS, size=block))
            values = rng.integers(-(10**9), 10**9, size=block)
            users = rng.integers(USERS, size=block)
            lines = []
            for k, v, u, ts in zip(
                keys.tolist(), values.tolist(), users.tolist(), t.tolist(), strict=True
            ):
                whole, frac = divmod(abs(v), 10_000)
                value = f"{'-' if v < 0 else ''}{whole}.{frac:04d}"
                head = f'{{"key":"{names[k]}","value":{value},"user":"u{u}","ts":{ts:.3f},"pad":"'
                lines.append(head + "x" * max(0, RECORD_BYTES - len(head) - 3) + '"}\n')
            body = "".join(lines)
            out.write(body)
            written += len(body)
            count += block
    return count


def windowed(doc: Any, window_s: float, lateness_s: float) -> Any:
    doc = json.loads(json.dumps(doc))
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {
                **(node.get("params") or {}),
                "window_s": window_s,
                "event_time": "ts",
                "lateness_s": lateness_s,
            }
    return doc


Expected = dict[tuple[int, str], tuple[int, Decimal, Decimal, Decimal, int]]


def expected(path: Path, run: Any, spec: Any) -> tuple[Expected, int]:
    """Every (window, key) row and the late count, in Python, chunk by chunk as the run's
    ledger cut the input."""
    from orchestrator.models import Segment
    from sparkjobs.event_time import parse_us

    data = path.read_bytes()
    cuts = sorted(
        set(
            Segment.objects.filter(run=run, upstream="source").values_list(
                "chunk", "origin_offset", "origin_length"
            )
        )
    )
    rows: dict[tuple[int, str], list[Any]] = {}
    users: dict[tuple[int, str], set[str]] = defaultdict(set)
    high: int | None = None
    late = 0
    for _, offset, length in cuts:
        chunk_high = high
        for line in data[offset : offset + length].splitlines():
            record = json.loads(line)
            t = parse_us(record["ts"])
            if t is None:
                raise ValueError(f"the generated input has a record without a time: {line!r}")
            chunk_high = t if chunk_high is None else max(chunk_high, t)
            value = Decimal(str(record["value"]))
            for start in spec.starts(t):
                if spec.late(start, high):
                    late += 1
                    continue
                key = (start, record["key"])
                row = rows.get(key)
                if row is None:
                    rows[key] = [1, value, value, value]
                else:
                    row[0] += 1
                    row[1] += value
                    row[2] = min(row[2], value)
                    row[3] = max(row[3], value)
                users[key].add(record["user"])
        high = chunk_high
    return {k: (r[0], r[1], r[2], r[3], len(users[k])) for k, r in rows.items()}, late


def outcome(run: Any) -> tuple[Expected, int]:
    """The run's closed windows' rows (each keeps its values once closed) and its late
    count."""
    from orchestrator.ledger.groups import restored
    from orchestrator.ledger.segments import late_records
    from orchestrator.models import ResultGroup
    from orchestrator.pipeline.graph import result_grouping

    grouping = result_grouping(run.topology)
    found = ResultGroup.objects.filter(
        run=run, start_us__isnull=False, closed_at__isnull=False
    ).values_list("start_us", "group", "states", "finished")
    rows: Expected = {}
    for start, group, states, finished in found:
        if start is None:  # none is: the query's start_us__isnull=False
            continue
        values = grouping.finish(states) if finished is None else restored(grouping, finished)
        count, total, low, high, users = _measured(values)
        rows[(start, str(group[0]))] = (
            count,
            total.normalize(),
            low.normalize(),
            high.normalize(),
            users,
        )
    return rows, late_records(run.pk)


def close_latencies(run: Any, spec: Any) -> tuple[list[float], int]:
    """Seconds from the watermark passing each window's end to the commit closing it,
    for the windows the watermark passed; and how many closed at the input's end."""
    from orchestrator.models import MergedChunk, ResultGroup

    merged = list(
        MergedChunk.objects.filter(run=run)
        .order_by("chunk")
        .values_list("chunk", "high_us", "merged_at")
    )
    # Chunks merged in prefix order: when did the prefix first reach each watermark?
    by_chunk: dict[int, tuple[int | None, Any]] = {}
    for chunk, high, at in merged:
        seen = by_chunk.get(chunk)
        by_chunk[chunk] = (high, at if seen is None else max(at, seen[1]))
    passes: list[tuple[int, Any]] = []  # (watermark, when the prefix got there)
    running_high: int | None = None
    prefix_done = None
    for chunk in sorted(by_chunk):
        high, at = by_chunk[chunk]
        prefix_done = at if prefix_done is None else max(prefix_done, at)
        if high is not None:
            running_high = high if running_high is None else max(running_high, high)
        if running_high is not None:
            passes.append((running_high - spec.lateness_us, prefix_done))
    closed = dict(
        ResultGroup.objects.filter(run=run, start_us__isnull=False)
        .values_list("start_us", "closed_at")
        .order_by("start_us", "closed_at")
        .distinct()
    )
    latencies, at_end = [], 0
    for start, closed_at in closed.items():
        end = start + spec.size_us
        passed = next((when for mark, when in passes if mark >= end), None)
        if passed is None:
            at_end += 1
            continue
        latencies.append(max(0.0, (closed_at - passed).total_seconds()))
    return latencies, at_end


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from sparkjobs.event_time import WindowSpec

    folder = Path(tempfile.mkdtemp(prefix="bpconsole-windows-"))
    try:
        with Stack(spark_workers=1):
            plain_doc, policy = throughput_pipeline(SEGMENT_MB)
            window_doc = windowed(plain_doc, args.window_s, args.lateness_s)
            spec = WindowSpec.from_params(
                {"window_s": args.window_s, "lateness_s": args.lateness_s, "event_time": "ts"}
            )
            if spec is None:
                raise ValueError("no window")
            warm, path = folder / "warm.jsonl", folder / "input.jsonl"
            write_events(warm, 8, args.seed + 1, args.events_per_s, args.late_share)
            records = write_events(path, args.mb, args.seed, args.events_per_s, args.late_share)
            for doc in (plain_doc, window_doc):
                run_to_end(doc, policy, None, input_path=str(warm))
            seconds: dict[str, list[float]] = {"plain": [], "windowed": []}
            latencies: list[float] = []
            ticks: dict[str, list[dict[str, float]]] = {"plain": [], "windowed": []}
            at_end = 0
            wrong: list[str] = []
            for round_ in range(args.rounds):
                for name, doc in (("plain", plain_doc), ("windowed", window_doc)):
                    began = time.monotonic()
                    run = run_to_end(doc, policy, None, input_path=str(path))
                    seconds[name].append(round(time.monotonic() - began, 2))
                    if run.status != "completed":
                        wrong.append(f"{name} round {round_ + 1}: {run.status} {run.error}")
                        continue
                    ticks[name].append({**_tick_stats(run), **_busy_s(run)})
                    if name == "plain":
                        continue
                    got, late = outcome(run)
                    want, want_late = expected(path, run, spec)
                    want = {
                        k: (c, s.normalize(), lo.normalize(), hi.normalize(), d)
                        for k, (c, s, lo, hi, d) in want.items()
                    }
                    if got != want or late != want_late:
                        differs = sorted(set(got.items()) ^ set(want.items()))[:3]
                        wrong.append(
                            f"round {round_ + 1}: late {late} vs {want_late}; rows {differs}"
                        )
                    passed, ended = close_latencies(run, spec)
                    latencies += passed
                    at_end += ended
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plain, windowed_s = median(seconds["plain"]), median(seconds["windowed"])
    return {
        "records": records,
        "mb": args.mb,
        "window_s": args.window_s,
        "lateness_s": args.lateness_s,
        "rounds": args.rounds,
        "seconds": seconds,
        "median_s": {"plain": plain, "windowed": windowed_s},
        "cost": round(windowed_s / plain - 1, 3),
        "close_latency_s": {
            "windows": len(latencies),
            "closed_at_input_end": at_end,
            "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99),
            "max": round(max(latencies), 3) if latencies else None,
            "mean": round(statistics.fmean(latencies), 3) if latencies else None,
        },
        "driver_ticks": ticks,
        "exact": not wrong,
        "wrong": wrong,
    }


def _busy_s(run: Any) -> dict[str, float]:
    """Seconds each kind of node spent in batches (claim to done, each batch once)."""
    from orchestrator.models import Segment

    batches = set(
        Segment.objects.filter(
            run=run, done_at__isnull=False, claimed_at__isnull=False
        ).values_list("node", "claimed_at", "done_at")
    )
    busy: dict[str, float] = {}
    for node, claimed, done in batches:
        if claimed is None or done is None:
            continue
        kind = "sink" if node == "output" else "operators"
        busy[kind] = busy.get(kind, 0.0) + (done - claimed).total_seconds()
    return {kind: round(seconds, 2) for kind, seconds in busy.items()}


def _tick_stats(run: Any) -> dict[str, float]:
    """The driver's tick times, per phase (what a windowed run's closing costs)."""
    from orchestrator.models import Event

    event = Event.objects.filter(run=run, kind="driver_stats").order_by("-id").first()
    data = event.data if event is not None else {}
    return {k: round(float(v), 2) for k, v in data.items() if "ms" in k or k == "ticks"}


def table(result: dict[str, Any]) -> str:
    lat = result["close_latency_s"]
    return "\n".join(
        [
            f"records: {result['records']:,} ({result['mb']} MB); window {result['window_s']} s, "
            f"lateness {result['lateness_s']} s; rounds {result['rounds']}; "
            f"exact: {result['exact']} {result['wrong'] or ''}",
            "",
            "| run | median s |",
            "|---|---|",
            f"| plain | {result['median_s']['plain']} |",
            f"| windowed | {result['median_s']['windowed']} (cost {result['cost']:+.1%}) |",
            "",
            f"close latency over {lat['windows']} windows ({lat['closed_at_input_end']} closed "
            f"at the input's end): p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=128.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--lateness-s", type=float, default=2.0)
    parser.add_argument("--events-per-s", type=float, default=20_000.0)
    parser.add_argument("--late-share", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = bench(args)
    print(json.dumps(result, indent=2, default=str) if args.json else table(result))
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
