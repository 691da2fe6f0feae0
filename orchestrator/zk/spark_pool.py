"""The elastic Spark workers' znodes: what each run asks of the pool, and the pool's
own state.

Owns ``spark/asked/<run>`` (JSON ``{"extra", "reason"}``: how many Spark workers beyond
the pool's base the run's placed instances need, written by its driver) and
``spark/pool`` (JSON ``{"base", "maximum", "extra"}``: what the process that starts and
stops the workers, ``orchestrator/services/spark_pool.py``, allows and keeps). A run
that ends asks for nothing again; a pool that is not elastic (no ``make run``, or a
cluster manager's own) writes no ``spark/pool``, and a scale-out then adds no worker.

``spark/pool`` is ephemeral, owned by the pool process's ZooKeeper session: it exists
exactly while a pool is there to start workers, so a driver never asks a pool that died
(it would wait for a worker nobody starts). The pool publishes its state every pass,
which puts the znode back after a lost session and replaces one another session left.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo.exceptions import NoNodeError

from orchestrator.services.spark_pool import PoolState
from orchestrator.zk.session import encode
from orchestrator.zk.znodes import Znodes, check_name


class SparkPoolZnodes(Znodes):
    def _asked_path(self) -> str:
        return f"{self.root}/spark/asked"

    def ask_spark_workers(self, run: str, extra: int, reason: str) -> None:
        """``run`` needs ``extra`` Spark workers beyond the base (0: none any more)."""
        path = f"{self._asked_path()}/{check_name('run', run)}"
        if extra <= 0:
            with contextlib.suppress(NoNodeError):
                self.client.retry(self.client.delete, path)
            return
        payload = encode({"extra": int(extra), "reason": reason[:500]})
        self.client.retry(self.client.ensure_path, self._asked_path())
        try:
            self.client.retry(self.client.set, path, payload)
        except NoNodeError:
            self.client.retry(self.client.create, path, payload)

    def spark_workers_asked(self) -> dict[str, int]:
        """Each run's ask, by run."""
        found: dict[str, int] = {}
        for run, value in self._read_all(self._asked_path()).items():
            extra = value.get("extra")
            if isinstance(extra, int) and not isinstance(extra, bool) and extra > 0:
                found[run] = extra
        return found

    def write_spark_pool(self, state: PoolState) -> None:
        """Publish the pool's state as this session's ephemeral znode: one read when it
        is already there as written."""
        path = f"{self.root}/spark/pool"
        payload = encode(dict(state))
        ours = self.client.client_id[0] if self.client.client_id else None
        try:
            data, stat = self.client.retry(self.client.get, path)
        except NoNodeError:
            stat = None
        if stat is not None and stat.ephemeralOwner == ours:
            if data != payload:
                self.client.retry(self.client.set, path, payload, version=stat.version)
            return
        if stat is not None:  # another session's, or a persistent one: not a live pool's
            with contextlib.suppress(NoNodeError):
                self.client.retry(self.client.delete, path, version=stat.version)
        self.client.retry(self.client.create, path, payload, ephemeral=True, makepath=True)

    def spark_pool(self) -> PoolState | None:
        """The elastic pool's state, or None when no process keeps one."""
        found: dict[str, Any] | None = self._read_json(f"{self.root}/spark/pool")
        if found is None:
            return None
        return PoolState(
            base=int(found.get("base", 0)),
            maximum=int(found.get("maximum", 0)),
            extra=int(found.get("extra", 0)),
        )
