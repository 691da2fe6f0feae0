"""A placed run's Spark workers of its own: asked of the elastic pool on a scale-out that
no live worker can take, given back after sustained underload.

In placed mode an instance added on a worker that already runs one of its stage's
instances adds no capacity, so a scale-out first needs a worker: the run asks the pool
(``orchestrator/zk/spark_pool.py``) for one more, and its instance is added on that
worker once it is live. The ask is the run's own count in ZooKeeper, read back by a
new driver of the run and cleared when the run ends. With no elastic pool, or the pool
at its maximum, the scale-out is refused with an event saying why, and nothing starts.

Scale-in is the reverse: when, for the policy's ``scale_in_after_s``, the run did not
need its newest worker (with ``scale_out = measured``: the stage's other workers took
its target with headroom by their measured rates; otherwise every operator instance
kept its worker busy less than ``scale_in_busy`` of the time) while it had workers of
its own, the instance on the newest worker is removed by hot rescale, and once that
adjustment completes the run asks for one worker fewer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.zk.control_plane import ControlPlane


@dataclass
class Idle:
    """Since when the run has not needed its newest worker (None: it needs it now):
    every operator busy less than ``under`` of the time, or (:meth:`hold`) its stage's
    measured rates without it."""

    under: float
    since: float | None = None

    def update(self, busy: Mapping[str, float | None], now: float) -> float:
        """Note this tick's busy shares; how long the run has been idle (0: not)."""
        shares = [b for b in busy.values() if b is not None]
        return self.hold(bool(shares) and max(shares) < self.under, now)

    def hold(self, idle: bool, now: float) -> float:
        """Note whether the run is idle this tick, by any measure; for how long (0: not)."""
        if not idle:
            self.since = None
            return 0.0
        if self.since is None:
            self.since = now
        return now - self.since


class ElasticAsk:
    """The run's ask for workers beyond the pool's base."""

    def __init__(self, run_id: int, control: ControlPlane) -> None:
        self.key = str(run_id)
        self.control = control
        self.extra = control.spark_workers_asked().get(self.key, 0)

    def refusal(self) -> str | None:
        """Why one more worker cannot be had, or None when it can."""
        pool = self.control.spark_pool()
        if pool is None:
            return (
                "no elastic Spark pool runs (make run starts one; its maximum is "
                "BPCONSOLE_SPARK_WORKERS_MAX)"
            )
        if self.room() <= 0:
            return f"the pool is at its maximum of {pool['maximum']} Spark workers"
        return None

    def room(self) -> int:
        """How many more workers the pool may start for anyone (0 without a pool)."""
        pool = self.control.spark_pool()
        if pool is None:
            return 0
        asked = sum(self.control.spark_workers_asked().values())
        return max(0, pool["maximum"] - pool["base"] - max(asked, pool["extra"]))

    def grow(self, reason: str, count: int = 1) -> None:
        self.extra += count
        self.control.ask_spark_workers(self.key, self.extra, reason)

    def shrink(self, reason: str) -> None:
        self.extra = max(0, self.extra - 1)
        self.control.ask_spark_workers(self.key, self.extra, reason)

    def clear(self) -> None:
        self.extra = 0
        self.control.ask_spark_workers(self.key, 0, "the run ended")


def newest(workers: Mapping[str, Mapping[str, object]], among: set[str]) -> str:
    """The most recently started of ``among`` (by the start time each registered)."""

    def started(name: str) -> float:
        value = workers.get(name, {}).get("started")
        return float(value) if isinstance(value, int | float) else -math.inf

    return max(sorted(among), key=started)
