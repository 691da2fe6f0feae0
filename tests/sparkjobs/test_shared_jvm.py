"""The file through which a Spark worker's pool processes find its JVM (ADR 0007): it
holds the gateway's secret, so only its user may read it, and a half-written or foreign
file is never taken for a live JVM."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from sparkjobs.shared_jvm import (
    FILE_PREFIX,
    JvmInfo,
    _write,
    alive,
    job_tag,
    pids_folder,
    read_info,
    remove_left_behind,
)


def test_the_file_is_the_owners_alone_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "spark-jvm-1.json"
    info = JvmInfo(pid=os.getpid(), port=40001, secret="s3cret", previous_pid=7, previous_code=-9)
    _write(path, info)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_info(path) == info
    # Written next to it, then renamed: a reader never sees half of it
    assert list(tmp_path.iterdir()) == [path]


def test_a_missing_broken_or_foreign_file_is_no_jvm(tmp_path: Path) -> None:
    path = tmp_path / "spark-jvm-1.json"
    assert read_info(path) is None
    path.write_text('{"pid": 1, "port": 2')
    assert read_info(path) is None
    path.write_text('{"pid": 1, "port": 2, "secret": "x", "command": "rm -rf /"}')
    assert read_info(path) is None
    path.write_text("[1, 2, 3]")
    assert read_info(path) is None


def test_a_dead_or_unreaped_process_is_not_alive() -> None:
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:  # exited but not reaped: a zombie
        state = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0]
        if state == "Z":
            break
        time.sleep(0.01)
    assert not alive(child.pid)
    child.wait()
    assert not alive(child.pid)


def test_each_pool_process_has_its_own_tag_and_each_jvm_its_own_folder(tmp_path: Path) -> None:
    assert job_tag(12) != job_tag(123)
    path = tmp_path / "spark-jvm-5.json"
    assert pids_folder(path, 10) != pids_folder(path, 11)
    assert pids_folder(path, 10).parent == tmp_path


def test_a_new_worker_removes_what_killed_workers_left_and_nothing_else(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f"spark-jvm-{os.getpid()}.json"
    left = tmp_path / f"spark-jvm-{dead.pid}.json"
    for path in (mine, left):
        _write(path, JvmInfo(pid=1, port=2, secret="x"))
        pids_folder(path, 1).mkdir()
    other = tmp_path / "services.json"
    other.write_text("{}")
    remove_left_behind(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.name, pids_folder(mine, 1).name, other.name]
    )


LAUNCH_RACE = """
import os, subprocess, sys, threading, time
from sparkjobs.shared_jvm import _LAUNCHING, hold_forks_during_launches
if sys.argv[1] == "held":
    hold_forks_during_launches()
# Widens the moment the launcher's exec pipe is open in this process and no exec has
# closed it yet: Popen with a preexec_fn (as pyspark's launch_gateway) runs the fork
# hooks then.
os.register_at_fork(
    before=lambda: time.sleep(0.5) if threading.current_thread().name == "spark-jvm" else None
)
took = []

def launch():
    began = time.monotonic()
    with _LAUNCHING:
        subprocess.Popen(["true"], preexec_fn=lambda: None).wait()
    took.append(time.monotonic() - began)

launcher = threading.Thread(target=launch, name="spark-jvm")
launcher.start()
time.sleep(0.2)
pid = os.fork()  # as Celery forks a pool process, which lives on
if pid == 0:
    time.sleep(4)
    os._exit(0)
launcher.join()
os.waitpid(pid, 0)
print(took[0])
"""


def _printed(script: str, argument: str, *, timeout_s: float) -> str:
    """What ``script`` printed, run with ``argument`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-c", script, argument],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    ).stdout


def _launch_seconds(mode: str) -> float:
    return float(_printed(LAUNCH_RACE, mode, timeout_s=60))


def test_a_pool_process_forked_during_a_jvm_launch_does_not_hold_the_launch_up() -> None:
    # Without the hold, the process forked between the launcher's fork and exec keeps the
    # launcher's exec pipe open, and the launch waits until it exits (4 s here; for good
    # in a worker, whose pool process waits for the JVM)
    assert _launch_seconds("free") >= 3.5
    # With it, the fork waits for the launch instead, which ends as its exec does
    assert _launch_seconds("held") < 2.0


# A worker's main process starting its JVM; while the launcher makes the JVM's context
# (Py4J converting the configuration, which imports modules lazily), another thread
# tries to take what a fork takes first.
CONTEXT_RACE = """
import sys, threading
from pathlib import Path
from sparkjobs import shared_jvm
from sparkjobs.session import spark_conf
from tests.waiting import wait_for
free = []

def try_to_fork():
    took = shared_jvm._LAUNCHING.acquire(blocking=False)
    if took:
        shared_jvm._LAUNCHING.release()
    free.append(took)

make = shared_jvm._jvm_context

def making(jvm, conf):
    forker = threading.Thread(target=try_to_fork)
    forker.start()
    forker.join()
    return make(jvm, conf)

shared_jvm._jvm_context = making
shared_jvm.hold_forks_during_launches()
jvm = shared_jvm.WorkerJvm(spark_conf(app_name="fork test"), Path(sys.argv[1]))
jvm.start()
wait_for("the JVM's context", lambda: free, timeout_s=120)
jvm.stop()
print(free[0])
"""


def test_a_fork_waits_while_the_launcher_makes_the_jvms_context(tmp_path: Path) -> None:
    # A pool process forked while the launcher imported a module for Py4J inherited
    # that module's import lock, held by no thread of its own: its first batch hung
    out = _printed(CONTEXT_RACE, str(tmp_path / f"{FILE_PREFIX}1.json"), timeout_s=180)
    assert out.split() == ["False"]
