"""``make run`` keeps its processes up: a killed worker, the elastic pool's process,
Redis, ZooKeeper or PostgreSQL comes back, the console goes on, and SIGTERM still stops
everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestrator.services.embedded import free_port, redis_answers
from orchestrator.services.launcher import PROJECT_ROOT, Endpoints, recorded_endpoints

pytestmark = pytest.mark.integration

TOKEN = "supervision-test-token"  # the probe token of this test's console only


def _wait(
    what: str, ok: Callable[[], bool], timeout_s: float, console: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert console.poll() is None, f"the console exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def _healthy(port: int) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/healthz?spark=0", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:  # gone, or a zombie for the moment before it is reaped
        return []


def _child(console: psutil.Process, matches: Callable[[list[str]], bool]) -> psutil.Process:
    found = [c for c in console.children() if matches(_cmdline(c))]
    assert len(found) == 1, [c.cmdline() for c in found]
    return found[0]


def _is_control_worker(cmd: list[str]) -> bool:
    return "celery" in cmd and "worker" in cmd and "control" in cmd


def _is_elastic_pool(cmd: list[str]) -> bool:
    return "elastic_workers" in cmd


def _is_redis(cmd: list[str]) -> bool:
    # Redis rewrites its title to one word: "/path/redis-server 127.0.0.1:<port>".
    return bool(cmd) and "redis-server" in cmd[0]


def _is_zookeeper(cmd: list[str]) -> bool:
    return "org.apache.zookeeper.server.ZooKeeperServerMain" in cmd


def _is_postmaster(cmd: list[str]) -> bool:
    return bool(cmd) and cmd[0].endswith("/postgres")


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except psutil.NoSuchProcess:
            pass
    return living


def _kill_and_see_it_back(
    console: subprocess.Popen[bytes],
    matches: Callable[[list[str]], bool],
    answers: Callable[[], bool],
) -> tuple[psutil.Process, psutil.Process]:
    parent = psutil.Process(console.pid)
    old = _child(parent, matches)
    old.send_signal(signal.SIGKILL)

    def replaced() -> bool:
        found = [c for c in parent.children() if matches(_cmdline(c)) and c.pid != old.pid]
        return len(_alive(found)) == 1

    _wait("a new process", replaced, 60, console)
    _wait("the new process to answer", answers, 90, console)
    # The dead one was reaped: no zombie left among the console's children.
    zombies = [c for c in parent.children() if c.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []
    return old, _child(parent, matches)


def _zookeeper_answers(endpoints: Endpoints) -> bool:
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    from orchestrator.services.credentials import zk_client

    client = zk_client(endpoints.zk_hosts, timeout=2, connection_retry={"max_tries": 1})
    try:
        client.start(timeout=2)
        client.get_children("/")
    except (KazooException, KazooTimeoutError):
        return False
    finally:
        client.stop()
        client.close()
    return True


def _postgres_answers(endpoints: Endpoints) -> bool:
    import psycopg

    try:
        with psycopg.connect(endpoints.database_url, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


def _control_worker_answers(endpoints: Endpoints) -> bool:
    from celery import Celery

    # Not the process's current app: tasks sent after this would go to this broker.
    app = Celery(broker=endpoints.redis_url, set_as_current=False)
    try:
        replies = app.control.ping(timeout=1.0) or []
    except Exception:  # noqa: BLE001 - no answer yet is the answer
        return False
    finally:
        app.close()
    return any(name.startswith("control@") for reply in replies for name in reply)


def test_killed_processes_come_back_and_sigterm_stops_all(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    port = free_port()
    env = {
        **os.environ,
        "BPCONSOLE_VAR_DIR": str(var_dir),
        "BPCONSOLE_PORT": str(port),
        "BPCONSOLE_DEMO": "0",
        "BPCONSOLE_SPARK_WORKERS_MAX": "2",  # an elastic pool's process, no worker of it
        "BPCONSOLE_HEALTH_TOKEN": TOKEN,
        "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
        "DATABASE_URL": "",
        "REDIS_URL": "",
        "ZK_HOSTS": "",
    }
    out_path = tmp_path / "runconsole.out"
    # Given the console started as `make run` starts it
    with out_path.open("wb") as out:
        console = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.services.runconsole"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait("the console", lambda: "console is up" in out_path.read_text(), 150, console)
        _wait("GET /healthz", lambda: _healthy(port), 60, console)
        endpoints = recorded_endpoints(var_dir)
        assert endpoints is not None

        # When the control worker is killed, a new one answers and the stack still serves
        _kill_and_see_it_back(
            console, _is_control_worker, lambda: _control_worker_answers(endpoints)
        )
        _wait("GET /healthz after the worker", lambda: _healthy(port), 60, console)

        # When the elastic pool's process is killed, a new one runs
        _kill_and_see_it_back(console, _is_elastic_pool, lambda: True)

        # When Redis is killed, it comes back on the same port
        _kill_and_see_it_back(
            console, _is_redis, lambda: redis_answers(endpoints.redis_url, timeout_s=1)
        )
        _wait("GET /healthz after Redis", lambda: _healthy(port), 60, console)

        # When ZooKeeper is killed, it comes back on the same port
        _kill_and_see_it_back(console, _is_zookeeper, lambda: _zookeeper_answers(endpoints))
        _wait("GET /healthz after ZooKeeper", lambda: _healthy(port), 60, console)

        # When the PostgreSQL postmaster is killed, it comes back on the same port and data
        postmaster = _child(psutil.Process(console.pid), _is_postmaster)
        backends = postmaster.children()
        _kill_and_see_it_back(console, _is_postmaster, lambda: _postgres_answers(endpoints))
        _wait("GET /healthz after PostgreSQL", lambda: _healthy(port), 60, console)

        # Then the console itself is still running, and said what it restarted
        assert console.poll() is None
        said = out_path.read_text()
        for name in ("control worker", "elastic Spark workers", "redis", "zookeeper", "postgresql"):
            assert f"{name} exited with code -9; restarting in 1 s (restart 1)" in said, said

        # When it gets SIGTERM, everything it started is gone
        started = psutil.Process(console.pid).children(recursive=True)
        console.send_signal(signal.SIGTERM)
        assert console.wait(60) == 0
        deadline = time.monotonic() + 30
        while _alive(started + backends) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(started + backends) == []
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()
