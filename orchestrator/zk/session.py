"""The kazoo session under the control plane: the client's settings, its connection
state, the JSON a znode holds, and the control plane's base error.

Owns: how a client is started (:func:`start_client`: command and connection retries),
:class:`SessionGuard` (SUSPENDED, LOST, CONNECTED as a loop must see them), the
encoding of every JSON znode (:func:`encode`, :func:`decode`), the default root and
:class:`ControlPlaneError`.

Imports no Django: the default root comes from settings only when no root is given, so
scripts and benchmarks use the control plane with a bare ``KazooClient``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient, KazooState

from orchestrator.services.credentials import zk_client

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/bpconsole"
# A write loop calling through a reconnect should fail fast and let its guard pause it,
# not sit in an endless kazoo retry; reconnection itself retries forever.
COMMAND_RETRY: dict[str, float] = {"max_tries": 5, "delay": 0.05, "backoff": 2, "max_delay": 1.0}
CONNECTION_RETRY: dict[str, float] = {
    "max_tries": -1,
    "delay": 0.1,
    "backoff": 2,
    "max_delay": 2.0,
}

StateCallback = Callable[[], None]

# kazoo has no type information: its connection states are these plain strings.
_CONNECTED: str = KazooState.CONNECTED
_SUSPENDED: str = KazooState.SUSPENDED
_LOST: str = KazooState.LOST


class ControlPlaneError(RuntimeError):
    """The control plane found data or a situation it cannot act on."""


def default_root() -> str:
    """``settings.ZK_ROOT`` when Django is configured, else ``/bpconsole``."""
    try:
        from django.conf import settings

        return str(getattr(settings, "ZK_ROOT", DEFAULT_ROOT))
    except Exception:  # noqa: BLE001 - no Django or unconfigured settings: the documented default
        return DEFAULT_ROOT


def start_client(hosts: str, timeout: float) -> KazooClient:
    """A started client on ``hosts`` (a connection string, with the console's digest
    user when it has one: ``orchestrator.services.credentials.ZkAddress``): ``timeout``
    is both the session timeout and how long to wait for the first connection. On
    timeout kazoo stops and closes the client."""
    client = zk_client(
        hosts,
        timeout=timeout,
        command_retry=dict(COMMAND_RETRY),
        connection_retry=dict(CONNECTION_RETRY),
    )
    client.start(timeout=timeout)
    return client


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
        self._state: str = client.state
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
    def state(self) -> str:
        return self._state

    @property
    def is_connected(self) -> bool:
        return self._state == _CONNECTED

    @property
    def is_suspended(self) -> bool:
        return self._state == _SUSPENDED

    @property
    def is_lost(self) -> bool:
        return self._state == _LOST

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

    def _listen(self, state: str) -> None:
        with self._lock:
            previous, self._state = self._state, state
            kind: str | None
            if state == _CONNECTED:
                self._connected.set()
                # A guard made before ``client.start()`` sees the first connection as
                # LOST -> CONNECTED: that is no reconnection.
                kind = "reconnected" if self._was_live and previous != state else None
                self._was_live = True
            else:
                self._connected.clear()
                kind = "suspended" if state == _SUSPENDED else "lost"
            callbacks = list(self._callbacks[kind]) if kind else []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("session %s callback %r failed", kind, callback)
