"""The run's websocket: who may connect, the snapshot on connect, relayed ticks, typed
messages. Through the whole ASGI application, so the origin check of asgi.py is on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from kazoo.client import KazooClient

from orchestrator import service
from orchestrator.models import Run
from orchestrator.run.publisher import publish
from orchestrator.zk.control_plane import ControlPlane
from tests.webapp.console.factories import client_for, make_run, make_user
from webapp.asgi import application
from webapp.console import consumers
from webapp.console.consumers import CLOSE_FORBIDDEN, CLOSE_LOGGED_OUT

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GOOD_ORIGIN = b"http://127.0.0.1:8000"


def session_cookie(name: str, role: str | None) -> bytes:
    client = Client()
    client.force_login(make_user(name, role))
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def communicator(run_id: int, cookie: bytes | None, origin: bytes | None = GOOD_ORIGIN) -> Any:
    headers = [(b"host", b"127.0.0.1:8000")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)


def connects(run_id: int, cookie: bytes | None, origin: bytes | None = GOOD_ORIGIN) -> bool:
    async def attempt() -> bool:
        ws = communicator(run_id, cookie, origin)
        connected, _ = await ws.connect()
        await ws.disconnect()
        return connected

    return asyncio.run(attempt())


def test_anonymous_and_role_less_users_are_refused_on_connect(services) -> None:
    run = make_run()
    assert not connects(run.pk, None)
    assert not connects(run.pk, session_cookie("nobody", None))


def test_a_foreign_origin_is_refused_even_for_a_viewer(services) -> None:
    run = make_run()
    cookie = session_cookie("vera", "viewer")
    assert not connects(run.pk, cookie, origin=b"http://evil.example")
    assert connects(run.pk, cookie)


def test_the_origin_must_match_in_scheme_host_and_port(services) -> None:
    # Given a viewer's session, and the console served at http://127.0.0.1:8000
    run = make_run()
    cookie = session_cookie("vera", "viewer")
    assert connects(run.pk, cookie, origin=b"http://127.0.0.1:8000")
    # Then a page of the same host on another port or scheme may not open the websocket
    assert not connects(run.pk, cookie, origin=b"http://127.0.0.1:9999")
    assert not connects(run.pk, cookie, origin=b"https://127.0.0.1:8000")
    assert not connects(run.pk, cookie, origin=b"http://127.0.0.1")
    # nor another host, a look-alike, an opaque origin or a malformed one
    assert not connects(run.pk, cookie, origin=b"http://evil.example")
    assert not connects(run.pk, cookie, origin=b"http://127.0.0.1:8000.evil.example")
    assert not connects(run.pk, cookie, origin=b"http://127.0.0.1:8000@evil.example")
    assert not connects(run.pk, cookie, origin=b"null")
    # and a request without Origin (browsers always send one on websockets) is refused
    assert not connects(run.pk, cookie, origin=None)


def test_an_unknown_run_is_refused(services) -> None:
    assert not connects(424242, session_cookie("vera", "viewer"))


def test_a_viewer_gets_a_snapshot_then_every_tick_and_typed_replies(services) -> None:
    run = make_run()
    cookie = session_cookie("vera", "viewer")

    async def scenario() -> list[dict[str, Any]]:
        ws = communicator(run.pk, cookie)
        connected, _ = await ws.connect()
        assert connected
        received = [await ws.receive_json_from(timeout=10)]
        # When the driver publishes a tick to the run's group
        layer = get_channel_layer()
        group = service.live_group(run.pk)
        for time, ids in (("t1", [1, 2]), ("t2", [1, 2, 3])):
            tick = {
                "type": "snapshot",
                "time": time,
                "run": {"id": run.pk},
                "nodes": [],
                "links": [],
                "events": [{"id": i} for i in reversed(ids)],
            }
            await layer.group_send(group, {"type": "run.message", "message": tick})
            received.append(await ws.receive_json_from(timeout=10))
        await ws.send_json_to({"type": "ping"})
        received.append(await ws.receive_json_from(timeout=10))
        await ws.send_json_to({"type": "launch-missiles"})
        received.append(await ws.receive_json_from(timeout=10))
        await ws.send_json_to({"type": "resync"})
        received.append(await ws.receive_json_from(timeout=10))
        await ws.disconnect()
        return received

    first, tick1, tick2, pong, error, resync = asyncio.run(scenario())
    # Then: a full snapshot on connect, the tick relayed as it is, one reply per type
    assert first["type"] == "snapshot"
    assert first["run"]["id"] == run.pk
    assert [n["name"] for n in first["nodes"]] == ["source", "task1", "task2", "task3", "output"]
    assert tick1["time"] == "t1"
    assert [e["id"] for e in tick1["events"]] == [2, 1]
    # a later tick carries only the events the viewer has not had yet
    assert tick2["time"] == "t2"
    assert [e["id"] for e in tick2["events"]] == [3]
    assert pong["type"] == "pong"
    assert error == {"type": "error", "detail": "unknown message type 'launch-missiles'"}
    assert resync["type"] == "snapshot"


def refuse_zookeeper(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the web process opened a ZooKeeper session")


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as resources:
        yield resources


def test_a_late_viewer_gets_the_drivers_last_snapshot_without_zookeeper(
    services, monkeypatch, stack: contextlib.ExitStack
) -> None:
    # Given a running run whose driver (this test, holding its lock, so that no
    # watchdog starts a real one) published a tick (kept beside the channel layer)
    run = make_run()
    control = stack.enter_context(ControlPlane.connect(settings.ZK_HOSTS))
    lock = control.driver_lock(str(run.pk), f"{socket.gethostname()}:{os.getpid()}:test")
    assert lock.acquire(timeout=10)
    stack.callback(lock.release)
    Run.objects.filter(pk=run.pk).update(status="running")
    tick = service.snapshot(run.pk)
    tick = {
        **tick,
        "time": "kept-tick",
        "nodes": [{**n, "state": {"level": 0.42, "flagged": True}} for n in tick["nodes"]],
    }
    publish(run.pk, tick)
    # and no ZooKeeper session can be opened from here
    monkeypatch.setattr(KazooClient, "start", refuse_zookeeper)
    cookie = session_cookie("vera", "viewer")

    async def first_message() -> dict[str, Any]:
        ws = communicator(run.pk, cookie)
        connected, _ = await ws.connect()
        assert connected
        message = await ws.receive_json_from(timeout=10)
        await ws.disconnect()
        return message

    # When a viewer connects mid-run, and when the API is asked
    first = asyncio.run(first_message())
    client, _ = client_for("victor", "viewer")
    from_api = client.get(f"/api/runs/{run.pk}/snapshot/").json()

    # Then both show the driver's last tick as it was published
    assert first == from_api == json.loads(json.dumps(tick))
    assert first["nodes"][1]["state"] == {"level": 0.42, "flagged": True}


def test_a_run_without_a_driver_is_shown_from_the_database_alone(services, monkeypatch) -> None:
    # Given a run whose driver's last kept tick is from before the run ended, and one
    # never driven
    run, pending = make_run(), make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    publish(run.pk, {**service.snapshot(run.pk), "time": "stale-tick"})
    Run.objects.filter(pk=run.pk).update(status="completed", finished_at=timezone.now())
    monkeypatch.setattr(KazooClient, "start", refuse_zookeeper)

    # When a viewer asks for the run's state
    shown = service.snapshot(run.pk)

    # Then it is built from PostgreSQL: the run as it ended, no live node states
    assert shown["time"] != "stale-tick"
    assert shown["final"] is True
    assert shown["run"]["status"] == "completed"
    assert [n["state"] for n in shown["nodes"]] == [{}] * 5
    # and the run never driven likewise
    assert service.snapshot(pending.pk)["run"]["status"] == "pending"


# -- a socket lives no longer than its user's access ----------------------------------


def logged_in(user: User) -> tuple[Client, bytes]:
    """A new session of ``user``: its client and its cookie."""
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}".encode()


async def opened(run_id: int, cookie: bytes) -> Any:
    ws = communicator(run_id, cookie)
    connected, _ = await ws.connect()
    assert connected, "the viewer's websocket was refused"
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot"
    return ws


async def closed_with(ws: Any) -> int:
    """The close code the socket is closed with, within a few seconds."""
    message = await ws.receive_output(timeout=10)
    assert message["type"] == "websocket.close", message
    return int(message["code"])


async def still_open(ws: Any) -> bool:
    await ws.send_json_to({"type": "ping"})
    return (await ws.receive_json_from(timeout=10))["type"] == "pong"


def test_logging_out_closes_every_socket_of_that_session_and_only_those(services) -> None:
    run = make_run()
    # Given a viewer watching the run from two sessions (two browsers)
    vera = make_user("vera", "viewer")
    first, first_cookie = logged_in(vera)
    _, second_cookie = logged_in(vera)

    async def scenario() -> tuple[int, int, bool]:
        in_first = [await opened(run.pk, first_cookie), await opened(run.pk, first_cookie)]
        in_second = await opened(run.pk, second_cookie)
        # When the viewer logs out in the first browser
        response = await database_sync_to_async(first.post)("/logout/")
        assert response.status_code == 302
        # Then both of its sockets are closed as logged out; the other session's is not
        codes = [await closed_with(ws) for ws in in_first]
        other = await still_open(in_second)
        await in_second.disconnect()
        return codes[0], codes[1], other

    assert asyncio.run(scenario()) == (CLOSE_LOGGED_OUT, CLOSE_LOGGED_OUT, True)


def deactivate(name: str) -> None:
    user = User.objects.get(username=name)
    user.is_active = False
    user.save()


def take_the_role_away(name: str) -> None:
    User.objects.get(username=name).groups.clear()


def leave_the_group(name: str) -> None:
    Group.objects.get(name="viewer").user_set.remove(User.objects.get(username=name))


@pytest.mark.parametrize("revoke", [deactivate, take_the_role_away, leave_the_group])
def test_a_user_deactivated_or_left_without_the_role_has_every_socket_closed(
    services, revoke: Any
) -> None:
    run = make_run()
    _, cookie = logged_in(make_user("vera", "viewer"))
    _, bystander = logged_in(make_user("victor", "viewer"))

    async def scenario() -> tuple[list[int], bool]:
        sockets = [await opened(run.pk, cookie), await opened(run.pk, cookie)]
        others = await opened(run.pk, bystander)
        # When an administrator deactivates vera or takes her role away
        await database_sync_to_async(revoke)("vera")
        # Then each of her sockets is closed as forbidden, and no one else's
        codes = [await closed_with(ws) for ws in sockets]
        other = await still_open(others)
        await others.disconnect()
        return codes, other

    assert asyncio.run(scenario()) == ([CLOSE_FORBIDDEN, CLOSE_FORBIDDEN], True)


def deactivate_quietly(name: str) -> None:
    """Deactivated without Django's signals (a raw UPDATE): no message is sent."""
    User.objects.filter(username=name).update(is_active=False)


def flush_the_session_quietly(cookie: bytes) -> None:
    key = cookie.decode().removeprefix("sessionid=")
    import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).delete()


def test_the_check_on_each_message_reads_the_user_and_session_as_they_are_now(
    services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an access check on every message, and no close message ever sent
    monkeypatch.setattr(consumers, "ROLE_RECHECK_S", 0.0)
    monkeypatch.setattr(consumers, "close_sockets", lambda group, code: None)
    run = make_run()
    _, vera = logged_in(make_user("vera", "viewer"))
    _, victor = logged_in(make_user("victor", "viewer"))

    async def scenario() -> tuple[int, int]:
        deactivated, logged_out = await opened(run.pk, vera), await opened(run.pk, victor)
        assert await still_open(deactivated)
        # When one user is deactivated and the other's session is gone, behind the
        # console's back
        await database_sync_to_async(deactivate_quietly)("vera")
        await database_sync_to_async(flush_the_session_quietly)(victor)
        # Then the next message each socket gets closes it, saying why
        for ws in (deactivated, logged_out):
            await ws.send_json_to({"type": "ping"})
        return await closed_with(deactivated), await closed_with(logged_out)

    assert asyncio.run(scenario()) == (CLOSE_FORBIDDEN, CLOSE_LOGGED_OUT)
