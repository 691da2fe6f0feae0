"""The run's websocket: who may connect, the snapshot on connect, relayed ticks, typed
messages. Through the whole ASGI application, so the origin check of asgi.py is on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.utils import timezone
from kazoo.client import KazooClient

from orchestrator import service
from orchestrator.models import Run
from orchestrator.run.publisher import publish
from orchestrator.zk.control_plane import ControlPlane
from tests.webapp.console.factories import client_for, make_run, make_user
from webapp.asgi import application

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
