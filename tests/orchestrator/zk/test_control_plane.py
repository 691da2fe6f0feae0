"""The ZooKeeper control plane against the real embedded ZooKeeper.

Every test works under its own root so tests never see each other's znodes. Watches are
checked from a second client, as the upstream (another process) would see them; session
trouble is made for real: a client stopped, a session expired by a second client that
closes it, a connection cut by a TCP proxy in front of ZooKeeper.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from kazoo.exceptions import LockTimeout, NoNodeError

from orchestrator.services.credentials import ZkAddress, zk_client
from orchestrator.services.launcher import Endpoints
from orchestrator.services.spark_pool import PoolState
from orchestrator.zk.control_plane import (
    ControlPlane,
    StaleEpochError,
    WorkerNameTakenError,
    decode,
    default_root,
    encode,
)

pytestmark = pytest.mark.integration

RUN = "run-1"
WAIT_S = 10.0


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def next_matching(events: queue.Queue[Any], predicate: Callable[[Any], bool]) -> Any:
    """The first event satisfying ``predicate`` within the bounded wait, else fail."""
    deadline = time.monotonic() + WAIT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail("the watch callback never saw the expected change")
        try:
            event = events.get(timeout=remaining)
        except queue.Empty:
            continue
        if predicate(event):
            return event


@pytest.fixture
def root(services: Endpoints) -> Iterator[str]:
    root = f"/test-{uuid.uuid4().hex}"
    yield root
    cleaner = zk_client(services.zk_hosts)
    cleaner.start(WAIT_S)
    try:
        with contextlib.suppress(NoNodeError):
            cleaner.delete(root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()


@pytest.fixture
def connect(services: Endpoints, root: str) -> Iterator[Callable[..., ControlPlane]]:
    """Open more control planes (each its own client and session) on the test root."""
    opened: list[ControlPlane] = []

    def open_plane(timeout: float = WAIT_S, hosts: str | None = None) -> ControlPlane:
        plane = ControlPlane.connect(hosts or services.zk_hosts, root, timeout=timeout)
        opened.append(plane)
        return plane

    yield open_plane
    for plane in opened:
        plane.close()


@pytest.fixture
def plane(connect: Callable[..., ControlPlane]) -> ControlPlane:
    return connect()


# -- construction -------------------------------------------------------------------


def test_root_defaults_to_the_setting_and_names_are_checked(services: Endpoints) -> None:
    assert default_root() == settings.ZK_ROOT
    client = zk_client(services.zk_hosts)
    assert ControlPlane(client).root == settings.ZK_ROOT.rstrip("/")
    for bad_root in ("relative", "/", "//x"):
        with pytest.raises(ValueError, match="root"):
            ControlPlane(client, bad_root)
    plane = ControlPlane(client, "/somewhere/")
    assert plane.run_path("r") == "/somewhere/runs/r"
    assert plane.adjust_path("r", 3) == "/somewhere/runs/r/adjust/3"
    for bad_name in ("", ".", "..", "a/b"):
        with pytest.raises(ValueError, match="name"):
            plane.run_path(bad_name)


def test_json_is_compact_and_deterministic() -> None:
    assert encode({"b": 1, "a": [1.5, None]}) == b'{"a":[1.5,null],"b":1}'
    assert decode(encode({"x": {"y": 2}}), "here") == {"x": {"y": 2}}


def test_connect_as_context_manager_closes_its_client(services: Endpoints, root: str) -> None:
    with ControlPlane.connect(services.zk_hosts, root) as plane:
        assert plane.client.connected
        assert plane.session.is_connected
    assert not plane.client.connected


# -- flags --------------------------------------------------------------------------


def test_flags_set_and_clear_are_idempotent(plane: ControlPlane) -> None:
    assert plane.flags(RUN) == set()
    assert plane.set_flag(RUN, "n1") is True
    assert plane.set_flag(RUN, "n1") is False
    assert plane.set_flag(RUN, "n2") is True
    assert plane.flags(RUN) == {"n1", "n2"}
    assert plane.clear_flag(RUN, "n1") is True
    assert plane.clear_flag(RUN, "n1") is False
    assert plane.clear_flag(RUN, "never") is False
    assert plane.flags(RUN) == {"n2"}
    assert plane.client.exists(f"{plane.run_path(RUN)}/flags/n2") is not None


def test_watch_flags_sees_another_clients_changes(connect: Callable[..., ControlPlane]) -> None:
    driver, upstream = connect(), connect()
    driver.set_flag(RUN, "before")
    seen: queue.Queue[set[str]] = queue.Queue()
    subscription = upstream.watch_flags(RUN, seen.put)
    assert seen.get(timeout=WAIT_S) == {"before"}  # called at once with the current flags

    driver.set_flag(RUN, "n1")
    next_matching(seen, lambda flags: flags == {"before", "n1"})
    driver.clear_flag(RUN, "before")
    next_matching(seen, lambda flags: flags == {"n1"})

    subscription.cancel()
    driver.set_flag(RUN, "after-cancel")
    driver.clear_flag(RUN, "n1")
    time.sleep(0.3)
    assert all("after-cancel" not in flags for flags in list(seen.queue))


# -- node state ---------------------------------------------------------------------


def _state(i: int, tick: int) -> dict[str, Any]:
    return {
        "level": round(0.01 * i + 0.001 * tick, 6),
        "high_water": 0.8,
        "low_water": 0.3,
        "rate_coefficient": 1.0 - 0.1 * (tick % 5),
        "speed": 100.0 + i,
        "origin_speed": 120.0,
        "in_backpressure": i % 3 == 0,
        "tick": tick,
    }


def test_states_of_50_nodes_round_trip_and_update(connect: Callable[..., ControlPlane]) -> None:
    writer, reader = connect(), connect()
    assert reader.read_states(RUN) == {}
    for tick in range(3):
        states = {f"node-{i:02d}": _state(i, tick) for i in range(50)}
        writer.write_states(RUN, states)
        assert reader.read_states(RUN) == states
    # A batch mixing existing nodes and a new one (the fallback create path).
    writer.write_states(RUN, {"node-00": _state(0, 9), "node-new": _state(99, 9)})
    got = reader.read_states(RUN)
    assert len(got) == 51
    assert got["node-00"]["tick"] == 9
    assert got["node-new"] == _state(99, 9)
    writer.write_state(RUN, "node-01", {"level": 0.5})
    assert reader.read_state(RUN, "node-01") == {"level": 0.5}
    assert reader.read_state(RUN, "missing") is None


def test_state_batches_larger_than_one_transaction(plane: ControlPlane) -> None:
    states = {f"n{i}": {"level": i / 450} for i in range(450)}
    plane.write_states(RUN, states)
    plane.write_states(RUN, states)
    assert plane.read_states(RUN) == states


# -- routes -------------------------------------------------------------------------


def test_routes_are_fenced_by_epoch(plane: ControlPlane) -> None:
    assert plane.read_routes(RUN, "up") is None
    plane.write_routes(RUN, "up", {"shares": {"a": 0.5, "b": 0.5}}, epoch=1)
    assert plane.read_routes(RUN, "up") == ({"shares": {"a": 0.5, "b": 0.5}}, 1)

    with pytest.raises(StaleEpochError) as refused:
        plane.write_routes(RUN, "up", {"shares": {"a": 1.0}}, epoch=0)
    assert (refused.value.epoch, refused.value.newer) == (0, 1)
    assert plane.read_routes(RUN, "up") == ({"shares": {"a": 0.5, "b": 0.5}}, 1)

    plane.write_routes(RUN, "up", {"shares": {"a": 0.6, "b": 0.4}}, epoch=1)  # equal: ok
    plane.write_routes(RUN, "up", {"shares": {"a": 0.7, "b": 0.3}, "overrides": {}}, epoch=4)
    assert plane.read_routes(RUN, "up") == ({"shares": {"a": 0.7, "b": 0.3}, "overrides": {}}, 4)

    # Other nodes' routes are fenced by the run's epoch too: a paused old owner holding
    # epoch 2 cannot write after a new owner took epoch 3, even where it wrote nothing yet.
    for _ in range(3):
        plane.next_epoch(RUN)
    with pytest.raises(StaleEpochError):
        plane.write_routes(RUN, "other", {"shares": {}}, epoch=2)
    assert plane.read_routes(RUN, "other") is None
    plane.write_routes(RUN, "other", {"shares": {"x": 1.0}}, epoch=3)
    assert plane.read_routes(RUN, "other") == ({"shares": {"x": 1.0}}, 3)


def test_routes_write_cannot_overwrite_a_newer_one_that_slipped_in(
    connect: Callable[..., ControlPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving a plain read-check-write loses: A reads epoch 1, B writes epoch 7,
    A writes epoch 5. The versioned set makes A re-read and refuse. (A has not written
    this node before, so it takes the read-check-write path, not the one-trip write.)"""
    old_owner, new_owner = connect(), connect()
    connect().write_routes(RUN, "up", {"owner": "old"}, epoch=1)
    routes_path = f"{old_owner.run_path(RUN)}/routes/up"
    real_get = old_owner.client.get
    slipped = threading.Event()

    def get_then_let_b_write(path: str, *args: Any, **kwargs: Any) -> Any:
        answer = real_get(path, *args, **kwargs)
        if path == routes_path and not slipped.is_set():
            slipped.set()
            new_owner.write_routes(RUN, "up", {"owner": "new"}, epoch=7)
        return answer

    monkeypatch.setattr(old_owner.client, "get", get_then_let_b_write)
    with pytest.raises(StaleEpochError) as refused:
        old_owner.write_routes(RUN, "up", {"owner": "old"}, epoch=5)
    assert slipped.is_set()
    assert refused.value.newer == 7
    assert new_owner.read_routes(RUN, "up") == ({"owner": "new"}, 7)


def test_one_trip_write_is_refused_after_a_newer_write(
    connect: Callable[..., ControlPlane],
) -> None:
    """A writer whose cached versions went stale (another owner wrote since) must not
    overwrite: its one-round-trip write fails the version check and the full path refuses."""
    old_owner, new_owner = connect(), connect()
    old_owner.write_routes(RUN, "up", {"owner": "old"}, epoch=1)
    old_owner.write_routes(RUN, "up", {"owner": "old", "n": 2}, epoch=1)  # cached path
    new_owner.write_routes(RUN, "up", {"owner": "new"}, epoch=3)
    with pytest.raises(StaleEpochError):
        old_owner.write_routes(RUN, "up", {"owner": "old", "n": 3}, epoch=1)
    assert old_owner.read_routes(RUN, "up") == ({"owner": "new"}, 3)


def test_concurrent_routes_writers_leave_the_highest_epoch(
    connect: Callable[..., ControlPlane],
) -> None:
    planes = [connect(), connect()]
    epochs = [i * 17 % 41 for i in range(1, 41)]  # 1..40 in a scrambled order
    assert sorted(epochs) == list(range(1, 41))
    outcomes: dict[int, str] = {}

    def write(epoch: int) -> None:
        try:
            planes[epoch % 2].write_routes(RUN, "up", {"by": epoch}, epoch=epoch)
            outcomes[epoch] = "written"
        except StaleEpochError:
            outcomes[epoch] = "refused"

    threads = [threading.Thread(target=write, args=(e,)) for e in epochs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 3)
    assert len(outcomes) == 40
    assert outcomes[40] == "written"
    assert planes[0].read_routes(RUN, "up") == ({"by": 40}, 40)


def test_watch_routes_follows_writes(connect: Callable[..., ControlPlane]) -> None:
    driver, upstream = connect(), connect()
    seen: queue.Queue[tuple[dict[str, Any], int] | None] = queue.Queue()
    upstream.watch_routes(RUN, "up", seen.put)
    assert seen.get(timeout=WAIT_S) is None  # nothing written yet
    driver.write_routes(RUN, "up", {"shares": {"a": 1.0}}, epoch=2)
    assert next_matching(seen, lambda v: v is not None) == ({"shares": {"a": 1.0}}, 2)
    driver.write_routes(RUN, "up", {"shares": {"a": 0.5, "b": 0.5}}, epoch=2)
    next_matching(seen, lambda v: v == ({"shares": {"a": 0.5, "b": 0.5}}, 2))


# -- stepwise signals and task states -----------------------------------------------


def test_signals_come_out_in_order_and_are_deleted(connect: Callable[..., ControlPlane]) -> None:
    sender, handler = connect(), connect()
    messages = [
        {"signal": "slow" if i % 2 == 0 else "restore", "target": f"t{i}", "origin": "t0"}
        for i in range(12)
    ]
    for message in messages:
        sender.put_signal(RUN, message)
    assert handler.pending_signals(RUN) == 12
    assert handler.take_signals(RUN, limit=5) == messages[:5]
    assert handler.pending_signals(RUN) == 7
    assert handler.take_signals(RUN, limit=100) == messages[5:]
    assert handler.take_signals(RUN) == []
    assert handler.client.get_children(f"{handler.run_path(RUN)}/taskmessage") == []
    with pytest.raises(ValueError, match="limit"):
        handler.take_signals(RUN, limit=0)


def test_concurrent_handlers_take_each_signal_once(connect: Callable[..., ControlPlane]) -> None:
    sender = connect()
    handlers = [connect(), connect()]
    for i in range(60):
        sender.put_signal(RUN, {"signal": "slow", "target": "t", "seq": i})
    taken: list[list[int]] = [[], []]

    def drain(k: int) -> None:
        while batch := handlers[k].take_signals(RUN, limit=4):
            taken[k].extend(m["seq"] for m in batch)

    threads = [threading.Thread(target=drain, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 3)
    assert sorted(taken[0] + taken[1]) == list(range(60))  # none lost, none twice
    for seqs in taken:
        assert seqs == sorted(seqs)  # each handler sees them in queue order


def test_watch_signals_wakes_a_handler(connect: Callable[..., ControlPlane]) -> None:
    sender, handler = connect(), connect()
    pending: queue.Queue[int] = queue.Queue()
    handler.watch_signals(RUN, pending.put)
    assert pending.get(timeout=WAIT_S) == 0
    sender.put_signal(RUN, {"signal": "slow", "target": "t1"})
    next_matching(pending, lambda n: n == 1)
    assert handler.take_signals(RUN) == [{"signal": "slow", "target": "t1"}]
    next_matching(pending, lambda n: n == 0)


def test_task_states_round_trip_and_watch(connect: Callable[..., ControlPlane]) -> None:
    target, neighbour = connect(), connect()
    seen: queue.Queue[dict[str, Any] | None] = queue.Queue()
    neighbour.watch_task_state(RUN, "t1", seen.put)
    assert seen.get(timeout=WAIT_S) is None
    state = {"speed": 80.0, "origin_speed": 100.0, "in_backpressure": True}
    target.write_task_state(RUN, "t1", state)
    target.write_task_state(RUN, "t2", {"speed": 100.0, "in_backpressure": False})
    assert next_matching(seen, lambda v: v is not None) == state
    assert neighbour.read_task_states(RUN) == {
        "t1": state,
        "t2": {"speed": 100.0, "in_backpressure": False},
    }
    target.write_task_state(RUN, "t1", {**state, "speed": 90.0})
    next_matching(seen, lambda v: v is not None and v["speed"] == 90.0)
    assert neighbour.read_task_state(RUN, "t1") == {**state, "speed": 90.0}


# -- driver lock and epoch ----------------------------------------------------------


def test_driver_lock_is_exclusive_and_freed_with_the_holders_session(
    connect: Callable[..., ControlPlane],
) -> None:
    first, second = connect(), connect()
    assert first.driver_holder(RUN) is None
    assert first.client.exists(f"{first.run_path(RUN)}/driver") is None  # asking made nothing

    lock_a = first.driver_lock(RUN, "host-a:1")
    assert lock_a.acquire(timeout=WAIT_S)
    assert second.driver_holder(RUN) == "host-a:1"
    lock_b = second.driver_lock(RUN, "host-b:2")
    assert lock_b.acquire(blocking=False) is False
    with pytest.raises(LockTimeout):
        lock_b.acquire(timeout=0.5)
    assert second.driver_holder(RUN) == "host-a:1"

    first.close()  # the holder's session ends: its lock znode goes with it
    assert lock_b.acquire(timeout=WAIT_S)
    assert second.driver_holder(RUN) == "host-b:2"
    lock_b.release()
    assert second.driver_holder(RUN) is None


def test_a_dead_holders_lock_is_broken_before_its_session_expires(
    connect: Callable[..., ControlPlane],
) -> None:
    # Given a driver lock whose holder's session is still open (its process just died)
    first, second = connect(), connect()
    assert first.driver_lock(RUN, "host-a:1:task").acquire(timeout=WAIT_S)
    # When another client breaks it, naming a different holder first
    assert second.break_driver_lock(RUN, "host-a:2:task") == 0
    assert second.driver_holder(RUN) == "host-a:1:task"
    assert second.break_driver_lock(RUN, "host-a:1:task") == 1
    # Then nobody holds it, and a new driver takes it at once
    assert second.driver_holder(RUN) is None
    lock = second.driver_lock(RUN, "host-b:3:task")
    assert lock.acquire(timeout=0.5)
    assert second.driver_holder(RUN) == "host-b:3:task"
    lock.release()


def test_breaking_the_lock_of_a_run_without_one_changes_nothing(plane: ControlPlane) -> None:
    assert plane.break_driver_lock("no-such-run", "host-a:1:task") == 0
    assert plane.client.exists(f"{plane.run_path('no-such-run')}/driver") is None


def test_next_epoch_is_atomic_under_concurrency(connect: Callable[..., ControlPlane]) -> None:
    planes = [connect(), connect()]
    assert planes[0].current_epoch(RUN) == 0
    got: list[int] = []
    got_lock = threading.Lock()

    def bump(k: int) -> None:
        for _ in range(20):
            value = planes[k % 2].next_epoch(RUN)
            with got_lock:
                got.append(value)

    threads = [threading.Thread(target=bump, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 3)
    assert sorted(got) == list(range(1, 81))  # every value handed out exactly once
    assert planes[1].current_epoch(RUN) == 80


# -- workers ------------------------------------------------------------------------


def test_workers_are_ephemeral(connect: Callable[..., ControlPlane]) -> None:
    console, worker = connect(), connect()
    names: queue.Queue[set[str]] = queue.Queue()
    console.watch_workers(names.put)
    assert names.get(timeout=WAIT_S) == set()
    info = {"host": "h1", "pid": 42, "queues": ["spark"], "started": "2024-01-01T00:00:00Z"}
    worker.register_worker("w1", info)
    next_matching(names, lambda n: n == {"w1"})
    assert console.live_workers() == {"w1": info}

    worker.register_worker("w1", {**info, "queues": ["spark", "control"]})  # same session
    assert console.live_workers()["w1"]["queues"] == ["spark", "control"]
    with pytest.raises(WorkerNameTakenError):
        console.register_worker("w1", info)

    worker.close()
    next_matching(names, lambda n: n == set())
    assert console.live_workers() == {}


def test_a_worker_started_again_takes_its_name_once_the_dead_session_lets_go(
    connect: Callable[..., ControlPlane],
) -> None:
    old, new = connect(), connect()
    old.register_worker("w1", {"pid": 1})
    # The new process waits while the old session still holds the name ...
    with pytest.raises(WorkerNameTakenError):
        new.register_worker_when_free("w1", {"pid": 2}, timeout_s=0.5)
    # ... and registers as soon as it lets go.
    registered = threading.Thread(
        target=new.register_worker_when_free, args=("w1", {"pid": 2}), kwargs={"timeout_s": WAIT_S}
    )
    registered.start()
    old.close()
    registered.join(WAIT_S + 1)
    assert not registered.is_alive(), "the new worker never registered"
    assert new.live_workers() == {"w1": {"pid": 2}}


def test_unregister_worker(plane: ControlPlane) -> None:
    plane.register_worker("w", {"host": "h"})
    assert plane.unregister_worker("w") is True
    assert plane.unregister_worker("w") is False
    assert plane.live_workers() == {}


def test_delete_run_removes_everything(plane: ControlPlane) -> None:
    plane.set_flag(RUN, "n")
    plane.write_state(RUN, "n", {"level": 0.1})
    plane.put_signal(RUN, {"signal": "slow", "target": "n"})
    plane.next_epoch(RUN)
    plane.client.ensure_path(plane.adjust_path(RUN, 1))
    assert plane.delete_run(RUN) is True
    assert plane.client.exists(plane.run_path(RUN)) is None
    assert plane.delete_run(RUN) is False
    assert plane.flags(RUN) == set()
    assert plane.current_epoch(RUN) == 0


# -- session state ------------------------------------------------------------------


def test_stopping_the_client_reports_lost(plane: ControlPlane) -> None:
    lost = threading.Event()
    plane.session.on_lost(lost.set)
    assert plane.session.is_connected
    plane.client.stop()
    assert lost.wait(WAIT_S)
    assert plane.session.is_lost
    assert not plane.session.wait_connected(0.05)


def test_expired_session_reports_lost_then_reconnects_and_reregisters(
    services: Endpoints, connect: Callable[..., ControlPlane]
) -> None:
    plane, observer = connect(), connect()
    lost, reconnected = threading.Event(), threading.Event()
    plane.session.on_lost(lost.set)
    plane.session.on_reconnected(reconnected.set)
    plane.register_worker("w1", {"host": "h"})
    lock = plane.driver_lock(RUN, "old-session")
    assert lock.acquire(timeout=WAIT_S)
    old_session = plane.client.client_id

    # Expire the session for real: a second client joins it and closes it.
    intruder = zk_client(services.zk_hosts, client_id=old_session)
    intruder.start(WAIT_S)
    intruder.stop()
    intruder.close()

    assert lost.wait(WAIT_S)
    assert reconnected.wait(WAIT_S)
    assert plane.session.wait_connected(WAIT_S)
    assert plane.client.client_id[0] != old_session[0]
    assert observer.driver_holder(RUN) is None  # the lock went with the old session
    assert lock.release() is True  # harmless after the loss; the lock can be taken again
    assert lock.acquire(timeout=WAIT_S)
    assert observer.driver_holder(RUN) == "old-session"
    assert wait_for(lambda: "w1" in observer.live_workers())  # registered again
    owner = plane.client.exists(f"{plane.root}/workers/w1").ephemeralOwner
    assert owner == plane.client.client_id[0]


class TcpProxy:
    """A TCP relay in front of ZooKeeper whose connections the test can cut."""

    def __init__(self, target: str) -> None:
        self.address = ZkAddress.parse(target)
        host, port = self.address.hosts.split(",", maxsplit=1)[0].rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.port = self.server.getsockname()[1]
        self.accepting = threading.Event()
        self.accepting.set()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def hosts(self) -> str:
        """The relay's connection string, with the target's ZooKeeper user."""
        return str(ZkAddress(f"127.0.0.1:{self.port}", self.address.user, self.address.password))

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.accepting.is_set():
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [conn, upstream]
            for source, sink in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every connection and refuse new ones until :meth:`resume`."""
        self.accepting.clear()
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def resume(self) -> None:
        self.accepting.set()

    def close(self) -> None:
        self.closed.set()
        self.cut()
        self.server.close()


def test_cut_connection_suspends_then_resumes_the_same_session(
    services: Endpoints, connect: Callable[..., ControlPlane]
) -> None:
    proxy = TcpProxy(services.zk_hosts)
    try:
        plane, observer = connect(hosts=proxy.hosts), connect()
        suspended, reconnected, lost = threading.Event(), threading.Event(), threading.Event()
        plane.session.on_suspended(suspended.set)
        plane.session.on_reconnected(reconnected.set)
        plane.session.on_lost(lost.set)
        plane.register_worker("w1", {"host": "h"})
        session = plane.client.client_id

        proxy.cut()
        assert suspended.wait(WAIT_S)
        assert plane.session.is_suspended
        assert not plane.session.wait_connected(0.3)  # a loop waiting here stays paused
        assert "w1" in observer.live_workers()  # the session outlives a short cut

        proxy.resume()
        assert reconnected.wait(WAIT_S)
        assert plane.session.is_connected
        assert not lost.is_set()
        assert plane.client.client_id == session
        plane.set_flag(RUN, "after")
        assert observer.flags(RUN) == {"after"}
    finally:
        proxy.close()


# -- the elastic Spark pool ----------------------------------------------------------


def test_the_spark_pool_znode_lives_exactly_as_long_as_the_pool_s_session(
    connect: Callable[..., ControlPlane],
) -> None:
    pool, driver = connect(), connect()
    path = f"{driver.root}/spark/pool"
    # A persistent spark/pool (another process's, from before) is not a live pool
    driver.client.create(path, encode({"base": 1, "maximum": 9, "extra": 5}), makepath=True)
    state = PoolState(base=1, maximum=3, extra=0)
    pool.write_spark_pool(state)
    assert driver.spark_pool() == state
    _, stat = driver.client.get(path)
    assert stat.ephemeralOwner == pool.client.client_id[0]
    # publishing the same state again writes nothing
    pool.write_spark_pool(state)
    assert driver.client.get(path)[1].version == stat.version
    pool.write_spark_pool(PoolState(base=1, maximum=3, extra=1))
    assert driver.spark_pool() == PoolState(base=1, maximum=3, extra=1)
    # and the pool gone, no driver sees one
    pool.close()
    assert wait_for(lambda: driver.spark_pool() is None), "spark/pool outlived its session"
