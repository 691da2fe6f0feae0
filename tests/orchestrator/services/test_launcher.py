"""The embedded-services launcher: start, record, stop, fail clearly, leave no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import redis

from orchestrator.services.credentials import zk_client
from orchestrator.services.embedded import ServiceError, ZooKeeper, check_java, free_port
from orchestrator.services.launcher import PROJECT_ROOT, Launcher, recorded_endpoints

pytestmark = pytest.mark.integration

NO_SERVICES = {"DATABASE_URL": "", "REDIS_URL": "", "ZK_HOSTS": ""}


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_starts_all_three_records_them_and_stops_them(tmp_path: Path) -> None:
    # Given no service configured, when the launcher starts
    launcher = Launcher(tmp_path, environ=NO_SERVICES)
    with launcher as endpoints:
        pids = [s.process.pid for s in launcher.started if s.process]
        # then every service answers on loopback
        assert endpoints.database_url.startswith("postgresql://postgres:")
        assert "@127.0.0.1:" in endpoints.database_url
        assert redis.Redis.from_url(endpoints.redis_url).ping()
        zk = zk_client(endpoints.zk_hosts)
        zk.start(10)
        zk.ensure_path("/probe")
        zk.stop()
        import psycopg

        with psycopg.connect(endpoints.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # and a second shell finds the same addresses under the state folder
        assert recorded_endpoints(tmp_path) == endpoints
        assert set(launcher.start_seconds) == {"postgresql", "redis", "zookeeper"}
    # When it stops, nothing it started is left, and the record is gone
    time.sleep(0.2)
    assert _alive(pids) == []
    assert recorded_endpoints(tmp_path) is None


def test_configured_services_are_used_not_started(tmp_path: Path) -> None:
    env = {
        "DATABASE_URL": "postgresql://u@db.example:5432/x",
        "REDIS_URL": "redis://cache.example:6379/0",
        "ZK_HOSTS": "zk1.example:2181",
    }
    with Launcher(tmp_path, environ=env) as endpoints:
        assert endpoints.as_env() == env
    assert not (tmp_path / "postgresql").exists()


def test_a_service_that_dies_is_named_with_its_log(tmp_path: Path) -> None:
    # A heap size the JVM rejects makes ZooKeeper exit at once.
    zk = ZooKeeper(
        "zookeeper",
        tmp_path / "log" / "zookeeper.log",
        data_dir=tmp_path / "zk" / "data",
        port=free_port(),
        password="a-password",
        heap_mb=-1,
    )
    zk.launch()
    with pytest.raises(ServiceError) as err:
        zk.wait_ready(time.monotonic() + 30)
    assert "zookeeper exited with code" in str(err.value)
    assert str(tmp_path / "log" / "zookeeper.log") in str(err.value)


def test_a_service_that_does_not_answer_in_time_is_stopped_and_named(tmp_path: Path) -> None:
    launcher = Launcher(
        tmp_path, environ={**NO_SERVICES, "REDIS_URL": "x", "ZK_HOSTS": "y"}, timeout_s=0.001
    )
    with pytest.raises(ServiceError, match=r"postgresql did not answer in time; see its log: "):
        launcher.start()
    assert launcher.started == []
    assert not (tmp_path / "services.json").exists()


def test_missing_java_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="Java 17 or newer is required"):
        check_java()


def test_stale_record_is_ignored(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "services.json").write_text(
        json.dumps({"pid": dead.pid, "database_url": "a", "redis_url": "b", "zk_hosts": "c"})
    )
    assert recorded_endpoints(tmp_path) is None


def test_killed_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    # Given a launcher process with all services up
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(PROJECT_ROOT)!r})
        from pathlib import Path
        from orchestrator.services.launcher import Launcher
        launcher = Launcher(Path({str(tmp_path)!r}), environ={NO_SERVICES!r})
        launcher.start()
        print(" ".join(str(s.process.pid) for s in launcher.started), flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
    assert len(pids) == 3
    assert _alive(pids) == pids
    # When it is killed without a chance to clean up
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Then its services die with it
    deadline = time.monotonic() + 20
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(pids) == []
