"""The live run view's websocket: ``ws/runs/<id>/``.

On connect: the user must be logged in with at least the viewer role (anonymous and
role-less users are refused before the handshake completes; the origin was already
checked by ``AllowedHostsOriginValidator`` in ``webapp/asgi.py``), the run must exist;
the consumer joins the run's group, then sends one full snapshot: the one the run's
driver published last (kept in Redis beside the channel layer), or for a run without a
driver one built from the database (``service.snapshot``; this process opens no
ZooKeeper session). After that it relays every message the run's driver publishes (one
per balance-loop tick).

Every message, in both directions, is a JSON object with a ``type`` field, and each
type has its own handler. The role is checked again, per message, at most every
``ROLE_RECHECK_S`` seconds, so a user whose role is taken away stops receiving without
one database query per viewer per tick.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal, TypedDict

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orchestrator import service
from webapp.console.roles import has_role

log = logging.getLogger(__name__)

ROLE_RECHECK_S = 30.0
# Viewers connecting together (a page reloaded by many, a reconnect storm after a
# restart) get the tick relayed a moment ago, or share one snapshot read, instead of
# reading Redis and the database once each.
SNAPSHOT_REUSE_S = 2.0
# Close codes (4000-4999 are the application's): the page stops retrying on these.
CLOSE_FORBIDDEN = 4403
CLOSE_NO_RUN = 4404


class Pong(TypedDict):
    type: Literal["pong"]
    time_ms: float


class ErrorMessage(TypedDict):
    type: Literal["error"]
    detail: str


# channels has no type information (pyproject: ignore_missing_imports), so the base is Any.
class RunConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    run_id: int
    group: str
    role_checked_at: float

    # -- lifecycle ------------------------------------------------------------------

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = ""
        user = self.scope.get("user")
        # One trip to the database thread: a reconnect storm queues there.
        allowed = user is not None and await database_sync_to_async(_may_watch)(user, self.run_id)
        if not allowed:
            log.info("run %s: websocket refused for %s", self.run_id, user or "anonymous")
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.role_checked_at = time.monotonic()
        self.group = service.live_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def still_allowed(self) -> bool:
        if time.monotonic() - self.role_checked_at < ROLE_RECHECK_S:
            return True
        user = self.scope["user"]
        if not await database_sync_to_async(_still_viewer)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        self.role_checked_at = time.monotonic()
        return True

    # -- from the run's group (the driver, through orchestrator/run/publisher.py) -------

    async def run_message(self, event: dict[str, Any]) -> None:
        """One tick of the run, relayed: a ``snapshot`` (or any later type), encoded once
        per process for all its viewers, its events trimmed to the new ones."""
        if await self.still_allowed():
            await self.send(text_data=_tick_text(self.run_id, event["message"]))

    # -- from the browser ---------------------------------------------------------

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        handler = self.CLIENT_HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            await self.send_json(
                ErrorMessage(type="error", detail=f"unknown message type {kind!r}")
            )
            return
        if await self.still_allowed():
            await handler(self, content)

    async def on_ping(self, content: dict[str, Any]) -> None:
        await self.send_json(Pong(type="pong", time_ms=time.time() * 1000))

    async def on_resync(self, content: dict[str, Any]) -> None:
        await self.send_snapshot()

    CLIENT_HANDLERS = {"ping": on_ping, "resync": on_resync}

    async def send_snapshot(self) -> None:
        recent = _last_tick.get(self.run_id)
        if recent is not None and time.monotonic() - recent[0] < SNAPSHOT_REUSE_S:
            # The tick this process relayed a moment ago is the run as it is now.
            await self.send_json(recent[1])
            return
        try:
            snap = await database_sync_to_async(_recent_snapshot)(self.run_id)
        except Exception:  # the database may be out of reach; the page shows why
            log.warning("run %s: snapshot failed", self.run_id, exc_info=True)
            await self.send_json(
                ErrorMessage(type="error", detail="the run's state could not be read; retrying")
            )
            return
        await self.send_json(snap)


_snapshots: dict[int, tuple[float, Any]] = {}
# Per run: the last tick's key and text, and the newest event id relayed so far.
_encoded: dict[int, tuple[Any, str]] = {}
_last_tick: dict[int, tuple[float, dict[str, Any]]] = {}
_newest_event: dict[int, int] = {}
MAX_RUNS_CACHED = 256


def _tick_text(run_id: int, message: dict[str, Any]) -> str:
    """``message`` as JSON text, encoded once for every viewer of the run in this process.

    A snapshot carries the run's recent events every tick; viewers already have those
    of earlier ticks (from their snapshot on connect, or earlier ticks), so a relayed
    tick keeps only the events newer than the previous tick's. Pages merge events by id.
    """
    key = message.get("time") or id(message)
    cached = _encoded.get(run_id)
    if cached is not None and cached[0] == key:
        return cached[1]
    if len(_encoded) > MAX_RUNS_CACHED:
        _encoded.clear()
        _newest_event.clear()
        _last_tick.clear()
    if message.get("type") == "snapshot":
        _last_tick[run_id] = (time.monotonic(), message)
    events = message.get("events")
    if message.get("type") == "snapshot" and isinstance(events, list):
        newest = _newest_event.get(run_id)
        ids = [e["id"] for e in events if isinstance(e, dict) and isinstance(e.get("id"), int)]
        if newest is not None:
            message = {**message, "events": [e for e in events if e.get("id", 0) > newest]}
        _newest_event[run_id] = max([*ids, newest or 0])
    text = json.dumps(message)
    _encoded[run_id] = (key, text)
    return text


def _recent_snapshot(run_id: int) -> Any:
    """The run's snapshot, read at most once per ``SNAPSHOT_REUSE_S`` in this process."""
    now = time.monotonic()
    cached = _snapshots.get(run_id)
    if cached is not None and now - cached[0] < SNAPSHOT_REUSE_S:
        return cached[1]
    snap = service.snapshot(run_id)
    for old in [k for k, (t, _) in _snapshots.items() if now - t >= SNAPSHOT_REUSE_S]:
        del _snapshots[old]
    _snapshots[run_id] = (now, snap)
    return snap


def _may_watch(user: Any, run_id: int) -> bool:
    """A viewer (at least), and the run exists."""
    if not has_role(user, "viewer"):
        return False
    try:
        service.get_run(run_id)
    except service.RunNotFound:
        return False
    return True


def _still_viewer(user: Any) -> bool:
    user.refresh_from_db()
    return has_role(user, "viewer")
