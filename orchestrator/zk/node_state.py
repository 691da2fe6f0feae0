"""What each node of a run shows the others: its backpressure flag, its state, and the
state a target wrote after applying a stepwise signal.

Owns ``runs/<run>/flags/<node>`` (exists = flagged), ``runs/<run>/state/<node>`` (JSON:
level, high/low water, rate coefficient, speeds, in backpressure) and
``runs/<run>/taskstate/<task>`` (JSON: speed, origin speed, in backpressure).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from balancer.model import NodeState
from orchestrator.zk.znodes import Subscription, Znodes, check_name


class NodeStateZnodes(Znodes):
    # -- flags ----------------------------------------------------------------------

    def set_flag(self, run: str, node: str) -> bool:
        """Flag ``node``; True if this call created the flag, False if it was set already."""
        try:
            self.client.retry(self.client.create, self._child(run, "flags", node), makepath=True)
        except NodeExistsError:
            return False
        return True

    def clear_flag(self, run: str, node: str) -> bool:
        """Unflag ``node``; True if this call deleted the flag, False if it was not set."""
        try:
            self.client.retry(self.client.delete, self._child(run, "flags", node))
        except NoNodeError:
            return False
        return True

    def update_flags(self, run: str, add: Iterable[str], remove: Iterable[str]) -> None:
        """Set and clear many flags in one round of pipelined requests (a balancer tick
        may change dozens); existing flags and missing ones are no-ops as with
        :meth:`set_flag` and :meth:`clear_flag`."""
        add, remove = list(add), list(remove)
        if not add and not remove:
            return
        folder = self._folder(run, "flags")
        if add:
            self.client.retry(self.client.ensure_path, folder)
        pending = [self.client.create_async(f"{folder}/{check_name('node', n)}") for n in add] + [
            self.client.delete_async(f"{folder}/{check_name('node', n)}") for n in remove
        ]
        for result in pending:
            with contextlib.suppress(NodeExistsError, NoNodeError):
                result.get()

    def flags(self, run: str) -> set[str]:
        return set(self._children(self._folder(run, "flags")))

    def watch_flags(self, run: str, callback: Callable[[set[str]], None]) -> Subscription:
        """Call ``callback(flagged nodes)`` now and after every change of the run's flags."""
        return self._watch_children(self._folder(run, "flags"), callback)

    # -- node state -----------------------------------------------------------------

    def write_state(self, run: str, node: str, state: Mapping[str, Any]) -> None:
        self._upsert_many(self._folder(run, "state"), {node: state})

    def write_states(self, run: str, states: Mapping[str, NodeState]) -> None:
        """Write many nodes' states in one multi-op per chunk (one round trip, one log
        entry); readers see a tick's states together."""
        self._upsert_many(self._folder(run, "state"), states)

    def read_state(self, run: str, node: str) -> dict[str, Any] | None:
        return self._read_json(self._child(run, "state", node))

    def read_states(self, run: str) -> dict[str, dict[str, Any]]:
        return self._read_all(self._folder(run, "state"))

    # -- task states (after a stepwise signal) --------------------------------------

    def write_task_state(self, run: str, task: str, state: Mapping[str, Any]) -> None:
        """The state a target wrote after applying a signal: speed, origin speed, in
        backpressure."""
        self._upsert_many(self._folder(run, "taskstate"), {task: state}, "task")

    def read_task_state(self, run: str, task: str) -> dict[str, Any] | None:
        return self._read_json(self._child(run, "taskstate", task, "task"))

    def read_task_states(self, run: str) -> dict[str, dict[str, Any]]:
        return self._read_all(self._folder(run, "taskstate"))

    def watch_task_state(
        self, run: str, task: str, callback: Callable[[dict[str, Any] | None], None]
    ) -> Subscription:
        """Follow one neighbour's state (None while it has written none)."""
        return self._watch_data(self._child(run, "taskstate", task, "task"), callback)
