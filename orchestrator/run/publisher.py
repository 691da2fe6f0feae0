"""The one way workers talk to browsers: a message to the run's Channels group, and the
run's last snapshot kept in Redis beside the channel layer for viewers who come later.

The driver's reporter publishes a snapshot every tick (orchestrator/run/driver.py); a
browser connecting mid-run, or asking the API, reads the one kept here
(:func:`last_snapshot`) instead of assembling the view a second time from ZooKeeper.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

if TYPE_CHECKING:
    from orchestrator.run.snapshot import Snapshot

log = logging.getLogger(__name__)

# How long a kept snapshot outlives its last refresh: a live run refreshes it every tick;
# one whose driver is gone (and not replaced) stops being shown as live after this.
SNAPSHOT_TTL_S = 15 * 60
REDIS_TIMEOUT_S = 2.0


# What a driver is given to publish with: :func:`publish`, or a benchmark's timed wrapper.
Publisher = Callable[[int, Mapping[str, object]], None]


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def snapshot_key(run_id: int) -> str:
    """Where the run's last snapshot is kept in Redis."""
    return f"bpconsole:run:{run_id}:snapshot"


def publish(run_id: int, message: Mapping[str, object]) -> None:
    """Send ``message`` (a typed dict with a ``type`` field) to every viewer of the run;
    a snapshot is also kept for viewers who connect later.

    A failure to publish never stops the run: the view catches up on the next tick.
    """
    if message.get("type") == "snapshot":
        keep_snapshot(run_id, message)
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            run_group(run_id), {"type": "run.message", "message": message}
        )
    except Exception:
        log.warning("run %s: could not publish to the live view", run_id, exc_info=True)


def keep_snapshot(run_id: int, snapshot: Mapping[str, object]) -> None:
    """Keep ``snapshot`` as the run's last one (for :data:`SNAPSHOT_TTL_S`)."""
    try:
        _redis().set(snapshot_key(run_id), json.dumps(snapshot), ex=SNAPSHOT_TTL_S)
    except (redis.RedisError, OSError):
        log.warning("run %s: could not keep the snapshot for late viewers", run_id, exc_info=True)


def last_snapshot(run_id: int) -> Snapshot | None:
    """The run's last published snapshot, or None (none kept, expired, or Redis is out
    of reach: the caller builds one from the database)."""
    try:
        raw = _redis().get(snapshot_key(run_id))
    except (redis.RedisError, OSError):
        log.warning("run %s: could not read the kept snapshot", run_id, exc_info=True)
        return None
    if raw is None:
        return None
    try:
        return cast("Snapshot", json.loads(raw))
    except ValueError:
        return None


def forget_snapshot(run_id: int) -> None:
    """Drop what is kept for ``run_id`` (a new run with an id used before)."""
    try:
        _redis().delete(snapshot_key(run_id))
    except (redis.RedisError, OSError):
        log.warning("run %s: could not drop a kept snapshot", run_id, exc_info=True)


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client (a connection pool) per Redis URL, shared by the process's threads."""
    url = settings.REDIS_URL
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = redis.Redis.from_url(
                url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
            )
            _clients[url] = client
        return client
