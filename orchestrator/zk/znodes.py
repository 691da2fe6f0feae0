"""The znodes of every run under one root: paths, and the reads, writes and watches every
part of the control plane is built from.

Owns: :class:`Znodes` (a client, its :class:`~orchestrator.zk.session.SessionGuard` and
the root; connecting and closing; a run's folders; deleting a run), name checks, batched
JSON writes (one multi-op per chunk), pipelined reads, and :class:`Subscription`, the
handle on a watch.

Readers learn of changes by watching (ChildrenWatch/DataWatch), never by polling. Watch
callbacks run in kazoo's callback thread: they must return quickly (set an event,
enqueue work), or they hold up every other watch of the client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from orchestrator.zk.session import (
    ControlPlaneError,
    SessionGuard,
    decode,
    default_root,
    encode,
    start_client,
)

log = logging.getLogger(__name__)

# One multi-op stays far below ZooKeeper's 1 MB request limit (jute.maxbuffer).
MAX_OPS_PER_TRANSACTION = 200
# Compare-and-set loops give up after this many lost races: someone is hammering the node.
MAX_CAS_ATTEMPTS = 1000
# Multi-op failures that mean "someone else changed the node first": re-read and re-decide.
CAS_CONFLICTS = (BadVersionError, NoNodeError, NodeExistsError)
ROLLED_BACK = (RolledBackError, RuntimeInconsistency)


def check_name(kind: str, name: str) -> str:
    """Run, node, task and worker names become one znode each: no slashes, no dots-only."""
    if not isinstance(name, str) or not name or name in {".", ".."}:
        raise ValueError(f"invalid {kind} name: {name!r}")
    if "/" in name or "\x00" in name:
        raise ValueError(f"{kind} name must not contain '/' or NUL: {name!r}")
    return name


def _chunks(items: Sequence[tuple[str, bytes]], size: int) -> Iterator[Sequence[tuple[str, bytes]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Subscription:
    """Handle on a watch. :meth:`cancel` stops the callbacks at once; kazoo drops the
    underlying watch at its next event (ZooKeeper watches cannot be withdrawn)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Znodes:
    """One kazoo client and the root every run's znodes live under.

    Pass a started client (the caller keeps ownership) or use :meth:`connect` (the
    control plane owns the client and :meth:`close` stops it). Every method is safe to
    call from several threads: kazoo's client is.
    """

    def __init__(self, client: KazooClient, root: str | None = None) -> None:
        root = default_root() if root is None else root
        if not root.startswith("/") or root.rstrip("/") == "" or "//" in root:
            raise ValueError(f"root must be an absolute znode path other than '/': {root!r}")
        self.client = client
        self.root = root.rstrip("/")
        self.session = SessionGuard(client)
        self._owns_client = False

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def connect(cls, hosts: str, root: str | None = None, timeout: float = 10.0) -> Self:
        """Start a client on ``hosts`` (``timeout`` is both the session timeout and how
        long to wait for the first connection) and own it."""
        plane = cls(start_client(hosts, timeout), root)
        plane._owns_client = True
        return plane

    def close(self) -> None:
        """Detach from the client; stop and close it if :meth:`connect` made it. Ephemeral
        znodes (workers, locks) of an owned client vanish with its session."""
        self.session.detach()
        if self._owns_client:
            self.client.stop()
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- paths ----------------------------------------------------------------------

    def run_path(self, run: str) -> str:
        return f"{self.root}/runs/{check_name('run', run)}"

    def _folder(self, run: str, kind: str) -> str:
        return f"{self.run_path(run)}/{kind}"

    def _child(self, run: str, kind: str, name: str, what: str = "node") -> str:
        return f"{self._folder(run, kind)}/{check_name(what, name)}"

    # -- clean-up -------------------------------------------------------------------

    def delete_run(self, run: str) -> bool:
        """Remove everything of ``run``; False if there was nothing. Retries when a child
        appears during the delete (a straggling writer)."""
        path = self.run_path(run)
        if self.client.retry(self.client.exists, path) is None:
            return False  # kazoo's recursive delete is silent about a missing node
        for _ in range(10):
            try:
                self.client.retry(self.client.delete, path, recursive=True)
            except NoNodeError:
                return False
            except NotEmptyError:
                continue
            return True
        raise ControlPlaneError(f"{path}: children keep appearing, could not delete")

    # -- reads, writes and watches ----------------------------------------------------

    def _children(self, path: str) -> list[str]:
        try:
            return list(self.client.retry(self.client.get_children, path))
        except NoNodeError:
            return []

    def _read_json(self, path: str) -> dict[str, Any] | None:
        try:
            data, _ = self.client.retry(self.client.get, path)
        except NoNodeError:
            return None
        return decode(data, path)

    def _read_all(self, folder: str) -> dict[str, dict[str, Any]]:
        """Read every child of ``folder`` with pipelined gets (one round trip, not one per
        child); children deleted meanwhile are skipped."""
        names = self._children(folder)
        pending = [(name, self.client.get_async(f"{folder}/{name}")) for name in names]
        values: dict[str, dict[str, Any]] = {}
        for name, result in pending:
            try:
                data, _ = result.get()
            except NoNodeError:
                continue
            values[name] = decode(data, f"{folder}/{name}")
        return values

    def _upsert_many(
        self, folder: str, values: Mapping[str, Mapping[str, Any]], what: str = "node"
    ) -> None:
        items = [(f"{folder}/{check_name(what, name)}", encode(v)) for name, v in values.items()]
        for chunk in _chunks(items, MAX_OPS_PER_TRANSACTION):
            if not self.client.retry(self._set_all, chunk):
                # First write of some node: create what is missing, set the rest.
                self.client.retry(self.client.ensure_path, folder)
                self.client.retry(self._upsert_each, chunk)

    def _set_all(self, items: Sequence[tuple[str, bytes]]) -> bool:
        tx = self.client.transaction()
        for path, payload in items:
            tx.set_data(path, payload)
        results = tx.commit()
        failures = [
            r for r in results if isinstance(r, Exception) and not isinstance(r, ROLLED_BACK)
        ]
        if not failures:
            return True
        if all(isinstance(r, NoNodeError) for r in failures):
            return False
        raise failures[0]

    def _upsert_each(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Pipelined create-or-set of each item: all requests go out before any answer."""
        sets = [(path, payload, self.client.set_async(path, payload)) for path, payload in items]
        creates = []
        for path, payload, result in sets:
            try:
                result.get()
            except NoNodeError:
                creates.append((path, payload, self.client.create_async(path, payload)))
        for path, payload, result in creates:
            try:
                result.get()
            except NodeExistsError:  # created by a concurrent writer: ours is newer
                self.client.set(path, payload)

    def _committed(self, results: list[Any], path: str) -> bool:
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return True
        if all(isinstance(r, CAS_CONFLICTS + ROLLED_BACK) for r in failures):
            return False
        raise ControlPlaneError(f"{path}: transaction failed: {failures!r}")

    def _watch_children(self, path: str, callback: Callable[[set[str]], None]) -> Subscription:
        self.client.retry(self.client.ensure_path, path)
        subscription = Subscription(path)

        def on_children(children: list[str]) -> bool | None:
            if subscription.cancelled:
                return False
            try:
                callback(set(children))
            except Exception:
                log.exception("children watch callback on %s failed", path)
            return None

        ChildrenWatch(self.client, path, on_children)
        return subscription

    def _watch_data(
        self, path: str, callback: Callable[[dict[str, Any] | None], None]
    ) -> Subscription:
        subscription = Subscription(path)

        # Three parameters on purpose: DataWatch retries a TypeError with two.
        def on_data(
            data: bytes | None, stat: ZnodeStat | None, event: object = None
        ) -> bool | None:
            if subscription.cancelled:
                return False
            try:
                callback(None if stat is None or data is None else decode(data, path))
            except Exception:
                log.exception("data watch callback on %s failed", path)
            return None

        DataWatch(self.client, path, on_data)
        return subscription
