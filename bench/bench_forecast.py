"""Time to full, checked against what happened: each forecast a live run showed against
the moment the node's pool did reach that high water.

    .venv/bin/python bench/bench_forecast.py [--runs 2] [--volume-mb 24] [--slow-mbps 2]
        [--buffer-mb 2] [--seed 1] [--dominance 0.85] [--throttling none] [--samples FILE] [--json]

Each run is the reference pipeline (webapp/console/topologies/reference.yaml) with its
two 50 Mb/s branches capped at ``--slow-mbps`` and pools of ``--buffer-mb``, over a
generated input whose hot key has ``--dominance`` of the records, no migration, 200 ms
ticks, on its own embedded stack with one Spark worker. Without throttling (the
default) the slow branches fill until the source blocks, so only the forecast is
judged; with ``--throttling watermark`` the balancer slows the source as they fill, and
forecasts it prevented miss.

The node states the driver publishes (ZooKeeper, as the console reads them) are sampled
every 100 ms. A forecast is a sample with ``0 < full_in_s``; it came true at the first
later sample of that node whose level is at or past the high water the forecast was
made against; it missed when twice its horizon passed, the run still going, and it had
not (forecasts the run's end cut short are left out). Reported per horizon (how far
ahead the forecast looked): how many forecasts were settled, how many came true, the
median and 90th percentile of |predicted - observed| seconds and of that error relative
to the observed time, and the share within 25%.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_runtime import Stack  # noqa: E402

REFERENCE = ROOT / "webapp/console/topologies/reference.yaml"
HORIZONS = ((0.0, 2.0), (2.0, 5.0), (5.0, 15.0), (15.0, float("inf")))
SAMPLE_S = 0.1


@dataclass(frozen=True)
class Sample:
    t: float
    node: str
    level: float
    high_water: float
    full_in_s: float | None


def pipeline(slow_mbps: float, buffer_mb: float) -> Any:
    doc = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": 0.0625}
        elif node["kind"] == "operator":
            node["buffer_mb"] = buffer_mb
        if node["name"] in {"task1", "task2"}:
            node["max_rate_mbps"] = slow_mbps
    return doc


def sample_run(args: argparse.Namespace, seed: int) -> list[Sample]:
    from django.conf import settings

    from balancer.policy import Policy
    from orchestrator.models import Run
    from orchestrator.run.lifecycle import create_run
    from orchestrator.tasks import start_run
    from orchestrator.zk.control_plane import ControlPlane

    values = {
        "routing": "static",
        "migration": "off",
        "throttling": args.throttling,
        "tick_ms": 200,
    }
    run = create_run(
        topology=pipeline(args.slow_mbps, args.buffer_mb),
        policy=Policy.from_mapping(values).to_dict(),
        generator=f"seed={seed},volume_mb={args.volume_mb},dominance={args.dominance}",
    )
    start_run(run)
    samples: list[Sample] = []
    began = time.monotonic()
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        while Run.objects.get(pk=run.pk).is_active:
            now = time.monotonic() - began
            for node, state in control.read_states(str(run.pk)).items():
                if "level" in state and "full_in_s" in state:
                    samples.append(
                        Sample(now, node, state["level"], state["high_water"], state["full_in_s"])
                    )
            time.sleep(SAMPLE_S)
    return samples


def score(samples: list[Sample]) -> list[tuple[float, float | None]]:
    """(predicted, observed seconds) of every forecast that was settled: it came true,
    or (observed None) twice its horizon passed with the run still going and it did not.
    A forecast the run's end cut short is left out."""
    by_node: dict[str, list[Sample]] = {}
    for s in samples:
        by_node.setdefault(s.node, []).append(s)
    out: list[tuple[float, float | None]] = []
    for series in by_node.values():
        end = series[-1].t
        for i, s in enumerate(series):
            if s.full_in_s is None or s.full_in_s <= 0 or s.level >= s.high_water:
                continue
            came = next((x.t for x in series[i + 1 :] if x.level >= s.high_water), None)
            if came is not None:
                out.append((s.full_in_s, came - s.t))
            elif end >= s.t + 2 * s.full_in_s:
                out.append((s.full_in_s, None))
    return out


def summary(pairs: list[tuple[float, float | None]]) -> list[dict[str, Any]]:
    rows = []
    for low, high in HORIZONS:
        inside = [(p, o) for p, o in pairs if low <= p < high]
        came = [(p, o) for p, o in inside if o is not None]
        errors = sorted(abs(p - o) for p, o in came)
        relative = sorted(abs(p - o) / max(o, SAMPLE_S) for p, o in came)
        rows.append(
            {
                "horizon_s": f"{low:g}-{high:g}",
                "settled": len(inside),
                "came_true": len(came),
                "median_error_s": round(statistics.median(errors), 2) if errors else None,
                "p90_error_s": round(errors[int(0.9 * (len(errors) - 1))], 2) if errors else None,
                "median_relative": round(statistics.median(relative), 3) if relative else None,
                "within_25pct": round(sum(r <= 0.25 for r in relative) / len(relative), 3)
                if relative
                else None,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--volume-mb", type=float, default=24.0)
    parser.add_argument("--slow-mbps", type=float, default=2.0)
    parser.add_argument("--buffer-mb", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dominance", type=float, default=0.85, help="the hot key's share")
    parser.add_argument(
        "--throttling",
        default="none",
        help="none: pools fill until the source blocks, the forecast alone is judged; "
        "watermark: the balancer slows the source as pools fill, as in production",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--samples", type=Path, help="also write every sample here (JSON lines)")
    args = parser.parse_args()
    pairs: list[tuple[float, float | None]] = []
    samples = 0
    with Stack(spark_workers=1):
        for i in range(args.runs):
            taken = sample_run(args, args.seed + i)
            samples += len(taken)
            if args.samples is not None:
                with args.samples.open("a") as out:
                    out.writelines(json.dumps({"run": i, **vars(s)}) + "\n" for s in taken)
            pairs += score(taken)
    result = {"runs": args.runs, "samples": samples, "by_horizon": summary(pairs)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"runs: {args.runs}, node states sampled: {samples}")
        print(
            "| horizon s | settled | came true | median error s | p90 error s "
            "| median relative | within 25% |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in result["by_horizon"]:
            print(
                f"| {r['horizon_s']} | {r['settled']} | {r['came_true']} | {r['median_error_s']} "
                f"| {r['p90_error_s']} | {r['median_relative']} | {r['within_25pct']} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
