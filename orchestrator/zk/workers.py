"""Who is alive and who drives: the worker registry and each run's driver lock.

Owns ``workers/<name>`` (ephemeral JSON: host, pid, queues, started; made again after a
lost session) and ``runs/<run>/driver`` (kazoo Lock: one live driver/balance loop per
run), and :class:`WorkerNameTakenError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.lock import Lock

from orchestrator.zk.session import ControlPlaneError, encode
from orchestrator.zk.znodes import Subscription, Znodes, check_name

log = logging.getLogger(__name__)


class WorkerNameTakenError(ControlPlaneError):
    """Another live session already registered a worker under this name."""


class WorkerZnodes(Znodes):
    def __init__(self, client: KazooClient, root: str | None = None) -> None:
        super().__init__(client, root)
        self._workers: dict[str, bytes] = {}
        self._workers_lock = threading.Lock()
        self._session_was_lost = False
        self.session.on_lost(self._note_session_lost)
        self.session.on_reconnected(self._after_reconnect)

    def _workers_path(self) -> str:
        return f"{self.root}/workers"

    # -- driver lock ----------------------------------------------------------------

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

    def break_driver_lock(self, run: str, holder: str) -> int:
        """Delete ``holder``'s contender znodes of the run's driver lock, before its
        session expires: for a holder known to be dead (its process is gone). A holder
        that was in fact alive is fenced by the epoch the next driver takes. Returns how
        many znodes went."""
        path = f"{self.run_path(run)}/driver"
        try:
            children = self.client.retry(self.client.get_children, path)
        except NoNodeError:
            return 0
        broken = 0
        for child in children:
            try:
                data, _ = self.client.retry(self.client.get, f"{path}/{child}")
                if data.decode("utf-8", "replace") == holder:
                    self.client.retry(self.client.delete, f"{path}/{child}")
                    broken += 1
            except NoNodeError:
                continue  # released meanwhile
        return broken

    # -- workers --------------------------------------------------------------------

    def register_worker(self, name: str, info: Mapping[str, Any]) -> None:
        """Announce a live worker with an ephemeral znode: it vanishes with the session.
        After a lost session the registration is made again on reconnect."""
        path = f"{self._workers_path()}/{check_name('worker', name)}"
        payload = encode(info)
        self._create_worker(path, payload)
        with self._workers_lock:
            self._workers[name] = payload

    def register_worker_when_free(
        self, name: str, info: Mapping[str, Any], *, timeout_s: float
    ) -> None:
        """:meth:`register_worker`, waiting while the name is held by another session:
        a worker killed and started again at once finds its old registration there
        until ZooKeeper expires the dead process's session. Raises
        :class:`WorkerNameTakenError` if the name is still held after ``timeout_s``."""
        path = f"{self._workers_path()}/{check_name('worker', name)}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.register_worker(name, info)
                return
            except WorkerNameTakenError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                gone = threading.Event()
                if self.client.retry(self.client.exists, path, watch=_setter(gone)):
                    gone.wait(min(left, 1.0))

    def unregister_worker(self, name: str) -> bool:
        with self._workers_lock:
            self._workers.pop(name, None)
        try:
            self.client.retry(
                self.client.delete, f"{self._workers_path()}/{check_name('worker', name)}"
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
        name = path.rsplit("/", 1)[1]
        for _attempt in range(3):
            try:
                self.client.retry(self.client.create, path, payload, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                pass
            # Ours already (a retried create that had succeeded, or re-registration)?
            # Update it. Gone meanwhile (its session just ended)? Create it again.
            try:
                data, stat = self.client.retry(self.client.get, path)
                break
            except NoNodeError:
                continue
        else:
            raise WorkerNameTakenError(f"worker {name} keeps being registered and dropped")
        session_id = self.client.client_id[0] if self.client.client_id else None
        if stat.ephemeralOwner != session_id:
            raise WorkerNameTakenError(f"worker {name} is registered by another session")
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


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """A kazoo watch that sets ``event``."""

    def watch(_change: Any) -> None:
        event.set()

    return watch
