"""A run's FIFO queues: stepwise backpressure signals and operators' commands.

Owns ``runs/<run>/taskmessage/`` (stepwise signals: ``{signal: slow|restore, target,
origin, ...}``) and ``runs/<run>/commands/`` (operators' requests to the run's driver:
pause, migrate, adjust, ...), both kazoo's Queue recipe. Taking an item deletes it, and
the delete is what claims it, so concurrent consumers never share one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kazoo.recipe.queue import Queue

from orchestrator.zk.session import decode, encode
from orchestrator.zk.znodes import Subscription, Znodes


class QueueZnodes(Znodes):
    def _queue(self, run: str, kind: str = "taskmessage") -> Queue:
        return Queue(self.client, self._folder(run, kind))

    # -- stepwise signals -----------------------------------------------------------

    def put_signal(self, run: str, message: Mapping[str, Any]) -> None:
        """Append a stepwise signal (``{signal: slow|restore, target, origin, ...}``).

        A connection loss during the create may, on retry, enqueue it twice (a sequential
        znode cannot be made idempotent); signal handlers must tolerate a repeat."""
        self._queue(run).put(encode(message))

    def take_signals(self, run: str, limit: int = 100) -> list[dict[str, Any]]:
        """Consume up to ``limit`` signals, oldest first. Each one is deleted as it is
        taken, and a delete is what claims it, so concurrent handlers never share one."""
        return self._take(run, "taskmessage", limit)

    def pending_signals(self, run: str) -> int:
        return len(self._children(self._folder(run, "taskmessage")))

    def watch_signals(self, run: str, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(number pending)`` now and whenever the queue changes, so a
        handler sleeps until there is work (then calls :meth:`take_signals` in its own
        thread, not in the callback)."""
        return self._watch_children(
            self._folder(run, "taskmessage"), lambda names: callback(len(names))
        )

    # -- operators' commands --------------------------------------------------------

    def put_command(self, run: str, message: Mapping[str, Any]) -> None:
        """An operator's request to the run's driver (e.g. migrate a branch now)."""
        self._queue(run, "commands").put(encode(message))

    def watch_commands(self, run: str, callback: Callable[[int], None]) -> Subscription:
        """Like :meth:`watch_signals`, for operators' commands."""
        return self._watch_children(
            self._folder(run, "commands"), lambda names: callback(len(names))
        )

    def take_commands(self, run: str, limit: int = 100) -> list[dict[str, Any]]:
        return self._take(run, "commands", limit)

    def _take(self, run: str, kind: str, limit: int) -> list[dict[str, Any]]:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        queue = self._queue(run, kind)
        taken: list[dict[str, Any]] = []
        while len(taken) < limit:
            data = queue.get()
            if data is None:
                break
            taken.append(decode(data, queue.path))
        return taken
