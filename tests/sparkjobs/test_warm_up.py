"""A Spark worker's first JVM warms itself on generated records while the worker is idle,
and yields to the first batch (sparkjobs/warm_up.py): the batch stops it and cancels its
jobs, and what it did is kept beside the JVM's file, for its owner only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import psutil
import pytest

from sparkjobs.shared_jvm import (
    FILE_PREFIX,
    INFO_ENV,
    JvmInfo,
    WarmUp,
    _write,
    job_tag,
    read_info,
    read_warm_up,
    stop_warm_up,
    warm_up_path,
    warm_ups,
)
from tests.waiting import alive, wait_for

if TYPE_CHECKING:
    from pyspark import SparkContext

ROOT = Path(__file__).resolve().parents[2]

# A worker's main process: its JVM kept up, with a warm-up of argv[2] rounds, until
# its standard input closes.
WORKER = """
import sys
from pathlib import Path
from sparkjobs.session import spark_conf
from sparkjobs.shared_jvm import WorkerJvm
jvm = WorkerJvm(spark_conf(app_name="warm-up test"), Path(sys.argv[1]),
                warm_up_rounds=int(sys.argv[2]))
jvm.start()
sys.stdin.read()
jvm.stop()
"""

# A pool process's batch: it claims the JVM, sees no job left running but its own, and
# runs an aggregate batch to its end.
BATCH = """
import sys
from pathlib import Path
from sparkjobs.grouped import aggregate_batch
from sparkjobs.session import claim_jvm, operator_session
from sparkjobs.warm_up import write_records
from tests.waiting import wait_for
folder = Path(sys.argv[1])
inputs = write_records(folder, 1000)
spark = operator_session([p.stat().st_size for p in inputs.values()])
claim_jvm(spark)
tracker = spark.sparkContext.statusTracker()
wait_for("the warm-up's jobs to end once the batch claimed the JVM",
         lambda: not tracker.getActiveJobsIds(), timeout_s=60,
         detail=lambda: f"jobs {list(tracker.getActiveJobsIds())} still run")
out = aggregate_batch(spark, "aggregate", {}, inputs,
                      {s: folder / f"{s}.out" for s in inputs}, key_group=None)
print(sum(o.records for o in out.values()))
"""


def _worker(run_folder: Path, rounds: int) -> tuple[subprocess.Popen[str], Path]:
    run_folder.mkdir(mode=0o700)
    path = run_folder / f"{FILE_PREFIX}1.json"
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(path), str(rounds)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        text=True,
    )
    return process, path


def _stop(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.close()
    process.wait(60)


def _gone(pid: int) -> bool:
    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def _marker(path: Path) -> Path | None:
    """The JVM's warm-up file, once the warm-up has started."""
    info = read_info(path)
    if info is None or read_warm_up(marker := warm_up_path(path, info.pid)) is None:
        return None
    return marker


def test_a_new_workers_jvm_runs_its_rounds_and_says_it_is_warm(tmp_path: Path) -> None:
    process, path = _worker(tmp_path / "run", rounds=1)
    try:
        marker = wait_for("the JVM and its warm-up", lambda: _marker(path), timeout_s=120)
        done = wait_for(
            "the warm-up's round",
            lambda: (w := read_warm_up(marker)) is not None and w.state == "warm" and w,
            timeout_s=300,
            detail=lambda: str(read_warm_up(marker)),
        )
        assert done.jobs == 6
        assert done.seconds > 0
        # The owner's alone, like the JVM's file; the generated records are gone
        assert stat.S_IMODE(marker.stat().st_mode) == 0o600
        assert not list((tmp_path / "run").glob("*.warm-up"))
        wait_for(
            "the warm-up process to end",
            lambda: _gone(done.pid),
            timeout_s=30,
        )
    finally:
        _stop(process)


def test_a_batch_that_comes_first_stops_the_warm_up_and_cancels_its_jobs(tmp_path: Path) -> None:
    process, path = _worker(tmp_path / "run", rounds=100)
    try:
        marker = wait_for("the JVM and its warm-up", lambda: _marker(path), timeout_s=120)
        warming = read_warm_up(marker)
        assert warming is not None and warming.state == "warming"
        info = read_info(path)
        assert info is not None
        pids = path.with_name(f"{path.name}.{info.pid}.pids")
        # The warm-up has attached to the JVM (as a pool process does) and runs its jobs
        wait_for(
            "the warm-up to attach",
            (pids / str(warming.pid)).exists,
            timeout_s=120,
        )
        batch_folder = tmp_path / "batch"
        batch_folder.mkdir()
        batch = subprocess.run(
            [sys.executable, "-c", BATCH, str(batch_folder)],
            cwd=ROOT,
            env=os.environ | {INFO_ENV: str(path)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert batch.returncode == 0, batch.stderr[-2000:]
        assert batch.stdout.split()[-1] == "2000"  # both segments' good records
        stopped = read_warm_up(marker)
        assert stopped is not None and stopped.state == "stopped"
        wait_for(
            "the stopped warm-up's process to end",
            lambda: _gone(warming.pid),
            timeout_s=30,
        )
        # Its generated records go with it
        wait_for(
            "the stopped warm-up's records to be removed",
            lambda: not list((tmp_path / "run").glob("*.warm-up")),
            timeout_s=30,
        )
    finally:
        _stop(process)


class _Cancels:
    """The one call ``stop_warm_up`` makes of a SparkContext, recorded."""

    def __init__(self) -> None:
        self.tags: list[str] = []

    def cancelJobsWithTag(self, tag: str) -> None:
        self.tags.append(tag)


def test_a_warming_record_naming_another_process_signals_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A warm-up that died unreaped left "warming" with its pid, which another process
    # of the same user may have taken since: that one is not signalled
    path = tmp_path / f"{FILE_PREFIX}1.json"
    monkeypatch.setenv(INFO_ENV, str(path))
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        marker = warm_up_path(path, 77)
        _write(marker, WarmUp(pid=bystander.pid, state="warming"))
        context = _Cancels()
        stop_warm_up(cast("SparkContext", context), 77)
        assert bystander.poll() is None
        assert context.tags == [job_tag(bystander.pid)]
        stopped = read_warm_up(marker)
        assert stopped is not None and stopped.state == "stopped"
        # Once stopped, a later batch does nothing at all
        stop_warm_up(cast("SparkContext", context), 77)
        assert context.tags == [job_tag(bystander.pid)]
    finally:
        bystander.kill()
        bystander.wait()


def test_the_warm_ups_listed_are_of_live_jvms_and_a_jvm_started_again_has_none(
    tmp_path: Path,
) -> None:
    # What a bench waits on before it times anything: every worker's JVM listed, each
    # with its warm-up, or None where none will come
    jvms = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        first, again, unrecorded = (p.pid for p in jvms)
        gone = subprocess.Popen(["true"])
        gone.wait()
        files = {
            pid: tmp_path / f"{FILE_PREFIX}{n}.json"
            for n, pid in enumerate((first, again, unrecorded, gone.pid))
        }
        for pid, path in files.items():
            previous = 99 if pid == again else None
            _write(path, JvmInfo(pid=pid, port=1, secret="s", previous_pid=previous))
        warming = WarmUp(pid=12, state="warming")
        _write(warm_up_path(files[first], first), warming)
        _write(warm_up_path(files[gone.pid], gone.pid), WarmUp(pid=13, state="warm"))
        # The first JVM's warm-up as recorded; the JVM started again after a crash is never
        # warmed; a first JVM whose warm-up is not recorded yet, and a dead JVM, are not listed
        assert warm_ups(tmp_path) == {first: warming, again: None}
    finally:
        for process in jvms:
            process.kill()
            process.wait()
