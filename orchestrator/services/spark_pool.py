"""``make run``'s elastic Spark workers: the base ones, plus as many as the runs ask for,
up to an admin's maximum.

A run in placed mode whose stage needs more capacity than its workers give asks for
Spark workers of its own (``orchestrator/zk/spark_pool.py``: ``spark/asked/<run>``). This
process starts the workers all runs ask for together, beyond ``BPCONSOLE_SPARK_WORKERS``
and up to ``BPCONSOLE_SPARK_WORKERS_MAX``, each a Spark worker like the base ones (a
Celery worker of one pool process with a Spark JVM of its own), supervised like them;
when the asks go down it stops the newest first. A stopped worker finishes the batch it
runs (Celery's warm shutdown); the driver whose instances it ran moves them to live
workers, as for any worker that goes (``orchestrator/rescale/control.py``, failover), so
nothing is lost or counted twice. It publishes what it allows and keeps
in ``spark/pool``, an ephemeral znode of its session, where the drivers read whether
one more worker can be had: a pool that dies takes the znode with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypedDict


class PoolState(TypedDict):
    """What the pool allows and keeps, as it writes it for the drivers."""

    base: int
    maximum: int
    extra: int  # workers started beyond the base, running now


def extra_wanted(base: int, maximum: int, asked: Mapping[str, int]) -> int:
    """Workers to run beyond the base: what the runs ask for together, within the
    maximum."""
    return max(0, min(maximum - base, sum(max(0, n) for n in asked.values())))


class Worker(Protocol):
    """A Spark worker process this pool can start and stop."""

    name: str
    process: subprocess.Popen[bytes] | None

    def start(self) -> None: ...

    def poll(self) -> int | None: ...


class Asks(Protocol):
    """Where the runs' asks are read and the pool's state written (the control plane)."""

    def spark_workers_asked(self) -> dict[str, int]: ...

    def write_spark_pool(self, state: PoolState) -> None:
        """Publish ``state`` for the drivers (each pass: cheap when unchanged)."""


class Watcher(Protocol):
    """What restarts a worker that exits (the pool's own supervisor)."""

    def watch(self, target: Worker) -> None: ...

    def forget(self, target: Worker) -> None: ...

    def tick(self) -> None: ...


@dataclass
class SparkPool:
    base: int
    maximum: int
    make_worker: Callable[[int], Worker]  # the worker numbered n (base ones are 1..base)
    asks: Asks
    supervisor: Watcher
    say: Callable[[str], None]
    extras: list[Worker] = field(default_factory=list)
    stopping: list[Worker] = field(default_factory=list)

    def tick(self) -> None:
        """Start or stop workers to match the asks; reap the stopped ones."""
        self.stopping = [w for w in self.stopping if w.poll() is None]
        asked = self.asks.spark_workers_asked()
        wanted = extra_wanted(self.base, self.maximum, asked)
        while len(self.extras) < wanted:
            worker = self.make_worker(self.base + len(self.extras) + 1)
            worker.start()
            self.supervisor.watch(worker)
            self.extras.append(worker)
            self.say(
                f"{worker.name} started: runs {', '.join(sorted(asked))} ask for "
                f"{sum(asked.values())} Spark worker(s) beyond {self.base} "
                f"(at most {self.maximum} in all)"
            )
        while len(self.extras) > wanted:
            worker = self.extras.pop()
            self.supervisor.forget(worker)
            if worker.process is not None and worker.poll() is None:
                worker.process.terminate()  # warm shutdown: its batch in flight finishes
                self.stopping.append(worker)
            self.say(f"{worker.name} stopped: the runs ask for {wanted} beyond the base")
        # Every pass: the znode is ephemeral, and a lost session takes it away.
        self.asks.write_spark_pool(
            PoolState(base=self.base, maximum=self.maximum, extra=len(self.extras))
        )
