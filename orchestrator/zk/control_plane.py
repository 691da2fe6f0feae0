"""The ZooKeeper control plane of a run: flags, state, routes, signals, locks, workers.

Everything a live run coordinates through ZooKeeper goes through :class:`ControlPlane`,
so the znode layout (ARCHITECTURE.md, "Control plane") is written down in one place::

    <root>/runs/<run>/flags/<node>        exists = the node is flagged (persistent)
    <root>/runs/<run>/state/<node>        JSON: level, watermarks, rate coefficient, speeds
    <root>/runs/<run>/routes/<node>       JSON {"epoch": e, "routes": {...}}, epoch-fenced
    <root>/runs/<run>/taskmessage/        FIFO of stepwise signals (kazoo Queue recipe)
    <root>/runs/<run>/taskstate/<task>    JSON: state a target wrote after applying a signal
    <root>/runs/<run>/adjust/<epoch>/     hot-rescale protocol (laid out elsewhere)
    <root>/runs/<run>/driver              kazoo Lock: one live driver/balance loop per run
    <root>/runs/<run>/epoch               the run's epoch, a decimal integer
    <root>/workers/<name>                 ephemeral JSON: host, pid, queues, started

Readers learn of changes by watching (ChildrenWatch/DataWatch), never by polling. Watch
callbacks run in kazoo's callback thread and connection-state callbacks in its connection
thread: both must return quickly (set an event, enqueue work), or they hold up every
other watch of the client.

This module imports no Django: the default root comes from settings only when no root
is given, so scripts and benchmarks use it with a bare ``KazooClient``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.lock import Lock
from kazoo.recipe.queue import Queue
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/bpconsole"
# One multi-op stays far below ZooKeeper's 1 MB request limit (jute.maxbuffer).
MAX_OPS_PER_TRANSACTION = 200
# Compare-and-set loops give up after this many lost races: someone is hammering the node.
MAX_CAS_ATTEMPTS = 1000
# A write loop calling through a reconnect should fail fast and let its guard pause it,
# not sit in an endless kazoo retry; reconnection itself retries forever.
COMMAND_RETRY: dict[str, float] = {"max_tries": 5, "delay": 0.05, "backoff": 2, "max_delay": 1.0}
CONNECTION_RETRY: dict[str, float] = {
    "max_tries": -1,
    "delay": 0.1,
    "backoff": 2,
    "max_delay": 2.0,
}
# Multi-op failures that mean "someone else changed the node first": re-read and re-decide.
_CAS_CONFLICTS = (BadVersionError, NoNodeError, NodeExistsError)
_ROLLED_BACK = (RolledBackError, RuntimeInconsistency)

StateCallback = Callable[[], None]


class ControlPlaneError(RuntimeError):
    """The control plane found data or a situation it cannot act on."""


class StaleEpochError(ControlPlaneError):
    """A routing write carried an epoch older than the run's or the stored routes'.

    The writer is a paused old owner (or lost a race to a newer one): it must stop
    acting on its view of the run instead of retrying.
    """

    def __init__(self, run: str, node: str, epoch: int, newer: int) -> None:
        super().__init__(
            f"routes of {run}/{node}: epoch {epoch} is stale, epoch {newer} already holds"
        )
        self.run = run
        self.node = node
        self.epoch = epoch
        self.newer = newer


class WorkerNameTakenError(ControlPlaneError):
    """Another live session already registered a worker under this name."""


def default_root() -> str:
    """``settings.ZK_ROOT`` when Django is configured, else ``/bpconsole``."""
    try:
        from django.conf import settings

        return str(getattr(settings, "ZK_ROOT", DEFAULT_ROOT))
    except Exception:  # noqa: BLE001 - no Django or unconfigured settings: the documented default
        return DEFAULT_ROOT


def encode(value: Mapping[str, Any]) -> bytes:
    """Compact JSON with sorted keys: the same value always gives the same bytes."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlPlaneError(f"{where}: not JSON: {data[:80]!r}") from exc
    if not isinstance(value, dict):
        raise ControlPlaneError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _check_name(kind: str, name: str) -> str:
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


class SessionGuard:
    """Follows the client's connection state so a loop never acts on a stale view.

    SUSPENDED: the connection dropped but the session may survive; a loop pauses (its
    locks and ephemeral znodes may still be ours). LOST: the session expired or the
    client stopped; its locks and ephemeral znodes are gone, so the loop gives up the
    lock and stops acting as owner. CONNECTED after either: the loop may resume (after
    LOST it must re-acquire what it held).

    Callbacks run in kazoo's connection thread: they must not block or call ZooKeeper.
    Set an event or hand work to another thread.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._state: KazooState = client.state
        self._connected = threading.Event()
        self._was_live = client.connected
        if client.connected:
            self._connected.set()
        self._callbacks: dict[str, list[StateCallback]] = {
            "suspended": [],
            "lost": [],
            "reconnected": [],
        }
        client.add_listener(self._listen)

    @property
    def state(self) -> KazooState:
        return self._state

    @property
    def is_connected(self) -> bool:
        return self._state == KazooState.CONNECTED

    @property
    def is_suspended(self) -> bool:
        return self._state == KazooState.SUSPENDED

    @property
    def is_lost(self) -> bool:
        return self._state == KazooState.LOST

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block (in the loop's own thread) until connected; False on timeout."""
        return self._connected.wait(timeout)

    def on_suspended(self, callback: StateCallback) -> StateCallback:
        return self._add("suspended", callback)

    def on_lost(self, callback: StateCallback) -> StateCallback:
        return self._add("lost", callback)

    def on_reconnected(self, callback: StateCallback) -> StateCallback:
        """Called on CONNECTED after SUSPENDED or LOST (not on the first connection)."""
        return self._add("reconnected", callback)

    def remove(self, callback: StateCallback) -> None:
        with self._lock:
            for callbacks in self._callbacks.values():
                if callback in callbacks:
                    callbacks.remove(callback)

    def detach(self) -> None:
        self._client.remove_listener(self._listen)

    def _add(self, kind: str, callback: StateCallback) -> StateCallback:
        with self._lock:
            self._callbacks[kind].append(callback)
        return callback

    def _listen(self, state: KazooState) -> None:
        with self._lock:
            previous, self._state = self._state, state
            kind: str | None
            if state == KazooState.CONNECTED:
                self._connected.set()
                # A guard made before ``client.start()`` sees the first connection as
                # LOST -> CONNECTED: that is no reconnection.
                kind = "reconnected" if self._was_live and previous != state else None
                self._was_live = True
            else:
                self._connected.clear()
                kind = "suspended" if state == KazooState.SUSPENDED else "lost"
            callbacks = list(self._callbacks[kind]) if kind else []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("session %s callback %r failed", kind, callback)


class ControlPlane:
    """The znodes of every run under one root, through one kazoo client.

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
        self._workers: dict[str, bytes] = {}
        self._workers_lock = threading.Lock()
        # routes path -> (epoch znode version, highest epoch seen, routes znode version)
        # after our last write of it: what the one-round-trip write checks against
        self._route_versions: dict[str, tuple[int, int, int]] = {}
        self._session_was_lost = False
        self.session.on_lost(self._note_session_lost)
        self.session.on_reconnected(self._after_reconnect)

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def connect(cls, hosts: str, root: str | None = None, timeout: float = 10.0) -> Self:
        """Start a client on ``hosts`` (``timeout`` is both the session timeout and how
        long to wait for the first connection) and own it."""
        client = KazooClient(
            hosts=hosts,
            timeout=timeout,
            command_retry=dict(COMMAND_RETRY),
            connection_retry=dict(CONNECTION_RETRY),
        )
        client.start(timeout=timeout)  # on timeout kazoo stops and closes the client itself
        plane = cls(client, root)
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
        return f"{self.root}/runs/{_check_name('run', run)}"

    def _folder(self, run: str, kind: str) -> str:
        return f"{self.run_path(run)}/{kind}"

    def _child(self, run: str, kind: str, name: str, what: str = "node") -> str:
        return f"{self._folder(run, kind)}/{_check_name(what, name)}"

    def adjust_path(self, run: str, epoch: int) -> str:
        """Folder of the hot-rescale round of ``epoch`` (the protocol lives elsewhere)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return f"{self._folder(run, 'adjust')}/{epoch}"

    def _epoch_path(self, run: str) -> str:
        return f"{self.run_path(run)}/epoch"

    def _workers_path(self) -> str:
        return f"{self.root}/workers"

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
        pending = [self.client.create_async(f"{folder}/{_check_name('node', n)}") for n in add] + [
            self.client.delete_async(f"{folder}/{_check_name('node', n)}") for n in remove
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
        self.write_states(run, {node: state})

    def write_states(self, run: str, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Write many nodes' states in one multi-op per chunk (one round trip, one log
        entry); readers see a tick's states together."""
        self._upsert_many(self._folder(run, "state"), states)

    def read_state(self, run: str, node: str) -> dict[str, Any] | None:
        return self._read_json(self._child(run, "state", node))

    def read_states(self, run: str) -> dict[str, dict[str, Any]]:
        return self._read_all(self._folder(run, "state"))

    # -- routes (epoch-fenced) ------------------------------------------------------

    def write_routes(self, run: str, node: str, routes: Mapping[str, Any], epoch: int) -> None:
        """Store ``node``'s traffic shares, fenced by ``epoch``.

        Refused with :class:`StaleEpochError` when the stored routes carry a higher epoch
        or the run's epoch has moved past ``epoch``: a paused old owner must not undo a
        newer owner's routing. The write is a multi-op of a version check on the run's
        epoch znode and a versioned set (or create) of the routes, so a concurrent writer
        or epoch bump makes it re-read and re-decide instead of overwriting.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        path = self._child(run, "routes", node)
        payload = encode({"epoch": epoch, "routes": dict(routes)})
        if self._write_routes_fast(run, path, payload, epoch):
            return
        self.client.retry(self.client.ensure_path, self._folder(run, "routes"))
        for _ in range(MAX_CAS_ATTEMPTS):
            if self.client.retry(self._try_write_routes, run, node, path, payload, epoch):
                return
        raise ControlPlaneError(f"routes of {run}/{node}: too many concurrent writers")

    def _write_routes_fast(self, run: str, path: str, payload: bytes, epoch: int) -> bool:
        """One round trip when nothing moved since our own last write of ``path``: the
        same epoch-znode and routes versions, checked in one multi-op. Any change (a new
        epoch, another writer) fails the check, and the full path re-reads and decides."""
        known = self._route_versions.get(path)
        if known is None:
            return False
        epoch_version, floor, routes_version = known
        if epoch < floor:
            return False  # the full path re-reads and refuses with the newer epoch

        tx = self.client.transaction()
        tx.check(self._epoch_path(run), epoch_version)
        tx.set_data(path, payload, version=routes_version)
        try:
            results = self.client.retry(tx.commit)
        except KazooException:
            return False
        if any(isinstance(r, Exception) for r in results):
            self._route_versions.pop(path, None)
            return False
        self._route_versions[path] = (epoch_version, max(floor, epoch), results[1].version)
        return True

    def _try_write_routes(self, run: str, node: str, path: str, payload: bytes, epoch: int) -> bool:
        run_epoch, epoch_stat = self._epoch_with_stat(run, create=True)
        if epoch < run_epoch:
            raise StaleEpochError(run, node, epoch, run_epoch)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            stat = None
        else:
            stored = int(decode(data, path).get("epoch", 0))
            if epoch < stored:
                raise StaleEpochError(run, node, epoch, stored)
        tx = self.client.transaction()
        tx.check(self._epoch_path(run), epoch_stat.version)
        if stat is None:
            tx.create(path, payload)
        else:
            tx.set_data(path, payload, version=stat.version)
        results = tx.commit()
        if not self._committed(results, path):
            return False
        written = 0 if stat is None else results[1].version
        self._route_versions[path] = (epoch_stat.version, max(run_epoch, epoch), written)
        return True

    def raise_epoch(self, run: str, at_least: int) -> int:
        """Move the run's epoch up to ``at_least`` (never down); returns the epoch. The
        ledger's epoch is the source of truth; this keeps ZooKeeper's fence in step."""
        for _ in range(MAX_CAS_ATTEMPTS):
            current, stat = self._epoch_with_stat(run, create=True)
            if current >= at_least:
                return current
            try:
                self.client.retry(
                    self.client.set,
                    self._epoch_path(run),
                    str(at_least).encode(),
                    version=stat.version,
                )
            except BadVersionError:
                continue
            return at_least
        raise ControlPlaneError(f"epoch of {run}: too many concurrent increments")

    def read_routes(self, run: str, node: str) -> tuple[dict[str, Any], int] | None:
        """``(routes, epoch)`` as last written, or None if never written."""
        value = self._read_json(self._child(run, "routes", node))
        return None if value is None else _routes_of(value)

    def watch_routes(
        self,
        run: str,
        node: str,
        callback: Callable[[tuple[dict[str, Any], int] | None], None],
    ) -> Subscription:
        """Call ``callback((routes, epoch) or None)`` now and after every change."""
        path = self._child(run, "routes", node)
        return self._watch_data(
            path, lambda value: callback(None if value is None else _routes_of(value))
        )

    # -- stepwise signals (FIFO queue) and task states ------------------------------

    def _queue(self, run: str, kind: str = "taskmessage") -> Queue:
        return Queue(self.client, self._folder(run, kind))

    def put_signal(self, run: str, message: Mapping[str, Any]) -> None:
        """Append a stepwise signal (``{signal: slow|restore, target, origin, ...}``).

        A connection loss during the create may, on retry, enqueue it twice (a sequential
        znode cannot be made idempotent); signal handlers must tolerate a repeat."""
        self._queue(run).put(encode(message))

    def take_signals(self, run: str, limit: int = 100) -> list[dict[str, Any]]:
        """Consume up to ``limit`` signals, oldest first. Each one is deleted as it is
        taken, and a delete is what claims it, so concurrent handlers never share one."""
        return self._take(run, "taskmessage", limit)

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

    def pending_signals(self, run: str) -> int:
        return len(self._children(self._folder(run, "taskmessage")))

    def watch_signals(self, run: str, callback: Callable[[int], None]) -> Subscription:
        """Call ``callback(number pending)`` now and whenever the queue changes, so a
        handler sleeps until there is work (then calls :meth:`take_signals` in its own
        thread, not in the callback)."""
        return self._watch_children(
            self._folder(run, "taskmessage"), lambda names: callback(len(names))
        )

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

    # -- driver lock and epoch ------------------------------------------------------

    def driver_lock(self, run: str, identifier: str) -> Lock:
        """The run's driver lock; ``identifier`` (host:pid, task id) names the holder to
        :meth:`driver_holder`. Acquire with a timeout (kazoo raises ``LockTimeout``).

        After LOST the lock's znode is gone although kazoo's ``is_acquired`` still says
        True: the loop's ``on_lost`` callback must stop acting as owner; ``release()``
        once reconnected is harmless and resets the object for a new ``acquire()``."""
        return self.client.Lock(f"{self.run_path(run)}/driver", identifier)

    def driver_holder(self, run: str) -> str | None:
        """Identifier of the live driver holding the lock, or None if nobody does: what
        a watchdog checks before starting a new driver."""
        path = f"{self.run_path(run)}/driver"
        if self.client.retry(self.client.exists, path) is None:
            return None  # do not create the folder of a run that has none
        try:
            contenders = self.client.retry(Lock(self.client, path).contenders)
        except NoNodeError:
            return None
        return contenders[0] if contenders else None

    def current_epoch(self, run: str) -> int:
        """The run's epoch; 0 before the first :meth:`next_epoch`."""
        return self._epoch_with_stat(run, create=False)[0]

    def next_epoch(self, run: str) -> int:
        """Atomically increment and return the run's epoch (versioned set, retried on a
        lost race). Monotonic; a connection loss at the wrong moment may skip a value."""
        for _ in range(MAX_CAS_ATTEMPTS):
            bumped = self.client.retry(self._try_bump_epoch, run)
            if bumped is not None:
                return bumped
        raise ControlPlaneError(f"epoch of {run}: too many concurrent increments")

    def _try_bump_epoch(self, run: str) -> int | None:
        path = self._epoch_path(run)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            try:
                self.client.create(path, b"1", makepath=True)
            except NodeExistsError:
                return None
            return 1
        value = _parse_epoch(data, path) + 1
        try:
            self.client.set(path, str(value).encode(), version=stat.version)
        except BadVersionError:
            return None
        return value

    def _epoch_with_stat(self, run: str, *, create: bool) -> tuple[int, ZnodeStat | None]:
        path = self._epoch_path(run)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            if not create:
                return 0, None
            with contextlib.suppress(NodeExistsError):
                self.client.create(path, b"0", makepath=True)
            data, stat = self.client.get(path)
        return _parse_epoch(data, path), stat

    # -- hot rescale (adjust/<version>/) ---------------------------------------------

    def write_adjustment(
        self, run: str, version: int, steps: Mapping[str, Mapping[str, Any]], under: str = ""
    ) -> None:
        """Write steps of adjustment ``version`` (``plan``, ``state``; with ``under=
        "updates"`` one graph-state update per instance) under ``adjust/<version>/``."""
        folder = self.adjust_path(run, version)
        if under:
            folder = f"{folder}/{_check_name('folder', under)}"
        self._upsert_many(folder, steps)

    def report_tail(self, run: str, version: int, instance: str, report: Mapping[str, Any]) -> None:
        """A tail of the adjustment's subgraph has every marker (hot-rescale.md step 4)."""
        path = f"{self.adjust_path(run, version)}/tails/{_check_name('node', instance)}"
        with contextlib.suppress(NodeExistsError):
            self.client.retry(self.client.create, path, encode(report), makepath=True)

    def adjustment_tails(self, run: str, version: int) -> set[str]:
        return set(self._children(f"{self.adjust_path(run, version)}/tails"))

    def read_adjustment(self, run: str, version: int) -> dict[str, dict[str, Any]]:
        return self._read_all(self.adjust_path(run, version))

    # -- workers --------------------------------------------------------------------

    def register_worker(self, name: str, info: Mapping[str, Any]) -> None:
        """Announce a live worker with an ephemeral znode: it vanishes with the session.
        After a lost session the registration is made again on reconnect."""
        path = f"{self._workers_path()}/{_check_name('worker', name)}"
        payload = encode(info)
        self._create_worker(path, payload)
        with self._workers_lock:
            self._workers[name] = payload

    def unregister_worker(self, name: str) -> bool:
        with self._workers_lock:
            self._workers.pop(name, None)
        try:
            self.client.retry(
                self.client.delete, f"{self._workers_path()}/{_check_name('worker', name)}"
            )
        except NoNodeError:
            return False
        return True

    def live_workers(self) -> dict[str, dict[str, Any]]:
        return self._read_all(self._workers_path())

    def watch_workers(self, callback: Callable[[set[str]], None]) -> Subscription:
        """Call ``callback(worker names)`` now and whenever a worker comes or goes."""
        return self._watch_children(self._workers_path(), callback)

    def _create_worker(self, path: str, payload: bytes) -> None:
        try:
            self.client.retry(self.client.create, path, payload, ephemeral=True, makepath=True)
            return
        except NodeExistsError:
            pass
        # Ours already (a retried create that had succeeded, or re-registration)? Update it.
        data, stat = self.client.retry(self.client.get, path)
        session_id = self.client.client_id[0] if self.client.client_id else None
        if stat.ephemeralOwner != session_id:
            raise WorkerNameTakenError(
                f"worker {path.rsplit('/', 1)[1]} is registered by another session"
            )
        if data != payload:
            self.client.retry(self.client.set, path, payload, version=stat.version)

    def _note_session_lost(self) -> None:
        self._session_was_lost = True

    def _after_reconnect(self) -> None:
        if not self._session_was_lost:
            return
        self._session_was_lost = False
        with self._workers_lock:
            workers = dict(self._workers)
        if workers:
            # Not in the connection thread: that would block the client.
            self.client.handler.spawn(self._reregister, workers)

    def _reregister(self, workers: Mapping[str, bytes]) -> None:
        for name, payload in workers.items():
            try:
                self._create_worker(f"{self._workers_path()}/{name}", payload)
            except Exception:
                log.exception("could not re-register worker %s after a lost session", name)

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

    # -- helpers --------------------------------------------------------------------

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
        items = [(f"{folder}/{_check_name(what, name)}", encode(v)) for name, v in values.items()]
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
            r for r in results if isinstance(r, Exception) and not isinstance(r, _ROLLED_BACK)
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
        if all(isinstance(r, _CAS_CONFLICTS + _ROLLED_BACK) for r in failures):
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


def _routes_of(value: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    return dict(value.get("routes", {})), int(value.get("epoch", 0))


def _parse_epoch(data: bytes, path: str) -> int:
    try:
        return int(data.decode("ascii").strip() or 0)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlPlaneError(f"{path}: epoch is not an integer: {data[:40]!r}") from exc


__all__ = [
    "DEFAULT_ROOT",
    "ControlPlane",
    "ControlPlaneError",
    "SessionGuard",
    "StaleEpochError",
    "Subscription",
    "WorkerNameTakenError",
    "decode",
    "default_root",
    "encode",
]
