"""Scenario S3: a keyed ``running`` stage with one hot key group, its key groups moved by
the balancer or left even, or its keys aggregated local-global, every emulation knob at
0, on Spark workers the operating system caps.

    .venv/bin/python bench/bench_key_moves.py [--records 2000000] [--rounds 2]
        [--arms even,moved,local] [--instances 2] [--quotas 1.0,1.0] [--hot-key hot8]
        [--hot-share 0.4] [--keys 300] [--seed 1] [--buffer-mb 0] [--segment-mb 0.25]
        [--run-timeout-s 900] [--json]

The pipeline: webapp/console/topologies/running-totals.yaml (a source, a keyed
``running`` stage of ``--instances`` instances totals1, totals2.., a merging sink) with
no knob set, ``--segment-mb`` segments and the template's pools (``--buffer-mb`` other
than 0 sets them), in placed mode: each instance on a Spark worker of its own, worker N
in a cgroup whose CFS quota is the N-th of ``--quotas`` cores (by default the machine's
two cores shared equally; orchestrator/services/cpu_quota.py; not root, or no cpu
controller: one line says why and the bench exits with code 2 having made nothing).

What a move can gain is bounded by the data: with ``n`` instances, a hot share ``h`` and
the rest spread evenly, even key groups give the hot key's instance ``h + (1 - h) / n``
of the records, and the best any grouping can do is ``max(h, 1 / n)``; for two instances
at ``h`` = 0.4 the stage can go at most 1.4x faster, for three at ``h`` = 1/3, 1.67x.

The input: ``--records`` JSON lines over ``--keys`` keys ``k0``.. plus ``--hot-key``,
which takes ``--hot-share`` of the records (drawn independently per record); values
are whole cents below 1,000. The default hot key's slot is 1: key groups are
contiguous slot ranges, so a move can isolate a hot slot near either end of the slot
space with two instances (one in the middle needs three). Even groups give totals1
the hot key and about half the rest: 70% of the records at a 40% hot share.

The arms, over that file, ``--rounds`` rounds in alternating order, after one untimed
warm-up run of a tenth of the records:

- ``plain``: the plain Spark batch job over the file, in one cgroup holding the sum of
  the quotas (bench_real_balance's ``run_plain``), timed from the call of the job;
- ``even``: ``key_moves = off``: the key groups stay even;
- ``moved``: ``key_moves = auto``: the balancer moves key groups when the instance
  holding the hot one is backpressured (balancer/key_moves.py);
- ``local``: the stage keyed ``local_global``: each segment goes to one instance by
  water level (``routing = water_level``), which aggregates every key in it and folds
  its partial totals into state of its own (a key's state is merged over its holders).

The key-group arms use ``routing = static`` (their segments go to every instance); every
live arm ``migration = off`` and the default watermark throttling.

Per run: completion (the ledger's start to finish), throughput (records per second of
it), the key-group moves (each with when, and the shares before and after), the run's
adjustments (when each began and ended, seconds from the run's start), each instance's
batches (how many, their MB, their busy seconds), exactness (rows equal to the plain
job's, coverage exact). The table: median completion and throughput per arm, each arm
over ``even`` (the stage left unbalanced; the S3 target is 1.5x), each arm over
``plain``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shlex
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_runtime  # noqa: E402
from bench_real_balance import (  # noqa: E402
    QuotaStack,
    operator_batches,
    quota_list,
    run_plain,
    with_quotas,
)
from bench_runtime import run_to_end  # noqa: E402

from balancer.document import PipelineDocument, emulated  # noqa: E402
from balancer.policy import Policy  # noqa: E402
from orchestrator.services.cpu_quota import CpuQuotas  # noqa: E402

TOPOLOGY = ROOT / "webapp" / "console" / "topologies" / "running-totals.yaml"


@dataclass(frozen=True)
class Arm:
    keying: str  # the running stage's keying (sparkjobs/catalog.py)
    key_moves: str  # the policy's
    routing: str  # the policy's


ARMS = {
    "even": Arm("key_groups", "off", "static"),
    "moved": Arm("key_groups", "auto", "static"),
    "local": Arm("local_global", "off", "water_level"),
}


def keyed_as(doc: PipelineDocument, keying: str) -> PipelineDocument:
    """``doc`` with its running stage keyed ``keying``."""
    keyed = copy.deepcopy(doc)
    for node in keyed["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {**node.get("params", {}), "keying": keying}
    return keyed


def keyed_document(args: argparse.Namespace) -> PipelineDocument:
    doc: PipelineDocument = yaml.safe_load(TOPOLOGY.read_text())
    doc["name"] = "running-totals-real"
    instances = [n for n in doc["nodes"] if n["kind"] == "operator"]
    for number in range(len(instances) + 1, args.instances + 1):
        name = f"totals{number}"
        doc["nodes"].insert(-1, {**copy.deepcopy(instances[0]), "name": name})
        doc["edges"] += [{"from": "source", "to": name}, {"from": name, "to": "output"}]
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": args.segment_mb}
        elif node["kind"] == "operator" and args.buffer_mb:
            node["buffer_mb"] = args.buffer_mb
    for edge in doc["edges"]:
        edge["bandwidth_mbps"] = 0.0
    if emulated(doc):
        raise SystemExit("an emulation knob is left in the keyed pipeline")
    return doc


def write_input(path: Path, records: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)  # noqa: S311 - a benchmark input, not a secret
    hot = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i in range(records):
            is_hot = rng.random() < args.hot_share
            hot += is_hot
            key = args.hot_key if is_hot else f"k{rng.randrange(args.keys)}"
            line = {"key": key, "value": rng.randrange(100_000) / 100, "user": f"u{i % 997}"}
            out.write(json.dumps(line) + "\n")
    return {
        "records": records,
        "mb": round(path.stat().st_size / 2**20, 2),
        "hot_key": args.hot_key,
        "hot_share": round(hot / records, 4),
    }


def run_arm(
    stack: QuotaStack, doc: PipelineDocument, arm: str, path: Path, plain_rows: Any
) -> dict[str, Any]:
    from orchestrator.ledger.results import summary
    from orchestrator.models import Adjustment, Event

    chosen = ARMS[arm]
    values = {"placement": "placed", "migration": "off"}
    values |= {"routing": chosen.routing, "key_moves": chosen.key_moves}
    policy = Policy.from_mapping(values).to_dict()
    run = run_to_end(keyed_as(doc, chosen.keying), policy, None, input_path=str(path))
    result = summary(run)
    rows = json.loads(json.dumps(result["rows"]))
    seconds = float(result["seconds"] or 0.0)
    run.refresh_from_db()
    batches = operator_batches(run, stack)

    def since_start(moment: datetime | None) -> float | None:
        if moment is None or run.started_at is None:
            return None
        return round(float((moment - run.started_at).total_seconds()), 2)

    moves = [
        {
            "at_s": since_start(e.time),
            "groups": e.data["groups"],
            "before": e.data["shares_before"],
            "after": e.data["shares_after"],
        }
        for e in Event.objects.filter(run=run, kind="move_key_groups").order_by("pk")
    ]
    adjustments = [
        {
            "kind": a.kind,
            "status": a.status,
            "began_s": since_start(a.started_at),
            "ended_s": since_start(a.finished_at),
        }
        for a in Adjustment.objects.filter(run=run).order_by("version")
    ]
    return {
        "run": run.pk,
        "completion_s": round(seconds, 2),
        "exact": rows == plain_rows and result["coverage"] == "exact" and run.status == "completed",
        "moves": moves,
        "moves_completed": sum(
            a["kind"] == "key_move" and a["status"] == "complete" for a in adjustments
        ),
        "adjustments": adjustments,
        "instances": instance_work(batches),
        "batches": batches,
    }


def instance_work(batches: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per instance: its batches, their MB, and the seconds they were busy. Keyed by key
    groups, every instance reads every segment, so each runs a batch over all of the
    input whatever share of its records it keeps; keyed local_global, each reads the
    segments routed to it."""
    work: dict[str, dict[str, float]] = {}
    for batch in batches:
        row = work.setdefault(batch["nodes"], {"batches": 0, "mb": 0.0, "busy_s": 0.0})
        row["batches"] += 1
        row["mb"] = round(row["mb"] + batch["mb"], 2)
        row["busy_s"] = round(row["busy_s"] + batch["busy_s"], 2)
    return dict(sorted(work.items()))


def bench(args: argparse.Namespace, quotas: CpuQuotas, cgroups: list[str]) -> dict[str, Any]:
    doc = keyed_document(args)
    with QuotaStack(quotas, cgroups) as stack:
        inputs = stack.var / "inputs"
        shape = write_input(inputs / "keyed.jsonl", args.records, args)
        warm = write_input(inputs / "warmup.jsonl", max(1000, args.records // 10), args)
        print(f"input {shape}; warm-up {warm}", file=sys.stderr)
        run_to_end(
            doc,
            Policy.from_mapping({"placement": "placed"}).to_dict(),
            None,
            input_path=str(inputs / "warmup.jsonl"),
        )
        topology = stack.var / "keyed.yaml"
        topology.write_text(yaml.safe_dump(dict(doc)))
        reference = run_plain(stack, inputs / "keyed.jsonl", topology)
        runs: list[dict[str, Any]] = [
            {"arm": "plain", "round": 1, "completion_s": reference["job_s"], "exact": True}
        ]
        for index in range(args.rounds):
            order = args.arms if index % 2 == 0 else list(reversed(args.arms))
            for arm in order:
                row = {"arm": arm, "round": index + 1}
                row |= run_arm(stack, doc, arm, inputs / "keyed.jsonl", reference["rows"])
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "batches"}), file=sys.stderr)
    for row in runs:
        row["records_per_s"] = (
            round(args.records / row["completion_s"]) if row["completion_s"] else None
        )
    medians = {
        arm: statistics.median(r["completion_s"] for r in runs if r["arm"] == arm)
        for arm in ("plain", *args.arms)
    }
    over_even = {
        f"{arm}_over_even": round(medians["even"] / medians[arm], 3)
        for arm in args.arms
        if arm != "even" and "even" in medians
    }
    return {
        "command": shlex.join(sys.orig_argv),
        "quotas": dict(zip(cgroups, args.quota_list, strict=True)),
        "input": shape,
        "median_completion_s": medians,
        **over_even,
        "over_plain": {arm: round(medians[arm] / medians["plain"], 3) for arm in args.arms},
        "all_exact": all(r["exact"] for r in runs),
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--instances", type=int, default=2, help="of the keyed stage, 2 or more")
    parser.add_argument(
        "--quotas",
        type=quota_list,
        default=None,
        dest="quota_list",
        help="cores per worker, one per instance (default: the machine's two cores shared)",
    )
    parser.add_argument(
        "--arms",
        type=lambda text: text.split(","),
        default=list(ARMS),
        help=f"comma-separated, from {', '.join(ARMS)} (default: all)",
    )
    parser.add_argument("--hot-key", default="hot8")
    parser.add_argument("--hot-share", type=float, default=0.4)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--buffer-mb", type=float, default=0.0, help="each instance's pool (0: the template's)"
    )
    parser.add_argument("--segment-mb", type=float, default=0.25)
    parser.add_argument("--run-timeout-s", type=float, default=900.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.arms or not set(args.arms) <= set(ARMS):
        parser.error(f"--arms names arms from {', '.join(ARMS)}")
    if args.instances < 2:
        parser.error("--instances is at least 2: a move needs somewhere to go")
    if args.quota_list is None:
        args.quota_list = [round(2.0 / args.instances, 3)] * args.instances
    if len(args.quota_list) != args.instances:
        parser.error(f"--quotas takes {args.instances} values, one per instance")
    print(f"command: {shlex.join(sys.orig_argv)}", file=sys.stderr, flush=True)
    bench_runtime.RUN_TIMEOUT_S = args.run_timeout_s
    report = with_quotas("bench_key_moves", args.quota_list, lambda q, c: bench(args, q, c))
    if report is None:
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
