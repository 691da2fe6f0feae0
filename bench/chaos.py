"""Chaos (issue 21): runs go on while the stack's processes are killed at random moments.

    .venv/bin/python bench/chaos.py [--faults 1000] [--seed 1] [--kinds all]
        [--interval-s 5] [--workload bounded,continuous] [--json FILE]

The stack is ``make run``'s own (``python -m orchestrator.services.runconsole``, without
the demo), under its own state folder (``--var``, default ``var/chaos``, emptied first)
and port, so what dies is started again by its supervisor exactly as for a user.

Faults (``--kinds``, names from chaos_faults.Kind, ``name=weight`` to draw one more often):
SIGKILL of the Spark worker's pool child, of its Spark JVM, of the control worker, beat,
the ASGI server (daphne), PostgreSQL's postmaster, Redis or ZooKeeper; and ``sigstop``: a
worker process (the control worker or the Spark pool child) paused with SIGSTOP for
``--stop-s`` (longer than the 10 s ZooKeeper session), then SIGCONT. Kinds are drawn from
a shuffled bag (every kind once per round of the bag), victims and gaps at random, all
from ``--seed``. A fault is injected a random gap (exponential, mean ``--interval-s``)
after the previous one, but never before the previous one recovered (or gave up after
``--recovery-timeout-s``): each recovery time is that fault's alone.

Recovery (chaos_recovery): from the fault (for a SIGSTOP, from the SIGCONT) until the
process or its replacement is back (a service answers; the control worker answers a
Celery ping; a Spark pool child writes its heartbeat; a JVM is running again; beat logs
its start) and the runs' merged progress advanced after that. Per kind p50/p95/max,
against issue 21's targets (p95 under 15 s for a process, 30 s for a service).

Workload (chaos_workload): lanes of runs one after the other, at the same time: bounded
runs over generated inputs (``--bounded-mb``) and continuous runs over a landing folder
fed by the producer for ``--feed-s`` then stopped. Each run is compared with the plain
Spark batch job over what it took in: exact or not, records lost and duplicated (per key
count differences, summed), and whether it completed with no one's help within
``--run-timeout-s``.

Prints one JSON object on stdout (``--json FILE`` writes it too) and a table on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from chaos_faults import (  # noqa: E402
    SUPERVISED_NAME,
    Endpoints,
    Kind,
    Tree,
    control_answers,
    daphne_answers,
    hit,
    log_says_since,
    log_size,
    parse_kinds,
    postgres_answers,
    redis_answers,
    spark_heartbeat_at,
    zookeeper_answers,
)
from chaos_recovery import (  # noqa: E402
    Fault,
    ProgressMonitor,
    by_kind,
    progressed_after,
    table,
    wait_for,
)

from orchestrator.services.embedded import free_port  # noqa: E402

VAR = ROOT / "var" / "chaos"
TOKEN = "chaos-bench-token"  # noqa: S105 - the health probe's, of this stack only
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL|FATAL|PANIC)\b|Error: ")


@dataclass
class Stack:
    """``make run`` in a child process, under ``var`` on a port of its own."""

    var: Path
    extra_env: dict[str, str]
    console: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def out(self) -> Path:
        return self.var / "runconsole.out"

    @property
    def logs(self) -> Path:
        return self.var / "log"

    def start(self, timeout_s: float = 240.0) -> Endpoints:
        from orchestrator.services.launcher import recorded_endpoints

        shutil.rmtree(self.var, ignore_errors=True)
        self.var.mkdir(parents=True)
        self.port = free_port()
        env = {
            **os.environ,
            "BPCONSOLE_VAR_DIR": str(self.var),
            "BPCONSOLE_PORT": str(self.port),
            "BPCONSOLE_DEMO": "0",
            "BPCONSOLE_HEALTH_TOKEN": TOKEN,
            "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
            # Embedded services of its own, whatever this shell is configured with.
            "DATABASE_URL": "",
            "REDIS_URL": "",
            "ZK_HOSTS": "",
            **self.extra_env,
        }
        with self.out.open("wb") as out:
            self.console = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.services.runconsole"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        up = wait_for(lambda: "console is up" in self.out.read_text(), time.monotonic() + timeout_s)
        recorded = recorded_endpoints(self.var)
        if not up or recorded is None or self.console.poll() is not None:
            raise RuntimeError(f"the console did not start; see {self.out}")
        # This process creates and checks the runs: the same services and settings.
        os.environ.update(
            {
                **recorded.as_env(),
                **self.extra_env,
                "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
                "BPCONSOLE_VAR_DIR": str(self.var),
            }
        )
        import django

        django.setup()
        return Endpoints(
            database_url=recorded.database_url,
            redis_url=recorded.redis_url,
            zk_port=int(recorded.zk_hosts.rpartition(":")[2]),
            http_port=self.port,
            health_token=TOKEN,
        )

    def stop(self) -> None:
        if self.console is None or self.console.poll() is not None:
            return
        # Nothing may stay paused: a stopped process would ignore the console's SIGTERM.
        for process in Tree(self.console.pid).pids(Kind.SIGSTOP):
            hit(process, signal.SIGCONT)
        self.console.send_signal(signal.SIGTERM)
        try:
            self.console.wait(90)
        except subprocess.TimeoutExpired:
            self.console.kill()
            self.console.wait()


# -- one fault ------------------------------------------------------------------------


@dataclass
class Hit:
    """A fault just injected: what was hit, and where the logs stood then."""

    number: int
    kind: Kind
    victim: int
    stopped_kind: Kind | None  # a SIGSTOP's victim: the control worker or a Spark child
    target: str
    log_offsets: dict[Path, int]
    out_offset: int  # in the console's stdout (the supervisor's lines)
    beat_log: int
    injected: float
    # The processes of the victim's kind just before the fault (the victim among them):
    # with several Spark pool children, one left running is not the victim's replacement.
    peers: frozenset[int] = frozenset()
    since_wall: float = 0.0  # wall-clock time the fault ended (heartbeats are wall-clock)


@dataclass
class Chaos:
    stack: Stack
    endpoints: Endpoints
    monitor: ProgressMonitor
    rng: random.Random
    clock: Callable[[], float]
    stop_s: float
    recovery_timeout_s: float

    @property
    def tree(self) -> Tree:
        if self.stack.console is None:
            raise RuntimeError("the console is not running")
        return Tree(self.stack.console.pid)

    def _victim(self, kind: Kind, wait_s: float = 60.0) -> int | None:
        """A live target of ``kind``; waits for one (a new pool child starts its JVM only
        at its next batch)."""
        deadline = time.monotonic() + wait_s
        while True:
            pids = sorted(self.tree.pids(kind))
            if pids:
                return self.rng.choice(pids)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _back(self, hit_: Hit) -> bool:
        """Whether the process hit, or its replacement, answers."""
        ep, tree, kind, victim = self.endpoints, self.tree, hit_.kind, hit_.victim
        if kind is Kind.SIGSTOP:
            # The paused process going on, or (if it died of its pause) its replacement.
            if hit_.stopped_kind is Kind.CONTROL:
                return any(control_answers(ep, p) for p in tree.pids(Kind.CONTROL))
            return any(
                (beat := spark_heartbeat_at(ep, p)) is not None and beat[0] >= hit_.since_wall
                for p in tree.spark_children()
            )
        now = tree.pids(kind)
        others = [p for p in now if p != victim]
        if kind in (Kind.SPARK_CHILD, Kind.SPARK_JVM):
            # Back: as many as before the fault, one of them new. A pool child writes its
            # heartbeat once it runs; a JVM is started by its child at the next batch.
            fresh = [p for p in now if p not in hit_.peers]
            if len(now) < len(hit_.peers) or not fresh:
                return False
            return kind is Kind.SPARK_JVM or any(
                spark_heartbeat_at(ep, p) is not None for p in fresh
            )
        if not others:
            return False
        if kind is Kind.CONTROL:
            return control_answers(ep, others[0])
        if kind is Kind.BEAT:
            return log_says_since(self.stack.logs / "celery-beat.log", hit_.beat_log, "Starting")
        probes: dict[Kind, Callable[[Endpoints], bool]] = {
            Kind.DAPHNE: daphne_answers,
            Kind.POSTGRES: postgres_answers,
            Kind.REDIS: redis_answers,
            Kind.ZOOKEEPER: zookeeper_answers,
        }
        return probes[kind](ep)

    def strike(self, number: int, kind: Kind) -> Hit | None:
        """Choose a target of ``kind`` and hit it (a SIGSTOP: pause it; :meth:`follow`
        lets it go on); None if there was no target."""
        victim = self._victim(kind)
        if victim is None:
            return None
        stopped_kind: Kind | None = None
        if kind is Kind.SIGSTOP:
            pids = self.tree.pids(Kind.CONTROL)
            stopped_kind = Kind.CONTROL if victim in pids else Kind.SPARK_CHILD
        what = f"{kind}" if stopped_kind is None else f"{kind} of the {stopped_kind}"
        logs = self.stack.logs
        hit_ = Hit(
            number=number,
            kind=kind,
            victim=victim,
            stopped_kind=stopped_kind,
            target=f"{what} pid {victim}",
            log_offsets={log: log_size(log) for log in logs.glob("*.log")},
            out_offset=log_size(self.stack.out),
            beat_log=log_size(logs / "celery-beat.log"),
            injected=self.clock(),
            peers=frozenset(self.tree.pids(kind)) | {victim},
        )
        hit(victim, signal.SIGSTOP if kind is Kind.SIGSTOP else signal.SIGKILL)
        return hit_

    def follow(self, hit_: Hit) -> Fault:
        """Wait for the recovery from ``hit_`` (first ending a pause)."""
        if hit_.kind is Kind.SIGSTOP:
            try:
                time.sleep(max(0.0, hit_.injected + self.stop_s - self.clock()))
            finally:
                hit(hit_.victim, signal.SIGCONT)
        fault = Fault(hit_.number, hit_.kind, hit_.target, hit_.injected, self.clock())
        hit_.since_wall = time.time()
        deadline = time.monotonic() + self.recovery_timeout_s
        if wait_for(lambda: self._back(hit_), deadline, 0.1):
            fault.back_at = self.clock()
            back_at = fault.back_at

            def progressed() -> bool:
                fault.progress_at = progressed_after(*self.monitor.samples(), back_at)
                return fault.progress_at is not None

            if not wait_for(progressed, deadline, 0.1):
                fault.note = "back, but no progress within the recovery timeout"
        else:
            fault.note = "not back within the recovery timeout"
        fault.supervisor_delay_s = self._supervisor_delay(hit_.kind, hit_.out_offset)
        if fault.recovery_s is None:
            fault.log_lines = error_lines(hit_.log_offsets, self.stack.logs)
        return fault

    def _supervisor_delay(self, kind: Kind, offset: int) -> float | None:
        name = SUPERVISED_NAME.get(kind)
        if name is None:
            return None
        with self.stack.out.open("rb") as f:
            f.seek(offset)
            said = f.read().decode(errors="replace")
        found = re.search(rf"{re.escape(name)} exited with code \S+; restarting in (\S+) s", said)
        return float(found.group(1)) if found else None


# PostgreSQL's own lines while it restarts (and the liveness probes' connections): what
# every PostgreSQL fault writes, not why anything failed.
NOISE = ("not yet accepting connections", "the database system is starting up", 'role "root"')


def error_lines(offsets: dict[Path, int], logs: Path, per_log: int = 4) -> list[str]:
    """The last error lines each log got since ``offsets`` (a log created since: from its
    start), a few per log so that one noisy log does not hide the others."""
    lines: list[str] = []
    for log in sorted(logs.glob("*.log")):
        with log.open("rb") as f:
            f.seek(offsets.get(log, 0))
            text = f.read().decode(errors="replace")
        found = [
            f"{log.name}: {line.strip()[:300]}"
            for line in text.splitlines()
            if ERROR_LINE.search(line) and not any(n in line for n in NOISE)
        ]
        lines += found[-per_log:]
    return lines


def bag_draws(rng: random.Random, bag: list[Kind]) -> Iterator[Kind]:
    """The kinds in shuffled rounds of the bag: each kind (times its weight) per round."""
    while True:
        round_ = list(bag)
        rng.shuffle(round_)
        yield from round_


# -- the session ----------------------------------------------------------------------


def run_events(run_id: int, limit: int = 8) -> list[str]:
    """A failed run's last events (the timeline says why), for the report."""
    from orchestrator.models import Event

    events = Event.objects.filter(run_id=run_id).order_by("-id")[:limit]
    return [f"{e.kind}: {e.reason[:240]}" for e in reversed(list(events))]


def lanes_for(args: argparse.Namespace, clock: Callable[[], float]) -> list[Any]:
    """The workload's lanes (``--workload``), not started."""
    from chaos_workload import Lane, bounded_run, continuous_run, pipeline

    doc = pipeline(args.segment_mb)
    lanes: list[Lane] = []
    if "bounded" in args.workload:
        lanes.append(
            Lane(
                "bounded",
                lambda n, _stop: bounded_run(
                    doc, seed=args.seed * 1000 + n, mb=args.bounded_mb, timeout_s=args.run_timeout_s
                ),
                clock,
            )
        )
    if "continuous" in args.workload:
        lanes.append(
            Lane(
                "continuous",
                lambda n, stop: continuous_run(
                    doc,
                    args.var / "inputs",
                    name=f"landing-{n}",
                    seed=args.seed * 1000 + n,
                    rate_mbps=args.rate_mbps,
                    feed_s=args.feed_s,
                    file_mb=args.file_mb,
                    timeout_s=args.run_timeout_s,
                    stop=stop,
                ),
                clock,
            )
        )
    return lanes


def inject_all(
    chaos: Chaos, args: argparse.Namespace, faults: list[Fault], skipped: list[str]
) -> None:
    """``--faults`` faults at random gaps, or as many as strike within ``--max-minutes``
    of the first; at most ``--max-open`` not yet recovered at a time (1: each fault waits
    for the previous one's recovery, so each recovery time is that fault's alone; more:
    faults overlap, which is harsher and quicker)."""
    kinds = bag_draws(chaos.rng, parse_kinds(args.kinds))
    open_: list[threading.Thread] = []
    lock = threading.Lock()

    def follow(hit_: Hit) -> None:
        fault = chaos.follow(hit_)
        with lock:
            faults.append(fault)
        print(json.dumps(fault.to_json()), file=sys.stderr, flush=True)

    next_at = chaos.clock()
    deadline = None if args.max_minutes is None else next_at + 60 * args.max_minutes
    struck = 0
    while struck < args.faults and (deadline is None or chaos.clock() < deadline):
        next_at += chaos.rng.expovariate(1 / args.interval_s) if args.interval_s > 0 else 0.0
        time.sleep(max(0.0, next_at - chaos.clock()))
        while len(open_) >= args.max_open:
            open_[0].join(0.1)
            open_ = [t for t in open_ if t.is_alive()]
        kind = next(kinds)
        hit_ = chaos.strike(struck + 1, kind)
        if hit_ is None:
            skipped.append(f"{kind}: no live target at {chaos.clock():.1f} s")
            continue
        struck += 1
        thread = threading.Thread(target=follow, args=(hit_,), name=f"fault-{struck}", daemon=True)
        thread.start()
        open_.append(thread)
        next_at = max(next_at, chaos.clock())
    for thread in open_:
        thread.join()
    faults.sort(key=lambda f: f.number)


def report(
    args: argparse.Namespace, faults: list[Fault], skipped: list[str], lanes: list[Any]
) -> dict[str, Any]:
    from chaos_workload import Outcome, durable

    outcomes: list[Outcome] = sorted(
        (o for lane in lanes for o in lane.outcomes), key=lambda o: o.started_at
    )
    failures = []
    for o in outcomes:
        if not (o.completed and o.exact and o.lost == 0 and o.duplicated == 0):
            events = durable(functools.partial(run_events, o.run), "the run's events", 60)
            failures.append({**vars(o), "events": events})
    stats = by_kind(faults)
    return {
        "benchmark": "chaos",
        "seed": args.seed,
        "kinds": args.kinds,
        "interval_s": args.interval_s,
        "stop_s": args.stop_s,
        "max_open": args.max_open,
        "max_minutes": args.max_minutes,
        "workload": {
            "lanes": args.workload,
            "bounded_mb": args.bounded_mb,
            "continuous_rate_mb_s": args.rate_mbps,
            "feed_s": args.feed_s,
            "segment_mb": args.segment_mb,
        },
        "env": dict(kv.split("=", 1) for kv in args.env),
        "faults": len(faults),
        "faults_per_kind": {k: s["faults"] for k, s in stats.items()},
        "recovery_by_kind": stats,
        "all_recovered": all(f.recovery_s is not None for f in faults),
        "skipped": skipped,
        "runs": len(outcomes),
        "runs_by_mode": {
            mode: sum(1 for o in outcomes if o.mode == mode) for mode in ("bounded", "continuous")
        },
        "completed_without_human": sum(1 for o in outcomes if o.completed),
        "exact_runs": sum(1 for o in outcomes if o.exact),
        # A run cancelled because it outlived --run-timeout-s has not merged everything
        # yet: what it lacks is counted apart, not as lost (a duplicate is one anyway).
        "lost_records": sum(o.lost for o in outcomes if not o.timed_out),
        "duplicated_records": sum(o.duplicated for o in outcomes),
        "timed_out_runs": sum(1 for o in outcomes if o.timed_out),
        "records_missing_from_timed_out_runs": sum(o.lost for o in outcomes if o.timed_out),
        "lane_errors": [e for lane in lanes for e in lane.errors],
        "lanes_alive_at_end": [lane.mode for lane in lanes if lane.is_alive()],
        "failed_runs": failures,
        "fault_log": [f.to_json() for f in faults],
        "run_log": [vars(o) for o in outcomes],
    }


def session(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()

    def clock() -> float:
        return time.monotonic() - began

    stack = Stack(args.var, dict(kv.split("=", 1) for kv in args.env))
    lanes: list[Any] = []
    monitor: ProgressMonitor | None = None
    faults: list[Fault] = []
    skipped: list[str] = []
    try:
        endpoints = stack.start()
        up_s = clock()
        monitor = ProgressMonitor(endpoints.database_url, clock)
        monitor.start()
        lanes = lanes_for(args, clock)
        for lane in lanes:
            lane.start()
        # Reproducible chaos, not cryptography: the same seed, the same faults.
        rng = random.Random(args.seed)  # noqa: S311
        chaos = Chaos(stack, endpoints, monitor, rng, clock, args.stop_s, args.recovery_timeout_s)
        # No fault before the stack has merged something and its Spark JVM is up: a first
        # JVM's start is not a recovery.
        progress = monitor
        if not wait_for(
            lambda: bool(progress.latest()) and bool(chaos.tree.spark_jvms()),
            time.monotonic() + 300,
            0.5,
        ):
            raise RuntimeError(f"no progress before the first fault; logs in {stack.logs}")
        first_s = clock()
        inject_all(chaos, args, faults, skipped)
        faults_end_s = clock()
        for lane in lanes:
            lane.stop.set()
        for lane in lanes:
            lane.join(args.run_timeout_s + 300)
        result = report(args, faults, skipped, lanes)
        result["timeline_s"] = {
            "console_up": round(up_s, 1),
            "first_fault": round(first_s, 1),
            "faults_end": round(faults_end_s, 1),
            "end": round(clock(), 1),
        }
        return result
    finally:
        for lane in lanes:
            lane.stop.set()
        if monitor is not None:
            monitor.halt.set()
        stack.stop()


def summary_table(result: dict[str, Any]) -> str:
    runs = (
        f"runs {result['runs']} {result['runs_by_mode']}: completed without a human "
        f"{result['completed_without_human']}, exact {result['exact_runs']}, lost records "
        f"{result['lost_records']}, duplicated records {result['duplicated_records']}, "
        f"timed out {result['timed_out_runs']}"
    )
    return f"{table(result['recovery_by_kind'])}\n{runs}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="strike no fault after this long (then the runs end and are checked as ever)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default="all", help="e.g. redis,spark-child=3 (default all)")
    parser.add_argument("--interval-s", type=float, default=5.0, help="mean gap between faults")
    parser.add_argument("--stop-s", type=float, default=12.0, help="how long a SIGSTOP lasts")
    parser.add_argument("--recovery-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--max-open", type=int, default=1, help="faults not yet recovered at a time (overlap)"
    )
    parser.add_argument(
        "--workload", default="bounded,continuous", help="lanes of runs: bounded, continuous"
    )
    parser.add_argument("--bounded-mb", type=float, default=16.0)
    parser.add_argument("--rate-mbps", type=float, default=1.0, help="continuous runs' feed")
    parser.add_argument("--feed-s", type=float, default=60.0, help="continuous runs' length")
    parser.add_argument("--file-mb", type=float, default=0.25, help="the producer's files")
    parser.add_argument("--segment-mb", type=float, default=0.25)
    parser.add_argument("--run-timeout-s", type=float, default=300.0)
    parser.add_argument("--var", type=Path, default=VAR, help="the stack's state folder")
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for the stack (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    parse_kinds(args.kinds)  # a wrong name fails before anything starts

    # SIGTERM (a timeout, a kill) stops the stack as Ctrl-C does, not leave it running.
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    with contextlib.suppress(KeyboardInterrupt):
        result = session(args)
        text = json.dumps(result, indent=2, default=str)
        print(text)
        if args.json is not None:
            args.json.write_text(text + "\n")
        print(summary_table(result), file=sys.stderr)
        return 0
    return 130


if __name__ == "__main__":
    sys.exit(main())
