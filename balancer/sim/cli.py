"""Command line of the simulator: ``python -m balancer.sim ...`` (and ``manage.py simulate``).

::

    --volume 5GB --policy NAME [--seed N] [--topology FILE] [--json]   one run
    --table [--volumes 500MB,1GB,2GB,5GB] [--json]   every policy at each volume
    --sweep [--json]        published migration, alpha x beta at --volume (Table 1)
    --plot FILE.png         completed fraction every 5 s: credit, published, ours
    --replay FILE [--policy NAME] [--json]   a live run replayed with its calibrated runtime
                            (the file ``manage.py calibrate_sim RUN --out FILE`` writes)

:func:`main` takes the arguments and returns the exit status; it writes only to stdout
(results) and stderr (errors), and never exits the interpreter itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from balancer.sim.bench import (
    SWEEP_ALPHAS,
    SWEEP_BETAS,
    Outcome,
    Scenario,
    completion_curves,
    run_policy,
    sweep,
    table,
)
from balancer.sim.bound import max_flow
from balancer.sim.control import BENCHMARK_POLICIES
from balancer.sim.reference import (
    MBIT,
    REFERENCE_VOLUMES,
    load_topology,
    parse_volume,
    reference_topology,
)
from balancer.sim.replay import Replay
from balancer.topology import Topology

PLOTTED = ("credit", "pressure", "ours")
SAMPLE_S = 5.0


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse already reported
        return int(stop.code or 0)
    if args.replay:
        try:
            replay = _load_replay(args.replay)
        except (OSError, ValueError, KeyError, TypeError) as problem:
            print(f"simulate: {args.replay}: {problem}", file=sys.stderr)
            return 2
        _print_replay(replay, [args.policy] if args.policy else list(BENCHMARK_POLICIES), args.json)
        return 0
    try:
        topology = load_topology(args.topology) if args.topology else reference_topology()
        volume = parse_volume(args.volume)
        volumes = [(label, parse_volume(label)) for label in args.volumes.split(",")]
    except (OSError, ValueError, KeyError) as problem:
        print(f"simulate: {problem}", file=sys.stderr)
        return 2
    if args.table:
        _print_table(topology, volumes, args.seed, as_json=args.json)
    elif args.sweep:
        _print_sweep(topology, volume, args.seed, as_json=args.json)
    elif args.plot:
        _plot(topology, volume, args.seed, args.plot, args.volume)
    elif args.policy:
        _print_run(topology, volume, args.seed, args.policy, args.volume, as_json=args.json)
    else:
        parser.print_usage(sys.stderr)
        print("simulate: give --policy NAME, --table, --sweep or --plot FILE", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simulate",
        description="Virtual-time simulation of the backpressure policies (docs/simulation.md).",
        epilog="policies:\n"
        + "\n".join(f"  {p.name:<12} {p.description}" for p in BENCHMARK_POLICIES.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--policy", choices=tuple(BENCHMARK_POLICIES), help="run one policy")
    mode.add_argument("--table", action="store_true", help="every policy at the four volumes")
    mode.add_argument("--sweep", action="store_true", help="alpha/beta sweep (published)")
    mode.add_argument("--plot", type=Path, metavar="FILE.png", help="completed-fraction plot")
    parser.add_argument(
        "--replay", type=Path, metavar="FILE", help="a live run's replay (manage.py calibrate_sim)"
    )
    parser.add_argument("--volume", default="5GB", help="data volume, e.g. 500MB, 5GB")
    parser.add_argument(
        "--volumes",
        default=",".join(label for label, _ in REFERENCE_VOLUMES),
        help="volumes of --table, comma-separated (default: the published four)",
    )
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument("--topology", type=Path, metavar="FILE", help="YAML or JSON topology")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _print_run(
    topology: Topology, volume: float, seed: int, name: str, label: str, *, as_json: bool
) -> None:
    scenario = Scenario.build(topology, volume, seed)
    outcome = run_policy(scenario, name)
    if as_json:
        print(json.dumps({"volume": label, "seed": seed, **outcome.to_json()}))
        return
    print(
        f"{BENCHMARK_POLICIES[name].label}, {label}, seed {seed}: "
        f"{outcome.completion_s:.1f} s; fluid bound {outcome.bound_s:.1f} s "
        f"(x{outcome.ratio_to_bound:.3f}); migrated {outcome.migrated_share:.1%} "
        f"(minimum {outcome.minimum_share:.1%})"
    )


class _VolumeRow(TypedDict):
    """One volume of ``--table --json``."""

    bound_s: float
    minimum_share: float
    policies: dict[str, dict[str, float | str]]


def _print_table(
    topology: Topology, volumes: Sequence[tuple[str, float]], seed: int, *, as_json: bool
) -> None:
    labels = [label for label, _ in volumes]
    rows = table(topology, [volume for _, volume in volumes], seed)
    if as_json:
        by_volume: dict[str, _VolumeRow] = {}
        for label, outcomes in zip(labels, rows, strict=True):
            credit = _credit(outcomes)
            by_volume[label] = {
                "bound_s": round(outcomes[0].bound_s, 3),
                "minimum_share": round(outcomes[0].minimum_share, 4),
                "policies": {o.policy: o.to_json(credit) for o in outcomes},
            }
        print(json.dumps({"seed": seed, "volumes": by_volume}))
        return
    print(f"Completion per policy, seed {seed}, max flow {max_flow(topology) / MBIT:g} Mb/s")
    for label, outcomes in zip(labels, rows, strict=True):
        credit = _credit(outcomes)
        print(
            f"\n{label}: fluid bound {outcomes[0].bound_s:.1f} s, "
            f"minimum migrated share {outcomes[0].minimum_share:.1%}"
        )
        print(f"  {'policy':<22}{'time (s)':>10}{'gain':>9}{'x bound':>9}{'migrated':>10}")
        for o in outcomes:
            print(
                f"  {BENCHMARK_POLICIES[o.policy].label:<22}{o.completion_s:>10.1f}"
                f"{o.gain_over(credit):>9.1%}{o.ratio_to_bound:>9.3f}{o.migrated_share:>10.1%}"
            )


def _credit(outcomes: Sequence[Outcome]) -> Outcome:
    return next(o for o in outcomes if o.policy == "credit")


def _print_sweep(topology: Topology, volume: float, seed: int, *, as_json: bool) -> None:
    results = sweep(topology, volume, seed)
    if as_json:
        print(
            json.dumps(
                {
                    "seed": seed,
                    "runs": [
                        {"alpha": a, "beta": b, **o.to_json()} for (a, b), o in results.items()
                    ],
                }
            )
        )
        return
    bound = next(iter(results.values())).bound_s
    print(f"Published migration, completion (s), seed {seed}; fluid bound {bound:.1f} s")
    print("beta \\ alpha" + "".join(f"{a:>9g}" for a in SWEEP_ALPHAS))
    for b in SWEEP_BETAS:
        print(f"{b:<12g}" + "".join(f"{results[(a, b)].completion_s:>9.1f}" for a in SWEEP_ALPHAS))


def _plot(topology: Topology, volume: float, seed: int, path: Path, label: str) -> None:
    from balancer.sim.plot import plot_completion

    scenario = Scenario.build(topology, volume, seed)
    curves = completion_curves(scenario, PLOTTED, SAMPLE_S)
    plot_completion(
        {BENCHMARK_POLICIES[name].label: points for name, points in curves.items()},
        path,
        title=f"Completed fraction, {label}, seed {seed} (sampled every {SAMPLE_S:g} s)",
        bound_s=scenario.bound_s,
    )
    print(f"wrote {path}")


MAX_REPLAY_BYTES = 64 * 2**20


def _load_replay(path: Path) -> Replay:
    if path.stat().st_size > MAX_REPLAY_BYTES:
        raise ValueError(f"larger than {MAX_REPLAY_BYTES // 2**20} MB")
    return Replay.from_json(json.loads(path.read_text(encoding="utf-8")))


def _print_replay(replay: Replay, names: Sequence[str], as_json: bool) -> None:
    bound = replay.live_bound_s()
    results = {name: replay.run(name) for name in names}
    if as_json:
        print(
            json.dumps(
                {
                    "live_bound_s": round(bound, 3),
                    "runtime": replay.runtime.to_json(),
                    "policies": {
                        name: {
                            "completion_s": round(r.completion_s, 3),
                            "ratio_to_bound": round(r.completion_s / bound, 4),
                            "migrated_share": round(r.migrated_share, 4),
                        }
                        for name, r in results.items()
                    },
                }
            )
        )
        return
    volume = replay.workload.volume_bytes / 2**20
    print(f"Replay of {volume:.1f} MB; live fluid bound {bound:.1f} s; {replay.runtime.to_json()}")
    print(f"  {'policy':<22}{'time (s)':>10}{'x bound':>9}{'migrated':>10}")
    for name, r in results.items():
        print(
            f"  {BENCHMARK_POLICIES[name].label:<22}{r.completion_s:>10.1f}"
            f"{r.completion_s / bound:>9.3f}{r.migrated_share:>10.1%}"
        )
