"""Scenario S1 with real heterogeneity: every emulation knob at 0, the Spark workers'
unequal speeds made by the operating system's CPU quotas.

    .venv/bin/python bench/bench_real_balance.py [--mb 512] [--rounds 2] [--quotas 1.0,0.5,0.25]
        [--arms plain,pooled,static,balancing-off,credit,pressure,ours,measured] [--hot-share 0.35]
        [--hot-branch task2] [--keys-per-branch 16] [--users 400] [--seed 1]
        [--warmup-mb 16] [--buffer-mb 128] [--batch-mb 64] [--run-timeout-s 900] [--predict]
        [--json]

The reference topology (webapp/console/topologies/reference.yaml: a source, three
aggregating branches task1..task3 of one stage, a merging sink) with every link's
``bandwidth_mbps`` and ``latency_ms`` set to 0 and every node's ``max_rate_mbps`` removed
(checked before anything runs): nothing is throttled by the runtime's emulation. What
makes the branches unequal is the machine: the project's embedded stack (bench_runtime's
``Stack``) with one Spark worker per ``--quotas`` entry, worker N (a Celery worker
``-Q spark --concurrency 1`` and its Spark JVM) started inside a cgroup of its own whose
CFS quota is q_N cores (orchestrator/services/cpu_quota.py). The services, the control
worker, beat and this process are not limited. Not root, no writable cpu controller, or
a cgroup that cannot be made: one line says which and why, and the bench exits with
code 2 having made nothing.

The input: one JSON-lines file of ``--mb`` MB written by this bench in the generator's
record format (``orchestrator.pipeline.generator.record_line``: ``{"key", "value",
"user"}``, a value a whole number of cents below 100,000, users ``u0``..), keys named as
the generator names them, ``--keys-per-branch`` routing to each branch. One key of
``--hot-branch`` (its first) holds ``--hot-share`` of the records, drawn independently
per record; the others share the rest evenly. (The generator's own skew moves whole
packets between branches over time; it cannot put a fixed share on one key.) With the
default 35%, task2's share of the input is 0.35 + 0.65 x 15/47, about 56%. Placed mode
gives the workers to the instances in name order (spark-2, spark-3, spark), so with
three workers and the default quotas the hot task2 runs on the 0.25-core worker; each
run's report says where its instances were placed and with what quota.

The arms, each over that file, ``--rounds`` rounds, the arms' order rotating by one
each round, after one untimed warm-up run (the first live arm over a ``--warmup-mb``
file of the same shape):

- ``plain``: the plain Spark batch job (``orchestrator.worker.plain_job.batch_summary``,
  as ``run_pipeline --batch`` and bench_peers run it) in a fresh process inside one
  cgroup holding the sum of the quotas. Timed: from the call of the job, its
  SparkSession already built (so no JVM start-up), to its rows collected: the read of
  the file, the parse, the aggregation and the collect. The process's wall time, JVM
  start-up included, is reported beside it;
- ``pooled``: ``{"placement": "pooled"}`` with the throughput defaults of the other
  benches (routing by water level, no migration, no throttling): any Spark worker takes
  any branch's batch;
- ``static``: ``{"placement": "placed", "routing": "static", "migration": "off"}``, the
  other parameters (throttling among them) at their defaults;
- ``balancing-off``: the same policy as ``static``, so not run again: its row is
  ``static``'s;
- ``credit``, ``pressure``, ``ours``: ``balancer.sim.control.BENCHMARK_POLICIES``'s values
  with ``"placement": "placed"``;
- ``measured``: ``ours`` with ``"routing": "measured"``: the source splits the input in
  proportion to the instances' measured capacities (balancer/shares.py).

A checkout whose policies have no ``placement`` parameter runs ``pooled`` without it
(what every run does there) and skips the ``placed`` arms, saying so.

Per run: completion, the ledger's start to finish (``summary(run)["seconds"]``, as
bench_policies measures it); segments migrated (segments whose ``migrated_from`` is set,
``summary(run)["migrated_segments"]``); exactness: the run completed, its rows equal the
plain job's over the same file and its coverage is exact; each worker cgroup's CPU
throttling meanwhile (``cpu.stat``); the cores used on average over the run
(``cores_used``): each worker's, everything outside the workers (driver, PostgreSQL,
Celery, the sink) and the machine's idle, so that a run shows whether its workers were
busy, starved or idle; where placed mode put each instance (its ``placed``
events: worker cgroup, quota, seconds from the start); and the operator batches, each
with the cgroup of the worker that ran it (the pool process's pid in its lease owner),
summed as MB per worker.

The **fluid bound from measured capacities**: each operator node's capacity is its true
processing rate over the run, bytes taken in per second of busy time (DS2's definition):
per batch (the node's segments completed under one lease owner) busy = last done_at -
first claimed_at; capacity = sum of bytes / sum of busy
(``orchestrator.ledger.busy.measured_capacities`` when the checkout has it, the same
computation here otherwise). The branches split the input and the file is all there at
the start, so no run can finish before

    bound = input bytes / (capacity(task1) + capacity(task2) + capacity(task3))

(a branch with no batch in the run adds nothing). It is computed per run, from that
run's own capacities. A batch that ran several branches' data in one job counts its
whole size and time at each of them (balancer/capacity.py), so when the branches shared
one worker the sum counts that worker once per branch and the bound is that many times
too low. Beside it, per run, each worker cgroup's MB per busy second over the batches it
ran and ``fluid_bound_workers_s`` = input MB / their sum: the bound of the resources the
run used, each counted once.

``--buffer-mb`` sets each branch's pool (by default the product's, 128 MB): the source
sends a branch no more than its pool takes, and the rest of the input waits at the
source, where routing decides which branch takes it. A placed instance's batch claims at
most half its pool (balancer/runtime.py), so its pool refills while the batch runs.

``--batch-mb`` sets ``BPCONSOLE_BATCH_MB`` (the most one batch takes) for the stack's
processes, by default half of ``--buffer-mb``: the most a placed instance's batch takes
anyway, so the placed arms run as the product's defaults run them, and the pooled arm's
batches are no larger than theirs (with the setting's own 512 MB a file all there at the
start goes as a few pooled batches each holding every branch's data, one job on one
worker). 0 leaves the setting as configured. A run not ended after ``--run-timeout-s``
stops the bench (a Spark worker stuck in a batch holds its instance's data for good in
placed mode).

``--predict`` checks the simulator against each live placed run (docs/simulation.md,
"Replaying a live run"): once the run has ended, the replay ``manage.py calibrate_sim``
would write of it (``orchestrator.ledger.calibration.replay_of``: its input, each
operator's batch cost fitted on the worker it was placed on) runs the arm's policy in the
policy lab's simulation (``balancer.sim.lab.run_lab``), and the run's row gets the
predicted completion and its error, (predicted - live) / live in %. The target: every
placed arm predicted **within 15%** of its live completion, close enough for the policy
lab to rank S1's policies before they run. A run whose replay cannot be made or
simulated gets the reason instead. The ``pooled`` arm is not predicted: its three workers of
unequal speeds are one shared pool that the model gives one cost.

The table, per arm: median completion (s), min/max over the rounds, the median over
``plain``'s, the median of each run's completion over its own bound, the median over
``static``'s and over ``pooled``'s, the median of segments migrated, and whether every
run was exact; with ``--predict``, the median predicted completion and the median
error. ``--json`` prints every figure instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
import bench_runtime  # noqa: E402
from bench_runtime import Stack, run_to_end  # noqa: E402

from balancer.document import DEFAULT_BUFFER_MB, PipelineDocument  # noqa: E402
from balancer.policy import Policy, PolicyError  # noqa: E402
from balancer.sim.control import BENCHMARK_POLICIES  # noqa: E402
from orchestrator.pipeline.generator import (  # noqa: E402
    RECORD_BYTES,
    VALUE_CENTS,
    keys_for,
    record_line,
)
from orchestrator.services.cpu_quota import (  # noqa: E402
    CpuQuotas,
    QuotaError,
    remove_orphans,
)
from orchestrator.services.runconsole import Child  # noqa: E402

REFERENCE = ROOT / "webapp" / "console" / "topologies" / "reference.yaml"
MB = 2**20
# The throughput mode's layers (bench_runtime.throughput_pipeline): nothing migrated or
# throttled, routed by water level.
THROUGHPUT = {"routing": "water_level", "migration": "off", "throttling": "none"}


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: its policy values (None: the plain Spark job), or the arm it is."""

    name: str
    label: str
    values: Mapping[str, object] | None = None
    same_as: str = ""


def _placed(name: str) -> dict[str, object]:
    return {**BENCHMARK_POLICIES[name].values, "placement": "placed"}


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("plain", "plain Spark job, one cgroup of the quotas' sum"),
        Arm("pooled", "pooled, throughput defaults", {"placement": "pooled", **THROUGHPUT}),
        Arm(
            "static",
            "placed, static routing, no migration",
            {"placement": "placed", "routing": "static", "migration": "off"},
        ),
        Arm("balancing-off", "balancing off (= static)", same_as="static"),
        *(
            Arm(n, f"placed, {BENCHMARK_POLICIES[n].label}", _placed(n))
            for n in ("credit", "pressure", "ours")
        ),
        Arm(
            "measured",
            "placed, ours with shares by measured capacity",
            {**_placed("ours"), "routing": "measured"},
        ),
    )
}


def placement_missing() -> str:
    """Why this checkout's policies take no ``placement`` ("" when they do)."""
    try:
        Policy.from_mapping({"placement": "placed"})
    except PolicyError as error:
        return str(error)
    return ""


def arm_policy(arm: Arm, missing: str) -> dict[str, Any] | None:
    """The arm's full policy, or None when it needs ``placed`` and ``missing`` says the
    checkout has no placement (a pooled arm runs without the key: today's behaviour)."""
    values = dict(arm.values or {})
    if missing and values.pop("placement", None) == "placed":
        return None
    return Policy.from_mapping(values).to_dict()


def real_document() -> PipelineDocument:
    """The reference topology with every emulation knob at 0."""
    doc: PipelineDocument = yaml.safe_load(REFERENCE.read_text())
    doc["name"] = "reference-real"
    for edge in doc.get("edges", []):
        edge["bandwidth_mbps"] = 0.0
        edge["latency_ms"] = 0.0
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
    plain: dict[str, Any] = json.loads(json.dumps(doc))
    left = [
        f"{e['from']}->{e['to']} {knob}"
        for e in plain.get("edges", [])
        for knob in ("bandwidth_mbps", "latency_ms")
        if float(e.get(knob) or 0.0) != 0.0
    ] + [
        f"{n['name']} max_rate_mbps"
        for n in plain["nodes"]
        if float(n.get("max_rate_mbps") or 0.0) != 0.0
    ]
    if left:
        raise SystemExit(f"emulation knobs left non-zero: {left}")
    return doc


def branches_of(doc: PipelineDocument) -> list[str]:
    source = next(n["name"] for n in doc["nodes"] if n["kind"] == "source")
    return [e["to"] for e in doc.get("edges", []) if e["from"] == source]


def write_skewed(
    path: Path, mb: float, branches: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """The input file (see the module's docstring); its size, records and hot share."""
    keys = keys_for(branches, args.keys_per_branch)
    hot = keys[args.hot_branch][0]
    others = [k for b in branches for k in keys[b] if k != hot]
    rng = np.random.default_rng(args.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = records = hot_records = 0
    with path.open("w") as out:
        while written < mb * MB:
            block = min(100_000, int((mb * MB - written) / RECORD_BYTES) + 1)
            is_hot = rng.random(block) < args.hot_share
            other = rng.integers(len(others), size=block)
            cents = rng.integers(0, VALUE_CENTS, size=block)
            users = rng.integers(args.users, size=block)
            body = "".join(
                record_line(hot if h else others[k], c, u)
                for h, k, c, u in zip(
                    is_hot.tolist(), other.tolist(), cents.tolist(), users.tolist(), strict=True
                )
            )
            out.write(body)
            written += len(body)
            records += block
            hot_records += int(is_hot.sum())
    return {
        "path": path.name,
        "mb": round(written / MB, 2),
        "bytes": written,
        "records": records,
        "hot_key": hot,
        "hot_branch": args.hot_branch,
        "hot_share": round(hot_records / records, 4),
    }


class QuotaStack(Stack):
    """bench_runtime's Stack with Spark worker N started inside cgroup ``cgroups[N-1]``."""

    def __init__(self, quotas: CpuQuotas, cgroups: list[str]) -> None:
        super().__init__(len(cgroups))
        self.quotas, self.cgroups = quotas, cgroups

    def __enter__(self) -> QuotaStack:
        super().__enter__()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        # A worker stuck in a batch does not end on SIGTERM (a warm shutdown waits for
        # the batch): killed after a grace, so that its cgroup can go.
        for child in self.children:
            child.terminate()
        deadline = time.monotonic() + 30
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"killed worker pid {child.pid}: still running 30 s after SIGTERM",
                    file=sys.stderr,
                )
                child.kill()
                child.wait()
        super().__exit__(exc_type, *rest)

    def spark_children(self) -> list[Child]:
        return [
            dataclasses.replace(child, args=self.quotas.launch_argv(name, child.args))
            for child, name in zip(super().spark_children(), self.cgroups, strict=True)
        ]


def membership(stack: QuotaStack) -> dict[str, Any]:
    """Per worker cgroup: its quota, the kinds of process inside, and the worker's
    descendants (its pool process and JVM among them) found outside it, if any (a
    process that ended meanwhile, or a zombie, which no cgroup lists, is not counted)."""
    import psutil

    out = {}
    for process, name in zip(stack.spark, stack.cgroups, strict=True):
        tree = {process.pid, *(c.pid for c in psutil.Process(process.pid).children(recursive=True))}
        inside = set(stack.quotas.pids(name))
        outside = [p for p in sorted(tree - inside) if _running(p)]
        outside = [p for p in outside if p not in stack.quotas.pids(name)]
        kinds = set()
        for pid in inside:
            with contextlib.suppress(psutil.Error):
                kinds.add(psutil.Process(pid).name())
        out[name] = {
            "quota_us": stack.quotas.quota_text(name),
            "processes": len(inside),
            "kinds": sorted(kinds),
            "worker_tree_outside": outside,
        }
    return out


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def throttled(stack: QuotaStack) -> dict[str, dict[str, int]]:
    return {name: stack.quotas.stat(name) for name in stack.cgroups}


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stack: QuotaStack) -> dict[str, float]:
    """CPU seconds so far: each worker cgroup's processes' (user and system, from
    ``/proc/<pid>/stat``), and the machine's busy and idle time (``/proc/stat``), so that
    a run's difference shows what the workers used of their quotas, what the processes
    outside them (driver, PostgreSQL, Celery, the sink) used, and what was left idle."""
    found: dict[str, float] = {}
    for name in stack.cgroups:
        total = 0
        for pid in stack.quotas.pids(name):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        found[name] = total / CLOCK_TICKS
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    found["machine busy"] = (sum(ticks) - idle) / CLOCK_TICKS
    found["machine idle"] = idle / CLOCK_TICKS
    return found


def cpu_split(
    before: Mapping[str, float], after: Mapping[str, float], seconds: float
) -> dict[str, float]:
    """Cores used on average over ``seconds``: each worker, everything outside them,
    and idle."""
    used = {k: (after[k] - before[k]) / seconds for k in before} if seconds > 0 else {}
    if not used:
        return {}
    workers = {k: v for k, v in used.items() if not k.startswith("machine")}
    return {
        **{k: round(v, 2) for k, v in workers.items()},
        "outside the workers": round(used["machine busy"] - sum(workers.values()), 2),
        "idle": round(used["machine idle"], 2),
    }


def plain_job_child(input_path: str, out: str, topology: str = "") -> None:
    """The ``plain`` arm's process: build the SparkSession, then time the job (of the
    pipeline in the YAML file ``topology``, the unemulated reference when none)."""
    import django

    django.setup()
    from orchestrator.worker.plain_job import batch_summary
    from sparkjobs.session import spark_session

    began = time.monotonic()
    spark_session()
    session_s = time.monotonic() - began
    doc = yaml.safe_load(Path(topology).read_text()) if topology else real_document()
    result = batch_summary(topology=doc, input_path=input_path, generator=None)
    found = {"job_s": result["seconds"], "session_s": round(session_s, 3), "rows": result["rows"]}
    Path(out).write_text(json.dumps(found), encoding="utf-8")


def run_plain(stack: QuotaStack, input_path: Path, topology: Path | None = None) -> dict[str, Any]:
    out = stack.var / "plain-job.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--plain-job", str(input_path)]
    argv += ["--plain-job-out", str(out)]
    if topology is not None:
        argv += ["--plain-topology", str(topology)]
    began = time.monotonic()
    with (stack.var / "plain-job.log").open("ab") as log:
        done = subprocess.run(
            stack.quotas.launch_argv("plain", argv),
            env=stack.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"the plain job failed ({done.returncode}); log in {stack.var}")
    found: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    found["wall_s"] = round(wall, 3)
    return found


def measured_capacities(run: Any) -> dict[str, float]:
    """Each operator node's bytes taken in per second of busy time over the run."""
    try:
        busy = importlib.import_module("orchestrator.ledger.busy")
    except ImportError:
        busy = None
    if busy is not None and hasattr(busy, "measured_capacities"):
        return {k: float(v) for k, v in busy.measured_capacities(run).items()}
    from django.db.models import Max, Min, Sum

    from orchestrator.models import Segment

    operators = [n["name"] for n in run.topology["nodes"] if n["kind"] == "operator"]
    batches = (
        Segment.objects.filter(
            run=run,
            node__in=operators,
            state=Segment.State.DONE,
            marker=False,
            claimed_at__isnull=False,
        )
        .exclude(lease_owner="")
        .values("node", "lease_owner")
        .annotate(size=Sum("bytes"), began=Min("claimed_at"), done=Max("done_at"))
    )
    size: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for batch in batches:
        node = batch["node"]
        size[node] = size.get(node, 0.0) + float(batch["size"] or 0)
        busy_s = (batch["done"] - batch["began"]).total_seconds()
        seconds[node] = seconds.get(node, 0.0) + busy_s
    return {node: size[node] / seconds[node] for node in size if seconds[node] > 0}


def worker_cgroup(worker: str, cgroups: list[str]) -> str:
    """The cgroup of a Spark worker by the name placement gives it: its Celery name
    (``spark@host`` the first, ``spark-N@host`` the N-th, as runconsole.spark_workers
    names them) with ``@`` written ``-`` or not; "" for another name."""
    host = socket.gethostname()
    for number, name in enumerate(cgroups, start=1):
        node = "spark" if number == 1 else f"spark-{number}"
        if worker in {f"{node}@{host}", f"{node}-{host}"}:
            return name
    return ""


def placement_of(run: Any, stack: QuotaStack) -> dict[str, Any]:
    """Where placed mode put each operator instance: its worker's cgroup and quota (the
    run's ``placed`` events; empty for a pooled run), and when, in seconds from the
    run's start."""
    from orchestrator.models import Event

    placed: dict[str, Any] = {}
    for event in Event.objects.filter(run=run, kind="placed").order_by("pk"):
        at = round((event.time - run.started_at).total_seconds(), 2)
        for node, worker in ((event.data or {}).get("placement") or {}).items():
            name = worker_cgroup(str(worker), stack.cgroups)
            cores = stack.quotas.cores.get(name)
            placed[node] = {"on": f"{name} ({cores:g} cores)" if cores else str(worker), "at_s": at}
    return dict(sorted(placed.items()))


def operator_batches(run: Any, stack: QuotaStack) -> list[dict[str, Any]]:
    """The run's operator batches in claim order: the nodes whose data each took, its
    MB, the cgroup of the Spark worker that ran it (from the pool process's pid in the
    lease owner), when it was claimed and how long it was busy (s)."""
    from django.db.models import Max, Min, Sum

    from orchestrator.models import Segment

    operators = [n["name"] for n in run.topology["nodes"] if n["kind"] == "operator"]
    pid_cgroup = {pid: name for name in stack.cgroups for pid in stack.quotas.pids(name)}
    parts = (
        Segment.objects.filter(
            run=run,
            node__in=operators,
            state=Segment.State.DONE,
            marker=False,
            claimed_at__isnull=False,
        )
        .exclude(lease_owner="")
        .values("lease_owner", "node")
        .annotate(size=Sum("bytes"), began=Min("claimed_at"), done=Max("done_at"))
    )
    batches: dict[str, dict[str, Any]] = {}
    for part in parts:
        batch = batches.setdefault(
            part["lease_owner"],
            {"nodes": [], "size": 0, "began": part["began"], "done": part["done"]},
        )
        batch["nodes"].append(part["node"])
        batch["size"] += part["size"] or 0
        batch["began"] = min(batch["began"], part["began"])
        batch["done"] = max(batch["done"], part["done"])
    out = []
    for owner, batch in sorted(batches.items(), key=lambda item: item[1]["began"]):
        fields = owner.split(":")
        pid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        out.append(
            {
                "nodes": "+".join(sorted(batch["nodes"])),
                "mb": round(batch["size"] / MB, 2),
                "on": pid_cgroup.get(pid, "?"),
                "claimed_s": round((batch["began"] - run.started_at).total_seconds(), 2),
                "busy_s": round((batch["done"] - batch["began"]).total_seconds(), 2),
            }
        )
    return out


def worker_capacities(batches: list[dict[str, Any]]) -> dict[str, float]:
    """Each worker cgroup's MB per second of busy time, over the batches it ran."""
    size: dict[str, float] = {}
    busy: dict[str, float] = {}
    for batch in batches:
        size[batch["on"]] = size.get(batch["on"], 0.0) + batch["mb"]
        busy[batch["on"]] = busy.get(batch["on"], 0.0) + batch["busy_s"]
    return {w: round(size[w] / busy[w], 2) for w in sorted(size) if busy[w] > 0}


def mb_by_worker(batches: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for batch in batches:
        out[batch["on"]] = round(out.get(batch["on"], 0.0) + batch["mb"], 2)
    return dict(sorted(out.items()))


def prediction(run: Any, policy: dict[str, Any], workers: int, live_s: float) -> dict[str, Any]:
    """The policy lab's prediction of ``run`` under ``policy``: its replay, calibrated as
    ``manage.py calibrate_sim`` does, simulated as a lab simulates an arm; beside the live
    completion, the error in %. A replay that cannot be made or finished gives why."""
    from balancer.sim.lab import Arm as LabArm
    from balancer.sim.lab import run_lab
    from orchestrator.ledger.calibration import CalibrationError, replay_of

    try:
        replay = replay_of(run, workers=workers)
    except CalibrationError as problem:
        return {"predicted_s": None, "prediction_problem": str(problem)}
    (arm,) = run_lab(replay, [LabArm("live", "live", Policy.from_mapping(policy))]).arms
    if arm.completion_s is None:
        return {"predicted_s": None, "prediction_problem": arm.problem}
    predicted = arm.completion_s
    return {
        "predicted_s": round(predicted, 2),
        "prediction_error_pct": round(100 * (predicted - live_s) / live_s, 1) if live_s else None,
        "placed_costs": {
            node: f"{cost.fixed_s:.2f} s + MB at {cost.bytes_per_s / MB:.2f} MB/s on {cost.worker}"
            for node, cost in replay.runtime.placed.items()
        },
    }


def run_live(
    stack: QuotaStack,
    doc: PipelineDocument,
    policy: dict[str, Any],
    *,
    input_path: Path,
    input_bytes: int,
    plain_rows: list[Any],
    predict: bool = False,
) -> dict[str, Any]:
    from orchestrator.ledger.results import summary

    before = throttled(stack)
    cpu_before, began = cpu_seconds(stack), time.monotonic()
    run = run_to_end(doc, policy, None, input_path=str(input_path))
    cpu_after, wall = cpu_seconds(stack), time.monotonic() - began
    after = throttled(stack)
    result = summary(run)
    completion = float(result["seconds"] or 0.0)
    rows = json.loads(json.dumps(result["rows"]))
    exact = rows == plain_rows and result["coverage"] == "exact" and run.status == "completed"
    capacities = measured_capacities(run)
    batches = operator_batches(run, stack)
    capacity = sum(capacities.get(b, 0.0) for b in branches_of(doc))
    bound = input_bytes / capacity if capacity else float("nan")
    workers = worker_capacities(batches)
    predicted = (
        prediction(run, policy, len(stack.cgroups), completion)
        if predict and policy.get("placement") == "placed"
        else {}
    )
    return {
        "run": run.pk,
        "status": run.status,
        "completion_s": round(completion, 2),
        "migrated_segments": result["migrated_segments"],
        "exact": bool(exact),
        "placement": placement_of(run, stack),
        "mb_by_worker": mb_by_worker(batches),
        "batches": batches,
        "capacities_mb_s": {k: round(v / MB, 2) for k, v in capacities.items()},
        "worker_capacities_mb_s": workers,
        "fluid_bound_workers_s": (
            round(input_bytes / MB / sum(workers.values()), 2) if workers else None
        ),
        "fluid_bound_s": round(bound, 2),
        "ratio_to_bound": round(completion / bound, 3) if capacity else None,
        "throttled_s": {
            name: round(
                (after[name].get("throttled_time", 0) - t.get("throttled_time", 0)) / 1e9, 1
            )
            for name, t in before.items()
        },
        "cores_used": cpu_split(cpu_before, cpu_after, wall),
        **predicted,
    }


def bench(args: argparse.Namespace, quotas: CpuQuotas, cgroups: list[str]) -> dict[str, Any]:
    doc = real_document()
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["buffer_mb"] = args.buffer_mb
    names = [n.strip() for n in args.arms.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; known: {list(ARMS)}")
    missing = placement_missing()
    policies = {n: arm_policy(ARMS[n], missing) for n in names if ARMS[n].values is not None}
    skipped = {n: missing for n, p in policies.items() if p is None}
    for name in skipped:
        print(f"arm {name} skipped: this checkout has no placement ({missing})", file=sys.stderr)
    timed = [
        n
        for n in names
        if n not in skipped and not ARMS[n].same_as and (n == "plain" or policies.get(n))
    ]
    live = [n for n in timed if n != "plain"]
    branches = branches_of(doc)
    with QuotaStack(quotas, cgroups) as stack:
        from django.conf import settings

        batch_mb = float(settings.BPCONSOLE_BATCH_MB)
        inputs = stack.var / "inputs"
        shape = write_skewed(inputs / "real.jsonl", args.mb, branches, args)
        print(f"input {shape}", file=sys.stderr)
        runs: list[dict[str, Any]] = []
        warm = vars(args) | {"seed": args.seed + 1}
        write_skewed(inputs / "warmup.jsonl", args.warmup_mb, branches, argparse.Namespace(**warm))
        if live:
            run_to_end(doc, policies[live[0]] or {}, None, input_path=str(inputs / "warmup.jsonl"))
        cgroup_check = membership(stack)
        print(f"cgroups {cgroup_check}", file=sys.stderr)
        reference = run_plain(stack, inputs / "real.jsonl")  # the rows every run must equal
        plain_rows = reference["rows"]
        for round_index in range(args.rounds):
            shift = round_index % max(1, len(timed))
            for name in timed[shift:] + timed[:shift]:
                if name == "plain":
                    found = run_plain(stack, inputs / "real.jsonl")
                    row = {
                        "completion_s": found["job_s"],
                        "wall_s": found["wall_s"],
                        "session_s": found["session_s"],
                        "exact": found["rows"] == plain_rows,
                        "migrated_segments": 0,
                    }
                else:
                    row = run_live(
                        stack,
                        doc,
                        policies[name] or {},
                        input_path=inputs / "real.jsonl",
                        input_bytes=shape["bytes"],
                        plain_rows=plain_rows,
                        predict=args.predict,
                    )
                row = {"arm": name, "round": round_index + 1, **row}
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "batches"}), file=sys.stderr)
    return {
        "command": shlex.join(sys.orig_argv),
        "quotas": dict(zip(cgroups, args.quota_list, strict=True))
        | {"plain": sum(args.quota_list)},
        "placement": "known" if not missing else f"unknown: {missing}",
        "batch_mb": batch_mb,
        "skipped": skipped,
        "input": shape,
        "cgroups": cgroup_check,
        "predict": args.predict,
        "arms": summarise(names, runs),
        "runs": runs,
    }


def summarise(names: list[str], runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    medians = {}
    for name in {r["arm"] for r in runs}:
        medians[name] = statistics.median(r["completion_s"] for r in runs if r["arm"] == name)

    def ratio(value: float, other: str) -> float | None:
        return round(value / medians[other], 3) if medians.get(other) else None

    arms: dict[str, dict[str, Any]] = {}
    for name in names:
        own = ARMS[name].same_as or name
        mine = [r for r in runs if r["arm"] == own]
        if not mine:
            continue
        completion = medians[own]
        bounds = [r["ratio_to_bound"] for r in mine if r.get("ratio_to_bound") is not None]
        predicted = [r["predicted_s"] for r in mine if r.get("predicted_s") is not None]
        errors = [
            r["prediction_error_pct"] for r in mine if r.get("prediction_error_pct") is not None
        ]
        arms[name] = {
            "label": ARMS[name].label,
            "median_s": round(completion, 2),
            "min_s": min(r["completion_s"] for r in mine),
            "max_s": max(r["completion_s"] for r in mine),
            "x_plain": ratio(completion, "plain"),
            "fluid_bound_s": (
                statistics.median(r["fluid_bound_s"] for r in mine) if bounds else None
            ),
            "x_bound": round(statistics.median(bounds), 3) if bounds else None,
            "x_static": ratio(completion, "static"),
            "x_pooled": ratio(completion, "pooled"),
            "migrated": statistics.median(r["migrated_segments"] for r in mine),
            "exact": all(r["exact"] for r in mine),
            "rounds": len(mine),
            "predicted_s": round(statistics.median(predicted), 2) if predicted else None,
            "prediction_error_pct": round(statistics.median(errors), 1) if errors else None,
        }
    return arms


def print_table(report: dict[str, Any]) -> None:
    print(f"command: {report['command']}")
    print(
        f"quotas (cores): {report['quotas']}; placement {report['placement']}; "
        f"batches of at most {report['batch_mb']:g} MB"
    )
    print(f"input: {report['input']}")
    for name, why in report["skipped"].items():
        print(f"skipped {name}: {why}")

    def shown(value: float | None, unit: str = "x") -> str:
        return "-" if value is None else f"{value:.2f}{unit}"

    predicted = report["predict"]
    print(
        "| arm | median completion | min/max | x plain | fluid bound | x bound | "
        "x static | x pooled | migrated | exact |" + (" predicted | error |" if predicted else "")
    )
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if predicted else ""))
    for name, row in report["arms"].items():
        print(
            f"| {row['label']} (`{name}`) | {row['median_s']:.2f} s | "
            f"{row['min_s']:.2f}/{row['max_s']:.2f} | {shown(row['x_plain'])} | "
            f"{shown(row['fluid_bound_s'], ' s')} | {shown(row['x_bound'])} | "
            f"{shown(row['x_static'])} | {shown(row['x_pooled'])} | {row['migrated']:g} | "
            f"{'yes' if row['exact'] else 'NO'} |"
            + (
                f" {shown(row['predicted_s'], ' s')} | {shown(row['prediction_error_pct'], ' %')} |"
                if predicted
                else ""
            )
        )


def print_runs(report: dict[str, Any]) -> None:
    for row in report["runs"]:
        if "mb_by_worker" not in row:
            continue
        placed = ", ".join(
            f"{n} on {p['on']} at {p['at_s']} s" for n, p in row["placement"].items()
        )
        print(
            f"round {row['round']} {row['arm']}: {row['completion_s']:.2f} s; MB by worker "
            f"{row['mb_by_worker']}; {len(row['batches'])} batches; throttled (s) "
            f"{row['throttled_s']}; cores used {row['cores_used']}; "
            f"worker MB/s {row['worker_capacities_mb_s']}, bound "
            f"{row['fluid_bound_workers_s']} s; placed: {placed or 'none'}"
        )
        if row.get("predicted_s") is not None:
            print(
                f"  predicted {row['predicted_s']:.2f} s against {row['completion_s']:.2f} s "
                f"live (error {row['prediction_error_pct']} %); fitted {row['placed_costs']}"
            )
        elif "prediction_problem" in row:
            print(f"  not predicted: {row['prediction_problem']}")


def with_quotas(
    name: str,
    quota_list: list[float],
    run: Callable[[CpuQuotas, list[str]], dict[str, Any]],
) -> dict[str, Any] | None:
    """``run(quotas, cgroups)`` with a worker cgroup ``w1``.. per quota and one for the
    plain job holding their sum, removed afterwards (on SIGTERM too; those of a bench
    of the same name killed outright are removed first); None, having said why and made
    nothing, when the quotas cannot be made."""
    cgroups = [f"w{i}" for i in range(1, len(quota_list) + 1)]
    cores = dict(zip(cgroups, quota_list, strict=True)) | {"plain": sum(quota_list)}
    for orphan in remove_orphans(f"bpconsole-{name}"):
        print(f"{name}: removed cgroup {orphan} of a bench killed before", file=sys.stderr)

    # SIGTERM (a timeout, a kill) unwinds as Ctrl-C does: the workers stopped, the
    # cgroups removed.
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    quotas = CpuQuotas(cores, prefix=f"bpconsole-{name}-{os.getpid()}")
    try:
        quotas.__enter__()
    except QuotaError as error:
        print(f"{name}: no CPU quotas, nothing run: {error}", file=sys.stderr)
        return None
    try:
        return run(quotas, cgroups)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; workers stopped, cgroups removed", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        quotas.remove()


def quota_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"quotas are cores separated by commas: {text!r}"
        ) from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise argparse.ArgumentTypeError(f"quotas are positive numbers of cores: {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=512.0, help="input file, MB")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quotas", type=quota_list, default=[1.0, 0.5, 0.25], dest="quota_list")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--hot-share", type=float, default=0.35)
    parser.add_argument("--hot-branch", default="task2")
    parser.add_argument("--keys-per-branch", type=int, default=16)
    parser.add_argument("--users", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-mb", type=float, default=16.0)
    parser.add_argument(
        "--buffer-mb",
        type=float,
        default=DEFAULT_BUFFER_MB,
        help="each branch's pool, MB: the source holds the rest back, for the balancer to route",
    )
    parser.add_argument(
        "--batch-mb",
        type=float,
        default=None,
        help="BPCONSOLE_BATCH_MB for the stack (default: half of --buffer-mb; 0: the "
        "setting as configured)",
    )
    parser.add_argument(
        "--run-timeout-s", type=float, default=900.0, help="give up on a run after this long"
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="predict each placed run from its own replay, against its live completion",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plain-job", default="", help=argparse.SUPPRESS)
    parser.add_argument("--plain-job-out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--plain-topology", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_job:
        plain_job_child(args.plain_job, args.plain_job_out, args.plain_topology)
        return 0
    print(f"command: {shlex.join(sys.orig_argv)}", file=sys.stderr, flush=True)
    if args.hot_branch not in branches_of(real_document()):
        parser.error(f"--hot-branch is one of {branches_of(real_document())}")
    bench_runtime.RUN_TIMEOUT_S = args.run_timeout_s
    if args.batch_mb is None:
        args.batch_mb = args.buffer_mb / 2
    if args.batch_mb:
        os.environ["BPCONSOLE_BATCH_MB"] = f"{args.batch_mb:g}"  # the stack's children's
    report = with_quotas("bench_real_balance", args.quota_list, lambda q, c: bench(args, q, c))
    if report is None:
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
        print_runs(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
