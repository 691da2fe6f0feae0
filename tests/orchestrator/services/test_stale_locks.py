"""PostgreSQL's lock files are cleared after a crash, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.services.embedded import Postgres, pid_alive


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_zombie_is_not_alive_and_a_running_process_is() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    # Exited but not yet reaped: what an unsupervised killed postmaster used to stay.
    while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)


def test_locks_of_a_dead_server_go_and_a_live_ones_stay(tmp_path: Path) -> None:
    server = Postgres("postgresql", tmp_path / "pg.log", data_dir=tmp_path, port=5999)
    pid_file = tmp_path / "postmaster.pid"
    socket_lock = tmp_path / ".s.PGSQL.5999.lock"
    # A killed server's pid (dead) in both
    for lock in (pid_file, socket_lock):
        lock.write_text(f"{_exited_pid()}\n{tmp_path}\n")
    server.clear_stale_locks()
    assert not pid_file.exists() and not socket_lock.exists()
    # A live process's pid: left alone, PostgreSQL itself refuses to start beside it
    for lock in (pid_file, socket_lock):
        lock.write_text(f"{os.getpid()}\n{tmp_path}\n")
    server.clear_stale_locks()
    assert pid_file.exists() and socket_lock.exists()
