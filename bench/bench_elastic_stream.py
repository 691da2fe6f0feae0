"""Scenario S2: an unbounded run overloaded, then underloaded, on Spark workers the
operating system caps, beside an elastic pool that may add a capped worker: the source's
lag, the time to drain it, the worker asked, live, used and given back, and the memory
and disk of the whole stack meanwhile.

    .venv/bin/python bench/bench_elastic_stream.py [--quotas 1.0,0.5] [--elastic-quota 1.0]
        [--elastic-extra 1] [--policy ours] [--overload-s 120] [--overload-x 1.5]
        [--underload-x 0.5] [--drain-timeout-s 600] [--mb-s MBPS] [--warmup-mb 16]
        [--measure-mb 400] [--measure-skip-s 20] [--measure-s 60] [--buffer-mb 8]
        [--file-mb 1] [--sustained-samples 5] [--scale-in-after-s 20]
        [--scale-in-busy SHARE] [--rounds 1] [--seed 7] [--json]

**The pipeline**: the reference topology with every emulation knob at 0
(bench_real_balance's ``real_document``, checked before anything runs), each branch's
pool ``--buffer-mb`` (8 MB: the source holds the rest back, so an overload shows as lag
at the source within seconds rather than once the reference's 3 x 64 MB of pools are
full). It reads a landing folder (``stable_s`` 0: the producer renames whole files in;
merged files archived) fed by the producer in a thread of this process
(bench_unbounded's ``Producer``: steady pattern, ``--file-mb`` part files, keys spread
evenly over task1..task3).

**The machine**: the embedded stack (bench_runtime's ``Stack``) with one Spark worker per
``--quotas`` entry, each in a cgroup of its own whose CFS quota is that many cores
(bench_real_balance's ``QuotaStack``), and the elastic pool as ``manage.py
elastic_workers`` runs it (``orchestrator.services.spark_pool.SparkPool`` with a
supervisor of its own, ticked in a thread of this process): its base is the ``--quotas``
workers, its maximum base + ``--elastic-extra``, and the worker numbered n it starts
(``spark-n@host``: Celery, its pool process and its Spark JVM) runs inside the n-th
cgroup, of ``--elastic-quota`` cores. Every cgroup is made before the stack starts and
removed at the end (``with_quotas``, which also makes a ``plain`` cgroup, unused here:
the exactness check's plain job runs untimed in this process). Not root, no writable cpu
controller, or a cgroup that cannot be made: one line says why and the bench exits with
code 2 having made nothing. The control worker, beat, the services and this process are
not capped: the machine's cores are shared by all.

**The policy**: ``balancer.sim.control.BENCHMARK_POLICIES[--policy]`` (``ours`` by
default: S1's best balancing policy) with ``placement = placed``. Where this checkout's
policies have ``scale_in_after_s`` (how long every instance must stay under
``scale_in_busy`` busy before a run gives a worker back), it is ``--scale-in-after-s``,
and ``scale_in_busy`` is ``--scale-in-busy`` when given; without them the run keeps the
window built into ``orchestrator/rescale/elastic.py``, and the report says which. A
checkout without ``placement`` cannot run S2: it says so and exits with code 2.

**Warm-up**: one untimed bounded run of ``--warmup-mb`` of the producer's records with
the run's policy, so that no phase measures a cold JVM.

**Phase 0, the pipeline's capacity** (``--mb-s`` gives it instead, and the phase is
skipped). A run of its own, before the pool starts, over a backlog of ``--measure-mb``
written into its landing folder before it starts: after ``--measure-skip-s`` (the first
batches, the pools filling), the bytes its operators complete per second over
``--measure-s``, or until the source has taken the whole backlog in (the window is then
shorter, and reported; so is the rate over each half of it, which differ when the figure
is not steady). Why this measure: it is the rate the pipeline sustains on the base
workers while data always waits at the source, the overload's own regime, end to end
(the source's reads, the gaps between batches where a pool waits for the source, the
sink's merges). Not a bounded run's throughput (a continuous run over a landing folder
sustained half of it, issue 17's bench), nor the sum of the nodes' measured capacities
(bytes per busy second count a worker that runs two branches once per branch and leave
the gaps out, S1). With no pool running, whatever the balancer asks meanwhile is refused
(and reported), so the figure is the base workers'. The window must be shorter than the
segment rows' retention (``BPCONSOLE_SEGMENT_ROWS_KEEP_S``), or its first rows would be
gone when it is summed.

**Phases 1 and 2**, each round (``--rounds``) on a fresh run and landing folder, at the
same capacity: the producer at ``--overload-x`` (1.5) times the capacity for
``--overload-s``, then at ``--underload-x`` (0.5) times it until the lag is back to zero
and the run neither asks for nor holds a worker beyond the base (none added, or all given
back), or ``--drain-timeout-s`` after phase 2 began; then the run is stopped
(``stop_run``) and checked (``exactness``: its rows against the plain Spark job over the
archive folder, which must hold exactly the bytes the run emitted, and its coverage
exact). No elastic worker runs when a round starts.

**Sampled every second** (t = seconds since phase 1 began): the source's lag (files,
bytes, the oldest's age, from the driver's snapshot) and the files not merged yet in the
landing folder; each operator's level, busy share and worker; the Spark workers
registered in ZooKeeper and the run's ask of the pool; the processes in each worker
cgroup (pids); the resident memory (RSS, psutil) of every process tree of the stack (this
process alone, its Spark JVM once an exactness check started one, the control worker,
beat, each service, each Spark worker with its pool process and JVM); the disk used
(blocks) under the stack's folder, the landing and archive folders and the run's folder.
Each sample notes how long it took: on a loaded machine, over a second. The run's events
``worker_asked``, ``adjust_refused``, ``placed`` and ``worker_lost`` are read as they come
(a continuous run thins its old balancer events), its adjustments at the end; each worker
cgroup's CPU time throttled (and used, with cgroup v2) over the round (``cpu.stat``).

**Definitions**, in seconds since phase 1 began and in balancer ticks (the policy's
``tick_ms``) since the overload was sustained:

- *sustained overload*: the first ``--sustained-samples`` (5) consecutive phase-1 samples
  in which the lag is above zero, never smaller than at the sample before, and larger at
  the last than at the first; it *began* at the first of them and *is sustained* from the
  last, once it has been seen that long. Delays count from the latter;
- *asked*: the run's first ``worker_asked`` event; *live*: when the first Spark worker
  beyond the base ones registered in ZooKeeper (the time its znode holds); *scale-out*:
  the ``scale_out`` adjustment that placed an instance on it (began, completed); *used*:
  the first batch done by an instance that adjustment added (sampled, since segment rows
  go after their retention);
- *released*: the ``scale_in`` adjustment (began, completed), the first sample after the
  run's largest ask with a smaller one, and the last elastic worker process's exit;
- *drained*: the first phase-2 sample whose lag is zero; the time to drain counts from
  phase 2's start.

**Targets**, each printed as holding or not, per round (a target not judged says why,
and does not hold): no record lost or duplicated (the exactness check); a worker asked
within three balancer ticks of sustained overload (the balancer's decision: starting a
Celery worker and its JVM takes seconds whatever it decides, so when it was live and used
is printed beside it, not judged); every worker added given back before the run was
stopped; the lag back to zero.

The table: one row per round, then the targets. ``--json`` prints every figure instead,
the samples among them. A round with the defaults takes about 10 minutes on an idle
machine with two cores: the stack's start, the warm-up and phase 0 (2 minutes), the
2 minutes of overload, the drain (as long again without an extra worker), the plain job
over the 600 to 700 MB taken in; up to ``--drain-timeout-s`` more when a worker is added
and not given back.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_peers import Part, rss_of  # noqa: E402
from bench_real_balance import (  # noqa: E402
    QuotaStack,
    placement_missing,
    quota_list,
    real_document,
    with_quotas,
    worker_cgroup,
)
from bench_runtime import run_to_end  # noqa: E402
from bench_unbounded import (  # noqa: E402
    MB,
    Producer,
    Source,
    disk_bytes,
    exactness,
    start_unbounded,
    stop_run,
)

from balancer.document import PipelineDocument  # noqa: E402
from balancer.policy import PARAMETERS_BY_NAME, Policy  # noqa: E402
from balancer.sim.control import BENCHMARK_POLICIES  # noqa: E402
from orchestrator.services.cpu_quota import CpuQuotas  # noqa: E402
from orchestrator.services.runconsole import MAX_SPARK_WORKERS, Child, spark_worker  # noqa: E402
from orchestrator.services.spark_pool import SparkPool  # noqa: E402
from orchestrator.services.supervisor import Supervisor  # noqa: E402

SAMPLE_S = 1.0
WATCHED_EVENTS = ("worker_asked", "adjust_refused", "placed", "worker_lost")
WORKERS_GONE_S = 90.0  # after the run's stop, for the pool to stop its workers
TARGET_TICKS = 3


# -- the elastic pool ---------------------------------------------------------------


class ElasticPool:
    """The elastic pool as ``manage.py elastic_workers`` runs it (a ``SparkPool`` with a
    supervisor of its own, ticked every ``INTERVAL_S``), in a thread of this process; the
    worker numbered n it starts runs inside cgroup ``cgroups[n - 1]``."""

    def __init__(self, stack: QuotaStack, cgroups: list[str], maximum: int) -> None:
        from django.conf import settings

        from orchestrator.zk.control_plane import ControlPlane

        self.stack, self.cgroups = stack, cgroups
        self.control = ControlPlane.connect(settings.ZK_HOSTS)
        self.lines: list[tuple[float, str]] = []
        self.started: list[tuple[str, Child]] = []  # (cgroup, worker), each it made
        self.pool = SparkPool(
            len(stack.cgroups),
            maximum,
            self._make,
            self.control,
            Supervisor(say=self._say),
            self._say,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _make(self, number: int) -> Child:
        child = spark_worker(number, sys.executable, self.stack.env, self.stack.var)
        cgroup = self.cgroups[number - 1]
        child = dataclasses.replace(child, args=self.stack.quotas.launch_argv(cgroup, child.args))
        self.started.append((cgroup, child))
        return child

    def _say(self, line: str) -> None:
        self.lines.append((time.time(), line))
        print(f"pool: {line}", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        from orchestrator.management.commands.elastic_workers import INTERVAL_S

        while not self.stop.wait(INTERVAL_S):
            self.pool.supervisor.tick()
            try:
                self.pool.tick()
            except Exception as exc:  # noqa: BLE001 - as the command: a pass is delayed, no more
                self._say(f"{type(exc).__name__}: {exc}")

    def alive(self) -> list[tuple[str, Child]]:
        """The workers it started that still run, with their cgroups: the worker's own
        process, or any process in its cgroup (its JVM ends a moment after it)."""
        return [
            (g, c)
            for g, c in self.started
            if (c.process is not None and c.poll() is None) or self.stack.quotas.pids(g)
        ]

    def __enter__(self) -> ElasticPool:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        """Stop ticking; stop what still runs (killed 30 s after SIGTERM, so that its
        cgroup can go)."""
        self.stop.set()
        self.thread.join(30)
        running = [c for _, c in self.alive()]
        for child in running:
            if child.process is not None:
                child.process.terminate()
        deadline = time.monotonic() + 30
        for child in running:
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        self.control.close()


def spark_workers(control: Any) -> dict[str, dict[str, Any]]:
    """The Spark workers registered in ZooKeeper, with what each registered."""
    workers: dict[str, dict[str, Any]] = control.live_workers()
    return {name: info for name, info in workers.items() if "spark" in info.get("queues", [])}


# -- what is measured -----------------------------------------------------------------


def stack_parts(stack: QuotaStack, pool: ElasticPool) -> dict[str, Part]:
    """Every process tree of the stack, by part (see the module's docstring)."""
    import psutil

    parts: dict[str, Part] = {
        "bench Python": (os.getpid(), False, None),
        "control worker": (stack.control.pid, True, None),
        "beat": (stack.beat.pid, True, None),
    }
    for process, name in zip(stack.spark, stack.cgroups, strict=True):
        parts[f"spark worker {name}"] = (process.pid, True, None)
    for cgroup, child in pool.alive():
        if child.process is not None:
            parts[f"spark worker {cgroup} (elastic)"] = (child.process.pid, True, None)
    services = {s.name: s.process.pid for s in stack.launcher.started if s.process}
    for name, pid in services.items():
        parts[name] = (pid, True, None)
    known = {c.pid for c in stack.children} | set(services.values())
    known |= {c.process.pid for _, c in pool.started if c.process is not None}
    with contextlib.suppress(psutil.Error):
        for kid in psutil.Process().children():
            if kid.pid not in known and kid.name() == "java":
                parts["bench JVM"] = (kid.pid, True, None)
    return parts


def cpu_seconds(quotas: CpuQuotas, cgroups: list[str]) -> dict[str, dict[str, float]]:
    """Each cgroup's CPU time throttled and, with cgroup v2 (v1 keeps it in another
    controller's hierarchy), used, in seconds."""
    out = {}
    for name in cgroups:
        stat = quotas.stat(name)
        if "throttled_usec" in stat:
            out[name] = {
                "throttled": stat["throttled_usec"] / 1e6,
                "used": stat.get("usage_usec", 0) / 1e6,
            }
        else:
            out[name] = {"throttled": stat.get("throttled_time", 0) / 1e9}
    return out


def operator_done_bytes(run: Any, after: Any, until: Any) -> int:
    """Bytes of the operators' segments done in (after, until]."""
    from django.db.models import Sum

    from orchestrator.models import Segment

    operators = [n["name"] for n in run.topology["nodes"] if n["kind"] == "operator"]
    done = Segment.objects.filter(
        run=run,
        node__in=operators,
        state=Segment.State.DONE,
        marker=False,
        done_at__gt=after,
        done_at__lte=until,
    ).aggregate(size=Sum("bytes"))
    return int(done["size"] or 0)


def refusals(run: Any) -> list[str]:
    from orchestrator.models import Event

    return list(
        Event.objects.filter(run=run, kind="adjust_refused")
        .order_by("pk")
        .values_list("reason", flat=True)
    )


def write_records(folder: Path, mb: float, args: argparse.Namespace, seed: int) -> int:
    """``mb`` of the producer's records as part files in ``folder``, written at once;
    the bytes written."""
    from orchestrator.pipeline.producer import MAX_RATE_BPS, FolderTarget

    writer = Producer(
        FolderTarget(folder),
        rate_bps=MAX_RATE_BPS,
        seconds=None,
        seed=seed,
        file_bytes=int(args.file_mb * MB),
        max_bytes=int(mb * MB),
    )
    writer.start()
    return int(writer.result()["bytes"])


def warm_up(
    stack: QuotaStack, doc: PipelineDocument, policy: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """An untimed bounded run over ``--warmup-mb`` of the producer's records with the
    run's policy, so that each base worker's JVM has run batches (class loading, JIT)
    before anything is measured: a cold JVM's first batches under a quota take several
    times a warm one's."""
    folder = stack.var / "warmup"
    written = write_records(folder, args.warmup_mb, args, args.seed - 1)
    run = run_to_end(doc, policy, None, input_path=str(folder / "*.jsonl"))
    shutil.rmtree(folder, ignore_errors=True)
    if run.status != "completed":
        raise RuntimeError(f"warm-up run {run.pk} {run.status}: {run.error}")
    return {"run": run.pk, "mb": round(written / MB, 1)}


def measure_capacity(
    stack: QuotaStack, doc: PipelineDocument, policy: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Phase 0 (see the module's docstring): the pipeline's capacity, bytes per second."""
    from django.conf import settings
    from django.utils import timezone

    if args.measure_s >= settings.BPCONSOLE_SEGMENT_ROWS_KEEP_S:
        raise SystemExit(
            f"--measure-s {args.measure_s:g} must be under the segment rows' retention, "
            f"BPCONSOLE_SEGMENT_ROWS_KEEP_S = {settings.BPCONSOLE_SEGMENT_ROWS_KEEP_S:g} s"
        )
    source = Source.make(stack.var, "measure", stream=False)
    if source.landing is None:
        raise RuntimeError("a folder source without its folder")
    written = write_records(source.landing, args.measure_mb, args, args.seed)
    run = start_unbounded(doc, source.spec(0.0), policy)
    time.sleep(args.measure_skip_s)
    began, clock = timezone.now(), time.monotonic()
    ended_by = "the window's end"
    while time.monotonic() - clock < args.measure_s:
        time.sleep(SAMPLE_S)
        lag = lag_of(run.pk)
        if lag is not None and not lag["entries"]:
            ended_by = "the source took the whole backlog in"
            break
    ended = timezone.now()
    seconds = (ended - began).total_seconds()
    middle = began + (ended - began) / 2
    halves = [operator_done_bytes(run, began, middle), operator_done_bytes(run, middle, ended)]
    done = sum(halves)
    if not done:
        raise RuntimeError(f"phase 0: run {run.pk} completed no batch in {seconds:.0f} s")
    stop_run(run, drain_s=0.0)
    refused = refusals(run)
    source.remove()
    found = {
        "run": run.pk,
        "backlog_mb": round(written / MB, 1),
        "skip_s": args.measure_skip_s,
        "window_s": round(seconds, 1),
        "ended_by": ended_by,
        "done_mb": round(done / MB, 1),
        "capacity_mb_s": round(done / MB / seconds, 3),
        "halves_mb_s": [round(h / MB / (seconds / 2), 3) for h in halves],
        "refused": refused,
    }
    print(f"phase 0: {found}", file=sys.stderr, flush=True)
    return found


def lag_of(run_id: int) -> dict[str, Any] | None:
    """The source's lag at the driver's last tick (None: not reported)."""
    from orchestrator.run.lifecycle import snapshot

    lag = (snapshot(run_id).get("source") or {}).get("lag")
    return dict(lag) if lag else None


class Watch:
    """One round's observations: a sample a second, the run's events as they come, the
    first batch of each instance a scale-out added, each worker cgroup's CPU time."""

    def __init__(self, stack: QuotaStack, pool: ElasticPool, run: Any, source: Source) -> None:
        self.stack, self.pool, self.run, self.source = stack, pool, run, source
        self.cgroups = pool.cgroups
        self.lines = len(pool.lines)  # the pool's lines and workers before the round
        self.workers = len(pool.started)
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.used: dict[str, float] = {}  # added instance -> its first batch done
        self.registered: dict[str, float] = {}  # elastic worker -> when it registered
        self.exited: dict[int, float] = {}  # elastic worker pid -> when it was seen gone
        self.last_event = 0
        self.cpu_before = cpu_seconds(stack.quotas, self.cgroups)
        self.clock, self.wall = time.monotonic(), time.time()

    def now(self) -> float:
        return time.monotonic() - self.clock

    def at(self, moment: Any) -> float:
        """A database time as seconds since phase 1 began."""
        return round(float(moment.timestamp()) - self.wall, 2)

    def sample(self, phase: int) -> dict[str, Any]:
        from orchestrator.pipeline.layout import run_dir
        from orchestrator.run.lifecycle import snapshot

        t = self.now()
        workers = spark_workers(self.pool.control)
        for name, info in workers.items():
            if not worker_cgroup(name, self.stack.cgroups):  # not a base worker
                self.registered.setdefault(name, round(float(info["started"]) - self.wall, 2))
        view: dict[str, Any] = dict(snapshot(self.run.pk))
        # None when the snapshot has no lag (no driver tick yet): never read as zero.
        lag = (view.get("source") or {}).get("lag") or {}
        files, size, age = self.source.unmerged(self.run)
        memory = rss_of(stack_parts(self.stack, self.pool))
        control = self.pool.control
        row = {
            "t": round(t, 2),
            "phase": phase,
            "lag_entries": lag.get("entries"),
            "lag_bytes": lag.get("bytes"),
            "lag_age_s": lag.get("age_s"),
            "unmerged_files": files,
            "unmerged_mb": round(size / MB, 2),
            "unmerged_age_s": round(age, 2),
            "nodes": {
                n["name"]: {
                    "level": n["state"].get("level"),
                    "busy": n["state"].get("busy"),
                    "on": n["instance"].get("worker", ""),
                }
                for n in view.get("nodes", [])
                if n["kind"] == "operator"
            },
            "registered": sorted(workers),
            "asked": control.spark_workers_asked().get(str(self.run.pk), 0),
            "cgroup_pids": {g: self.stack.quotas.pids(g) for g in self.cgroups},
            "elastic_alive": [
                {"cgroup": g, "pid": c.process.pid}
                for g, c in self.pool.alive()
                if c.process is not None
            ],
            "rss_mb": {name: round(v / MB, 1) for name, v in memory.items()},
            "rss_mb_all": round(sum(memory.values()) / MB, 1),
            "disk_mb": {
                "stack": round(disk_bytes(self.stack.var) / MB, 1),
                "landing": round(disk_bytes(self.source.landing) / MB, 1),
                "archive": round(disk_bytes(self.source.archive) / MB, 1),
                "run": round(disk_bytes(run_dir(self.run.pk)) / MB, 1),
            },
        }
        self.note_exits(t)
        self._read_events()
        self._read_used()
        row["took_s"] = round(self.now() - t, 2)
        self.samples.append(row)
        self.run.refresh_from_db(fields=["status", "error"])
        if not self.run.is_active:
            raise RuntimeError(f"run {self.run.pk} ended: {self.run.status} {self.run.error}")
        time.sleep(max(0.0, SAMPLE_S - (self.now() - t)))
        return row

    def note_exits(self, t: float) -> None:
        """Note when each elastic worker process is first seen gone."""
        for _, child in self.pool.started:
            process = child.process
            if process is not None and process.poll() is not None:
                self.exited.setdefault(process.pid, round(t, 2))

    def _read_events(self) -> None:
        from orchestrator.models import Event

        for event in Event.objects.filter(
            run=self.run, kind__in=WATCHED_EVENTS, pk__gt=self.last_event
        ).order_by("pk"):
            self.last_event = event.pk
            self.events.append(
                {
                    "t": self.at(event.time),
                    "kind": event.kind,
                    "node": event.node,
                    "reason": event.reason,
                    "data": event.data,
                }
            )

    def _read_used(self) -> None:
        from django.db.models import Min

        from orchestrator.models import Adjustment, Segment

        added = {
            name
            for plan in Adjustment.objects.filter(run=self.run, kind="scale_out").values_list(
                "plan", flat=True
            )
            for name in plan.get("added", [])
        }
        for name in sorted(added - set(self.used)):
            first = Segment.objects.filter(
                run=self.run, node=name, state=Segment.State.DONE, marker=False
            ).aggregate(first=Min("done_at"))["first"]
            if first is not None:
                self.used[name] = self.at(first)

    def adjustments(self) -> list[dict[str, Any]]:
        from orchestrator.models import Adjustment

        return [
            {
                "version": a.version,
                "kind": a.kind,
                "status": a.status,
                "began_s": self.at(a.started_at),
                "ended_s": self.at(a.finished_at) if a.finished_at else None,
                "added": a.plan.get("added", []),
                "removed": a.plan.get("removed", []),
                "placement": {
                    n: f"{w} ({worker_cgroup(str(w), self.cgroups) or '?'})"
                    for n, w in (a.placement or {}).items()
                },
                "reason": a.reason,
            }
            for a in Adjustment.objects.filter(run=self.run).order_by("version")
        ]

    def cpu(self) -> dict[str, dict[str, float]]:
        after = cpu_seconds(self.stack.quotas, self.cgroups)
        return {
            name: {k: round(after[name][k] - self.cpu_before[name][k], 1) for k in after[name]}
            for name in self.cgroups
        }


# -- one round ------------------------------------------------------------------------


def overload_round(
    stack: QuotaStack,
    pool: ElasticPool,
    doc: PipelineDocument,
    policy: dict[str, Any],
    *,
    capacity_bps: float,
    args: argparse.Namespace,
    number: int,
) -> dict[str, Any]:
    """Phases 1 and 2 on a fresh run, then the stop and the exactness check."""
    if pool.alive():
        raise RuntimeError(f"elastic workers still run before round {number}: {pool.alive()}")
    source = Source.make(stack.var, f"round{number}", stream=False)
    run = start_unbounded(doc, source.spec(0.0), policy)
    watch = Watch(stack, pool, run, source)
    file_bytes = int(args.file_mb * MB)
    overload = Producer(
        source.target(),
        rate_bps=args.overload_x * capacity_bps,
        seconds=args.overload_s,
        seed=args.seed + 2 * number,
        file_bytes=file_bytes,
    )
    overload.start()
    try:
        while overload.is_alive():
            watch.sample(1)
    finally:
        overload.stop.set()
    produced = [overload.result()]
    phase2 = round(watch.now(), 2)  # as the samples' times
    underload = Producer(
        source.target(),
        rate_bps=args.underload_x * capacity_bps,
        seconds=None,
        seed=args.seed + 2 * number + 1,
        file_bytes=file_bytes,
    )
    underload.start()
    ended_by = f"the deadline, {args.drain_timeout_s:g} s after phase 2 began"
    try:
        drained = False
        while watch.now() - phase2 < args.drain_timeout_s:
            row = watch.sample(2)
            drained = drained or row["lag_entries"] == 0
            if drained and not row["asked"] and not pool.alive():
                # Seen gone now, before the run is stopped (a worker that exited since
                # the sample's own look is not noted later than it was seen).
                watch.note_exits(watch.now())
                ended_by = "the lag back to zero, no worker asked or running beyond the base"
                break
    finally:
        underload.stop.set()
    produced.append(underload.result())
    stopped = watch.now()
    run = stop_run(run, drain_s=0.0)
    deadline = time.monotonic() + WORKERS_GONE_S
    while pool.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    watch.note_exits(watch.now())
    left = [{"cgroup": g, "pid": c.process.pid} for g, c in pool.alive() if c.process]
    checked = exactness(run, doc, stack.var, source)
    source.remove()
    report = summarise_round(watch, args, phase2, stopped, policy["tick_ms"] / 1000)
    return {
        "round": number,
        "run": run.pk,
        "rates_mb_s": {
            "overload_target": round(args.overload_x * capacity_bps / MB, 3),
            "overload_produced": round(produced[0]["rate_bps"] / MB, 3),
            "underload_target": round(args.underload_x * capacity_bps / MB, 3),
            "underload_produced": round(produced[1]["rate_bps"] / MB, 3),
        },
        "produced_mb": round(sum(p["bytes"] for p in produced) / MB, 1),
        "phase2_began_s": round(phase2, 2),
        "phase2_ended_by": ended_by,
        "elastic_left_after_stop": left,
        "exactness": checked,
        **report,
        "targets": targets(report, checked),
        "events": watch.events,
        "pool_lines": [(round(w - watch.wall, 2), line) for w, line in pool.lines[watch.lines :]],
        "samples": watch.samples,
    }


def sustained_overload(samples: list[dict[str, Any]], n: int) -> tuple[float, float] | None:
    """(began, sustained from): see the module's docstring."""
    phase1 = [s for s in samples if s["phase"] == 1]
    for i in range(len(phase1) - n + 1):
        lags = [s["lag_bytes"] or 0 for s in phase1[i : i + n]]
        grows = all(b >= a for a, b in itertools.pairwise(lags))
        if min(lags) > 0 and grows and lags[-1] > lags[0]:
            return phase1[i]["t"], phase1[i + n - 1]["t"]
    return None


def first(values: list[float]) -> float | None:
    return min(values) if values else None


def ask_lowered(samples: list[dict[str, Any]]) -> float | None:
    """The first sample after the run's largest ask of the pool with a smaller one."""
    most = max((s["asked"] for s in samples), default=0)
    if not most:
        return None
    at = min(s["t"] for s in samples if s["asked"] == most)
    return first([s["t"] for s in samples if s["t"] > at and s["asked"] < most])


def summarise_round(
    watch: Watch, args: argparse.Namespace, phase2: float, stopped: float, tick_s: float
) -> dict[str, Any]:
    """The round's figures from its samples, events and adjustments (see the module's
    docstring for each definition)."""
    samples = watch.samples
    overload = sustained_overload(samples, args.sustained_samples)
    sustained = overload[1] if overload else None
    peak = max(samples, key=lambda s: s["lag_bytes"] or 0)
    drained = first([s["t"] for s in samples if s["phase"] == 2 and s["lag_entries"] == 0])
    adjustments = watch.adjustments()
    scale_outs = [a for a in adjustments if a["kind"] == "scale_out"]
    scale_ins = [a for a in adjustments if a["kind"] == "scale_in"]

    def completed(found: list[dict[str, Any]]) -> float | None:
        return first([a["ended_s"] for a in found if a["status"] == "complete"])

    moments: dict[str, float | None] = {
        "asked": first([e["t"] for e in watch.events if e["kind"] == "worker_asked"]),
        "live": first(list(watch.registered.values())),
        "scale_out_began": first([a["began_s"] for a in scale_outs]),
        "scale_out_completed": completed(scale_outs),
        "used": first(list(watch.used.values())),
        "scale_in_began": first([a["began_s"] for a in scale_ins]),
        "scale_in_completed": completed(scale_ins),
        "ask_lowered": ask_lowered(samples),
        "worker_exited": max(watch.exited.values()) if watch.exited else None,
    }
    started = [
        {"cgroup": g, "pid": c.process.pid, "exited_s": watch.exited.get(c.process.pid)}
        for g, c in watch.pool.started[watch.workers :]
        if c.process is not None
    ]
    rss = max(samples, key=lambda s: s["rss_mb_all"])
    disk = max(samples, key=lambda s: s["disk_mb"]["stack"])
    return {
        "tick_s": tick_s,
        "overload_began_s": overload[0] if overload else None,
        "overload_sustained_s": sustained,
        "lag_peak": {
            "t": peak["t"],
            "entries": peak["lag_entries"],
            "mb": round((peak["lag_bytes"] or 0) / MB, 1),
            "age_s": max(s["lag_age_s"] or 0.0 for s in samples),
            "unmerged_mb": max(s["unmerged_mb"] for s in samples),
        },
        "drained_s": drained,
        "time_to_drain_s": round(drained - phase2, 2) if drained is not None else None,
        "elastic": {
            "moments_s": moments,
            "ticks_after_sustained": {
                k: None if v is None or sustained is None else round((v - sustained) / tick_s, 1)
                for k, v in moments.items()
            },
            "workers_started": started,
            "registered_at": watch.registered,
            "used_by": watch.used,
        },
        "stopped_s": round(stopped, 2),
        "adjustments": adjustments,
        "refused": [e for e in watch.events if e["kind"] == "adjust_refused"],
        "placed": [e for e in watch.events if e["kind"] == "placed"],
        "rss_peak": {"t": rss["t"], "mb_all": rss["rss_mb_all"], "mb": rss["rss_mb"]},
        "disk_peak": {"t": disk["t"], "mb": disk["disk_mb"]},
        "cpu_s": watch.cpu(),
    }


Verdict = tuple[bool | None, str]


def targets(report: dict[str, Any], checked: dict[str, Any]) -> dict[str, Verdict]:
    """Each S2 target: whether it holds (None: not judged, which is not holding) and
    what the verdict rests on."""
    moments = report["elastic"]["moments_s"]
    sustained, tick_s = report["overload_sustained_s"], report["tick_s"]
    asked = moments["asked"]
    added: Verdict
    if sustained is None:
        added = (None, "no sustained overload was seen")
    elif asked is None:
        added = (False, "no worker was asked")
    else:
        delay = asked - sustained
        added = (
            asked >= 0 and delay <= TARGET_TICKS * tick_s,
            f"asked {delay:.1f} s ({delay / tick_s:.1f} ticks) after the overload was "
            f"sustained; live at {moments['live']} s, used at {moments['used']} s",
        )
    started = report["elastic"]["workers_started"]
    removed: Verdict
    if not started:
        removed = (None, "no worker was added")
    else:
        exits = [w["exited_s"] for w in started]
        removed = (
            all(t is not None and t <= report["stopped_s"] for t in exits),
            f"worker processes exited at {exits} s, the run stopped at "
            f"{report['stopped_s']} s; scale-in completed at {moments['scale_in_completed']} s",
        )
    drained = report["drained_s"]
    return {
        "no record lost or duplicated": (
            bool(checked["exact"]),
            f"{checked['ingested_mb']} MB taken in, {checked['rows']} rows, coverage "
            f"{checked['coverage']}, archive = emitted: {checked['emitted_equals_archived']}",
        ),
        f"a worker asked within {TARGET_TICKS} ticks of sustained overload": added,
        "the worker given back before the run stopped": removed,
        "the lag back to zero": (
            drained is not None,
            f"at {drained} s, {report['time_to_drain_s']} s into phase 2"
            if drained is not None
            else "the lag was never zero in phase 2",
        ),
    }


# -- the bench ------------------------------------------------------------------------


def policy_of(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The run's policy, and how its scale-in is timed (see the module's docstring)."""
    values: dict[str, Any] = {**BENCHMARK_POLICIES[args.policy].values, "placement": "placed"}
    if "scale_in_after_s" not in PARAMETERS_BY_NAME:
        return Policy.from_mapping(values).to_dict(), (
            "the window built into orchestrator/rescale/elastic.py (no scale-in policy fields)"
        )
    values["scale_in_after_s"] = args.scale_in_after_s
    if args.scale_in_busy is not None:
        values["scale_in_busy"] = args.scale_in_busy
    policy = Policy.from_mapping(values).to_dict()
    fields = ("scale_in_after_s", "scale_in_busy")
    return policy, ", ".join(f"{k} = {policy[k]:g}" for k in fields if k in policy)


def bench(args: argparse.Namespace, quotas: CpuQuotas, cgroups: list[str]) -> dict[str, Any]:
    base = len(args.quota_list)
    doc = real_document()
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["buffer_mb"] = args.buffer_mb
    policy, scale_in = policy_of(args)
    with QuotaStack(quotas, cgroups[:base]) as stack:
        warmed = warm_up(stack, doc, policy, args)
        print(f"warm-up: {warmed}", file=sys.stderr, flush=True)
        measured = None
        if args.mb_s is None:
            measured = measure_capacity(stack, doc, policy, args)
            capacity = measured["capacity_mb_s"] * MB
        else:
            capacity = args.mb_s * MB
        rounds = []
        with ElasticPool(stack, cgroups, base + args.elastic_extra) as pool:
            for number in range(1, args.rounds + 1):
                row = overload_round(
                    stack, pool, doc, policy, capacity_bps=capacity, args=args, number=number
                )
                rounds.append(row)
                brief = {k: v for k, v in row.items() if k not in {"samples", "events"}}
                print(json.dumps(brief, default=str), file=sys.stderr, flush=True)
    return {
        "command": shlex.join(sys.orig_argv),
        "quotas": {name: quotas.cores[name] for name in cgroups},
        "base_workers": base,
        "elastic_maximum": base + args.elastic_extra,
        "policy": {
            k: policy[k] for k in ("throttling", "routing", "migration", "placement", "tick_ms")
        },
        "scale_in": scale_in,
        "buffer_mb": args.buffer_mb,
        "capacity_mb_s": round(capacity / MB, 3),
        "capacity_from": "--mb-s" if measured is None else "phase 0",
        "warm_up": warmed,
        "phase0": measured,
        "rounds": rounds,
    }


def shown(value: float | None, unit: str = " s") -> str:
    return "never" if value is None else f"{value:g}{unit}"


def moment(row: dict[str, Any], name: str) -> str:
    """When ``name`` happened in the round: seconds since phase 1 began, and ticks since
    the overload was sustained."""
    at = row["elastic"]["moments_s"][name]
    ticks = row["elastic"]["ticks_after_sustained"][name]
    if at is None:
        return "never"
    return f"{at:g} s" + ("" if ticks is None else f" ({ticks:g} ticks)")


def print_table(report: dict[str, Any]) -> None:
    print(f"command: {report['command']}")
    print(
        f"quotas (cores): {report['quotas']}; {report['base_workers']} base Spark workers, "
        f"the pool up to {report['elastic_maximum']}; policy {report['policy']}; scale-in: "
        f"{report['scale_in']}; pools {report['buffer_mb']:g} MB"
    )
    print(f"capacity: {report['capacity_mb_s']} MB/s ({report['capacity_from']})")
    if report["phase0"] is not None:
        print(f"phase 0: {report['phase0']}")
    print(
        "| round | MB/s produced, overload / underload | overload sustained | lag peak | "
        "lag zero (into phase 2) | asked | live | used | scale-in done | worker exited | "
        "peak RSS | peak disk | exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in report["rounds"]:
        rates, peak = row["rates_mb_s"], row["lag_peak"]
        print(
            f"| {row['round']} | {rates['overload_produced']:g} / "
            f"{rates['underload_produced']:g} | {shown(row['overload_sustained_s'])} | "
            f"{peak['mb']:g} MB, {peak['entries']} files, oldest {peak['age_s']:g} s "
            f"(at {peak['t']:g} s) | {shown(row['drained_s'])} "
            f"({shown(row['time_to_drain_s'])}) | {moment(row, 'asked')} | "
            f"{moment(row, 'live')} | {moment(row, 'used')} | "
            f"{moment(row, 'scale_in_completed')} | {moment(row, 'worker_exited')} | "
            f"{row['rss_peak']['mb_all']:g} MB | {row['disk_peak']['mb']['stack']:g} MB | "
            f"{'yes' if row['exactness']['exact'] else 'NO'} |"
        )
    for row in report["rounds"]:
        print(
            f"round {row['round']} (run {row['run']}): phase 2 ended by {row['phase2_ended_by']}; "
            f"CPU seconds by cgroup {row['cpu_s']}"
        )
        for event in row["refused"][:3]:
            print(f"  refused at {event['t']:g} s: {event['reason']}")
        if len(row["refused"]) > 3:
            print(f"  ... {len(row['refused'])} refusals in all")
        for name, (holds, why) in row["targets"].items():
            verdict = {True: "holds", False: "does not hold", None: "not judged"}[holds]
            print(f"  target, {name}: {verdict} ({why})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quotas", type=quota_list, default=[1.0, 0.5], dest="quota_list")
    parser.add_argument("--elastic-quota", type=float, default=1.0, help="cores per elastic worker")
    parser.add_argument(
        "--elastic-extra", type=int, default=1, help="workers the pool may add to the base"
    )
    parser.add_argument("--policy", choices=sorted(BENCHMARK_POLICIES), default="ours")
    parser.add_argument("--overload-s", type=float, default=120.0)
    parser.add_argument("--overload-x", type=float, default=1.5, help="phase 1 rate / capacity")
    parser.add_argument("--underload-x", type=float, default=0.5, help="phase 2 rate / capacity")
    parser.add_argument("--drain-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--mb-s", type=float, default=None, help="the capacity, MB/s (default: phase 0 measures it)"
    )
    parser.add_argument("--warmup-mb", type=float, default=16.0, help="the warm-up run's input")
    parser.add_argument("--measure-mb", type=float, default=400.0, help="phase 0's backlog")
    parser.add_argument("--measure-skip-s", type=float, default=20.0)
    parser.add_argument("--measure-s", type=float, default=60.0, help="phase 0's window")
    parser.add_argument("--buffer-mb", type=float, default=8.0, help="each branch's pool")
    parser.add_argument("--file-mb", type=float, default=1.0, help="the producer's part files")
    parser.add_argument("--sustained-samples", type=int, default=5)
    parser.add_argument(
        "--scale-in-after-s",
        type=float,
        default=20.0,
        help="the policy's scale_in_after_s, where the checkout has it",
    )
    parser.add_argument(
        "--scale-in-busy",
        type=float,
        default=None,
        help="the policy's scale_in_busy, where the checkout has it (default: the policy's)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = len(args.quota_list)
    if not 1 <= args.elastic_extra <= MAX_SPARK_WORKERS - base:
        parser.error(f"--elastic-extra is 1 to {MAX_SPARK_WORKERS - base} with {base} base workers")
    if not args.elastic_quota > 0:
        parser.error("--elastic-quota is a positive number of cores")
    if args.sustained_samples < 2:
        parser.error("--sustained-samples is at least 2: growth needs two samples")
    missing = placement_missing()
    if missing:
        print(
            f"bench_elastic_stream: S2 needs placed mode, nothing run: {missing}", file=sys.stderr
        )
        return 2
    print(f"command: {shlex.join(sys.orig_argv)}", file=sys.stderr, flush=True)
    quotas = [*args.quota_list, *[args.elastic_quota] * args.elastic_extra]
    report = with_quotas("bench_elastic_stream", quotas, lambda q, c: bench(args, q, c))
    if report is None:
        return 2
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
