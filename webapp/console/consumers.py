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
type has its own handler.

A socket lives no longer than its user's access. Each socket also joins a group of its
session and one of its user (``session_group``, ``user_group``): logging out
(Django's ``user_logged_out``) closes every socket of that session with
``CLOSE_LOGGED_OUT``; a user deactivated, deleted, or left without the viewer role (a
group taken away, on either side of the relation) has every socket closed with
``CLOSE_FORBIDDEN``, once the change is committed. Should such a message be lost (the
channel layer down at that moment), the access is checked again from the database, per
message, at most every ``ROLE_RECHECK_S`` seconds: the user as stored now (active, with
the viewer role) and the session still there, so a socket outlives a revoked access by
at most that long while anything reaches it, without one database query per viewer per
tick.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from importlib import import_module
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete
from django.dispatch import receiver
from django.http import HttpRequest

from orchestrator import service
from webapp.console.roles import has_role

log = logging.getLogger(__name__)

ROLE_RECHECK_S = 30.0
# Viewers connecting together (a page reloaded by many, a reconnect storm after a
# restart) get the tick relayed a moment ago, or share one snapshot read, instead of
# reading Redis and the database once each.
SNAPSHOT_REUSE_S = 2.0
# Close codes (4000-4999 are the application's): the page stops retrying on these.
CLOSE_LOGGED_OUT = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NO_RUN = 4404


class Pong(TypedDict):
    type: Literal["pong"]
    time_ms: float


class ErrorMessage(TypedDict):
    type: Literal["error"]
    detail: str


class AccessEnded(TypedDict):
    """What the channel layer carries to a user's or a session's sockets."""

    type: Literal["access.ended"]
    code: int


def session_group(session_key: str) -> str:
    """The group of one session's sockets, named by a digest of its key (the key is
    the session's secret; group names are kept in Redis)."""
    digest = hashlib.sha256(session_key.encode()).hexdigest()[:32]
    return f"bpconsole.session.{digest}"


def user_group(user_id: int) -> str:
    return f"bpconsole.user.{user_id}"


def close_sockets(group: str, code: int) -> None:
    """Close every socket of ``group`` with ``code``. From synchronous code."""
    try:
        async_to_sync(get_channel_layer().group_send)(
            group, AccessEnded(type="access.ended", code=code)
        )
    except Exception:  # the layer is down: the check on each message closes them later
        log.warning("could not tell %s to close", group, exc_info=True)


def recheck_users(user_ids: Iterable[int]) -> None:
    """Once the current transaction (if any) commits, close the sockets of each of these
    users who may no longer watch: gone, inactive, or without the viewer role."""
    ids = sorted(set(user_ids))
    if not ids:
        return

    def check() -> None:
        watching = {
            user.pk
            for user in User.objects.filter(pk__in=ids, is_active=True)
            if has_role(user, "viewer")
        }
        for user_id in ids:
            if user_id not in watching:
                close_sockets(user_group(user_id), CLOSE_FORBIDDEN)

    transaction.on_commit(check)


@receiver(user_logged_out)
def _logged_out(sender: Any, request: HttpRequest | None, **kwargs: Any) -> None:
    # Sent before the session is flushed: its key still names the sockets to close.
    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        close_sockets(session_group(key), CLOSE_LOGGED_OUT)


@receiver(post_save, sender=User)
@receiver(post_delete, sender=User)
def _user_changed(sender: Any, instance: User, **kwargs: Any) -> None:
    if not kwargs.get("created"):  # a user just created has no socket yet
        recheck_users([instance.pk])


@receiver(m2m_changed, sender=User.groups.through)
def _groups_changed(
    sender: Any,
    instance: User | Group,
    action: str,
    reverse: bool,
    pk_set: set[int] | None,
    **kwargs: Any,
) -> None:
    if isinstance(instance, User):  # user.groups.remove(...), .clear(), .set(...)
        if action in ("post_remove", "post_clear"):
            recheck_users([instance.pk])
    elif action == "post_remove":  # group.user_set.remove(...)
        recheck_users(pk_set or ())
    elif action == "pre_clear":  # group.user_set.clear(): checked after it, on commit
        recheck_users(instance.user_set.values_list("pk", flat=True))


@receiver(pre_delete, sender=Group)
def _group_deleted(sender: Any, instance: Group, **kwargs: Any) -> None:
    recheck_users(instance.user_set.values_list("pk", flat=True))


# channels has no type information (pyproject: ignore_missing_imports), so the base is Any.
class RunConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    run_id: int
    group: str
    access_groups: tuple[str, ...]
    role_checked_at: float

    # -- lifecycle ------------------------------------------------------------------

    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = ""
        self.access_groups = ()
        user = self.scope.get("user")
        session_key = self._session_key()
        # One trip to the database thread: a reconnect storm queues there.
        allowed = (
            user is not None
            and session_key is not None
            and await database_sync_to_async(_may_watch)(user, self.run_id)
        )
        if not allowed or session_key is None:
            log.info("run %s: websocket refused for %s", self.run_id, user or "anonymous")
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.role_checked_at = time.monotonic()
        # The access groups first: a logout or a revocation from now on reaches this socket.
        self.access_groups = (session_group(session_key), user_group(user.pk))
        for group in self.access_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.group = service.live_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    def _session_key(self) -> str | None:
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        return key if isinstance(key, str) and key else None

    async def disconnect(self, code: int) -> None:
        for group in (*self.access_groups, self.group):
            if group:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def still_allowed(self) -> bool:
        if time.monotonic() - self.role_checked_at < ROLE_RECHECK_S:
            return True
        code = await database_sync_to_async(_access_ended)(
            self.scope["user"].pk, self._session_key() or ""
        )
        if code is not None:
            await self.close(code=code)
            return False
        self.role_checked_at = time.monotonic()
        return True

    # -- from the console (close_sockets: a logout, a user deactivated or demoted) -------

    async def access_ended(self, event: AccessEnded) -> None:
        log.info("run %s: websocket closed (%s)", self.run_id, event["code"])
        await self.close(code=event["code"])

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


def _access_ended(user_id: int, session_key: str) -> int | None:
    """The close code for a socket whose access ended, from the database as it is now:
    its session gone (logged out), its user gone, inactive or without the viewer role;
    None while it may watch."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not session_key or not store().exists(session_key):
        return CLOSE_LOGGED_OUT
    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None or not has_role(user, "viewer"):
        return CLOSE_FORBIDDEN
    return None
