"""Recovery after a fault: the merged progress of the stack's runs, sampled, and how long
each fault kept the system from making progress.

A fault's **recovery time** runs from the fault (a SIGKILL; for a SIGSTOP, the SIGCONT
that ends the pause) until both the process hit, or its replacement, is back (answering:
see chaos_faults) and the runs' merged progress advanced after that: progress that the
stack made with the process back, not merges that were already under way when it was hit.

Progress is the sum of every result row's record count in the ledger
(``orchestrator_resultgroup``): the sink folds each merged batch into it, in the same
transaction as the merged-chunk ledger, and results are never deleted, so it only grows,
and grows with every merge of any run.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from chaos_faults import SERVICE_KINDS, Kind

PROGRESS_SQL = "SELECT coalesce(sum(records), 0) FROM orchestrator_resultgroup"
SAMPLE_S = 0.2


class ProgressMonitor(threading.Thread):
    """Samples the progress every ``SAMPLE_S`` on its own connection, reconnecting after
    an outage (samples are missing meanwhile)."""

    def __init__(self, database_url: str, clock: Callable[[], float]) -> None:
        super().__init__(name="chaos-progress", daemon=True)
        self.database_url, self.clock = database_url, clock
        self.times: list[float] = []
        self.values: list[int] = []
        self.halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        import psycopg

        conn: psycopg.Connection[Any] | None = None
        while not self.halt.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.database_url, connect_timeout=1, autocommit=True)
                row = conn.execute(PROGRESS_SQL).fetchone()
                value = int(row[0]) if row else 0
                with self._lock:
                    self.times.append(self.clock())
                    self.values.append(value)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self.halt.wait(SAMPLE_S)
        if conn is not None:
            conn.close()

    def samples(self) -> tuple[list[float], list[int]]:
        with self._lock:
            return list(self.times), list(self.values)

    def latest(self) -> int | None:
        with self._lock:
            return self.values[-1] if self.values else None


def progressed_after(times: Sequence[float], values: Sequence[int], since: float) -> float | None:
    """When the progress first exceeded its last value at or before ``since`` (the first
    value after ``since`` when none was taken before), or None if it has not yet."""
    at = bisect.bisect_right(times, since)
    if at == len(times):
        return None
    base = values[at - 1] if at > 0 else values[at]
    for t, value in zip(times[at:], values[at:], strict=True):
        if value > base:
            return t
    return None


@dataclass
class Fault:
    """One injected fault and what followed."""

    number: int
    kind: Kind
    target: str  # which process was hit (e.g. "control-worker pid 1234")
    injected_at: float  # seconds from the session's start
    ended_at: float  # = injected_at for a SIGKILL; the SIGCONT for a SIGSTOP
    back_at: float | None = None  # the process or its replacement answering
    progress_at: float | None = None  # progress after back_at
    supervisor_delay_s: float | None = None  # the supervisor's backoff before the restart
    note: str = ""
    log_lines: list[str] = field(default_factory=list)  # why, when it did not recover

    @property
    def recovery_s(self) -> float | None:
        if self.back_at is None or self.progress_at is None:
            return None
        return round(max(self.back_at, self.progress_at) - self.ended_at, 2)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": str(self.kind),
            "target": self.target,
            "injected_at_s": round(self.injected_at, 2),
            "ended_at_s": round(self.ended_at, 2),
            "back_after_s": None
            if self.back_at is None
            else round(self.back_at - self.ended_at, 2),
            "progress_after_s": None
            if self.progress_at is None
            else round(self.progress_at - self.ended_at, 2),
            "recovery_s": self.recovery_s,
            "supervisor_delay_s": self.supervisor_delay_s,
            "note": self.note,
            "log_lines": self.log_lines,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank (bench_unbounded's ``pct``)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class KindStats(TypedDict):
    faults: int
    recovered: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    target_p95_s: float
    target_met: bool | None


def target_p95_s(kind: Kind) -> float:
    """Issue 21's targets: 15 s for any single process, 30 s for a service."""
    return 30.0 if kind in SERVICE_KINDS else 15.0


def by_kind(faults: Sequence[Fault]) -> dict[str, KindStats]:
    """Recovery per kind; a fault that never recovered counts against the target."""
    out: dict[str, KindStats] = {}
    for kind in Kind:
        mine = [f for f in faults if f.kind is kind]
        if not mine:
            continue
        times = [f.recovery_s for f in mine if f.recovery_s is not None]
        p95 = percentile(times, 0.95) if times else None
        out[str(kind)] = KindStats(
            faults=len(mine),
            recovered=len(times),
            p50_s=percentile(times, 0.5) if times else None,
            p95_s=p95,
            max_s=max(times) if times else None,
            target_p95_s=target_p95_s(kind),
            target_met=len(times) == len(mine) and p95 is not None and p95 < target_p95_s(kind),
        )
    return out


def table(stats: dict[str, KindStats]) -> str:
    """The readable form of :func:`by_kind`."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"{'kind':<16}{'faults':>7}{'recovered':>10}{'p50 s':>8}{'p95 s':>8}{'max s':>8}"
        f"{'target':>8}  met",
    ]
    for kind, s in stats.items():
        lines.append(
            f"{kind:<16}{s['faults']:>7}{s['recovered']:>10}{cell(s['p50_s']):>8}"
            f"{cell(s['p95_s']):>8}{cell(s['max_s']):>8}{s['target_p95_s']:>8.0f}  "
            f"{'yes' if s['target_met'] else 'NO'}"
        )
    return "\n".join(lines)


def wait_for(ok: Callable[[], bool], deadline: float, every_s: float = 0.1) -> bool:
    while time.monotonic() < deadline:
        if ok():
            return True
        time.sleep(every_s)
    return False
