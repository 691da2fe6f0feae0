"""One Spark JVM per Spark worker, started by the worker's main process and shared by
its pool processes (docs/adr/0007-the-spark-jvm-outlives-its-pool-process.md).

pyspark starts a JVM from the process that first builds a session and the JVM exits
when that process does. In a Celery pool that process is a pool child, so a killed
child took its JVM with it and its replacement paid a new JVM's start and cold first
batch: 11 to 20 s before a run moved again. The worker's main process, which lives on,
starts the JVM instead and relaunches it if it dies; a pool child attaches to it
through py4j's gateway (the way pyspark's own shells hand a JVM to Python) and finds
it warm.

The main process writes where the JVM listens to a small file only its user can read
(the gateway's secret is in it); children know the file by ``BPCONSOLE_SPARK_JVM_INFO``,
which the main process sets before it forks them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pyspark import SparkConf, SparkContext

log = logging.getLogger(__name__)

INFO_ENV = "BPCONSOLE_SPARK_JVM_INFO"
# ``<var>/run/spark-jvm-<worker pid>.json``, and a ``.<jvm pid>.pids`` folder beside it.
FILE_PREFIX = "spark-jvm-"
# How long a pool child waits for its worker's JVM (a start takes 4 to 8 s here).
ATTACH_TIMEOUT_S = 120.0
_BACKOFF_MAX_S = 30.0
# A JVM that ran this long is started again at once when it dies (killed, out of
# memory); one that keeps dying sooner waits 1, 2, 4 ... s, as make run's supervisor.
_UP_RESETS_BACKOFF_S = 15.0

# Held while the JVM's launcher starts its process and makes its context, and by every
# fork of this process, for two reasons:
# - ``subprocess.Popen`` waits until the exec closes the write end of a pipe it opened;
#   a pool process Celery forked in between (a JVM and a pool process killed together)
#   keeps a copy of that end open for its whole life, and the launch waited for it
#   forever, with the pool process waiting for the JVM (a run stood still for minutes);
# - Py4J's converters import modules lazily (pyspark's ``can_convert`` imports
#   ``pyspark.testing.utils`` on its first call). A process forked while the launcher
#   imports one inherits that module's import lock held by a thread it does not have,
#   and its first import of the module waits forever (a pool process's first batch hung).
_LAUNCHING = threading.RLock()


@dataclass(frozen=True)
class JvmInfo:
    """Where a worker's JVM listens, and how its previous one ended."""

    pid: int
    port: int
    secret: str
    previous_pid: int | None = None
    previous_code: int | None = None


@dataclass(frozen=True)
class WarmUp:
    """What a worker's new JVM's warm-up (``sparkjobs/warm_up.py``) did: still
    ``warming``, ``warm`` after its rounds, or ``stopped`` by a batch that came first."""

    pid: int  # the warm-up's process
    state: Literal["warming", "warm", "stopped"]
    jobs: int = 0
    seconds: float = 0.0


def info_path() -> Path | None:
    """This process's worker JVM file, when it runs in a worker that shares one."""
    value = os.environ.get(INFO_ENV)
    return Path(value) if value else None


def read_info(path: Path) -> JvmInfo | None:
    try:
        return JvmInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def alive(pid: int) -> bool:
    """A running process (a zombie, exited but not reaped yet, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def job_tag(pid: int) -> str:
    """The tag of every Spark job a pool process starts: its jobs can be cancelled once
    it is dead, by the next process attaching."""
    return f"bpconsole-pid-{pid}"


def warm_up_path(path: Path, jvm_pid: int) -> Path:
    """Where the warm-up of the JVM ``jvm_pid`` is kept, beside the JVM's file."""
    return path.with_name(f"{path.name}.{jvm_pid}.warm")


def warm_up_folder(path: Path, jvm_pid: int) -> Path:
    """The generated records of the JVM ``jvm_pid``'s warm-up, beside the JVM's file
    (removed with a killed worker's files: ``remove_left_behind``)."""
    return path.with_name(f"{path.name}.{jvm_pid}.warm-up")


def read_warm_up(path: Path) -> WarmUp | None:
    try:
        return WarmUp(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def warm_ups(folder: Path) -> dict[int, WarmUp | None]:
    """The warm-ups of the live JVMs whose files are in ``folder``, by JVM pid: None for
    a JVM started again after its worker's first, which is never warmed. A first JVM
    whose warm-up is not recorded yet is not listed."""
    found: dict[int, WarmUp | None] = {}
    for entry in folder.glob(f"{FILE_PREFIX}*.json"):
        info = read_info(entry)
        if info is None or not alive(info.pid):
            continue
        warm_up = read_warm_up(warm_up_path(entry, info.pid))
        if warm_up is not None or info.previous_pid is not None:
            found[info.pid] = warm_up
    return found


def warm_up_done(path: Path, jvm_pid: int, *, jobs: int, seconds: float) -> None:
    """Record, from the warm-up's own process, that its rounds are done (unless a batch
    stopped it meanwhile)."""
    marker = warm_up_path(path, jvm_pid)
    if (current := read_warm_up(marker)) is not None and current.state == "stopped":
        return
    _write(marker, WarmUp(pid=os.getpid(), state="warm", jobs=jobs, seconds=seconds))


def stop_warm_up(context: SparkContext, jvm_pid: int) -> None:
    """Before a pool process's batch on the JVM ``jvm_pid``: stop the JVM's warm-up, if
    one still runs, and cancel its jobs, so that the batch has the worker's cores (one
    file read when there is none)."""
    path = info_path()
    if path is None:
        return
    marker = warm_up_path(path, jvm_pid)
    warm_up = read_warm_up(marker)
    if warm_up is None or warm_up.state != "warming":
        return
    if _is_warm_up(warm_up.pid):  # not a process that took a dead warm-up's pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(warm_up.pid, signal.SIGTERM)
    context.cancelJobsWithTag(job_tag(warm_up.pid))
    _write(marker, replace(warm_up, state="stopped"))
    log.info("stopped the warm-up of Spark JVM %s: a batch came first", jvm_pid)


def _is_warm_up(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"sparkjobs.warm_up" in argv


def _write(path: Path, info: JvmInfo | WarmUp) -> None:
    """Atomically, readable by this user only: a JVM's file holds the gateway's
    secret."""
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(info), out)
    partial.replace(path)


class WorkerJvm:
    """The JVM of one Spark worker, kept running by a thread of its main process."""

    def __init__(self, conf: SparkConf, path: Path, *, warm_up_rounds: int = 0) -> None:
        self._conf = conf
        self.path = path
        self._warm_up_rounds = warm_up_rounds
        self._process: subprocess.Popen[bytes] | None = None
        self._warm_up: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep_running, name="spark-jvm", daemon=True)

    def start(self) -> None:
        """Start the JVM in the background: the worker takes tasks meanwhile, and a batch
        that comes first waits for it in ``attach``."""
        hold_forks_during_launches()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        remove_left_behind(self.path.parent)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._warm_up is not None and self._warm_up.poll() is None:
            self._warm_up.kill()
            self._warm_up.wait()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        self.path.unlink(missing_ok=True)
        if process is not None:
            shutil.rmtree(pids_folder(self.path, process.pid), ignore_errors=True)
            shutil.rmtree(warm_up_folder(self.path, process.pid), ignore_errors=True)
            warm_up_path(self.path, process.pid).unlink(missing_ok=True)

    def in_pool_process(self) -> None:
        """In a forked pool process: drop its copy of the JVM's stdin, so that the JVM
        still exits when the main process does (it reads that pipe until it closes)."""
        process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        self._process = None

    def _launch(self, previous: tuple[int, int] | None) -> subprocess.Popen[bytes]:
        from pyspark.java_gateway import launch_gateway

        with _LAUNCHING:  # until this thread is done with the gateway (see _LAUNCHING)
            gateway = launch_gateway(self._conf)  # type: ignore[no-untyped-call]
            process: subprocess.Popen[bytes] = gateway.proc
            try:
                parameters = gateway.java_parameters
            except AttributeError:  # PYSPARK_PIN_THREAD=false: a plain JavaGateway
                parameters = gateway.gateway_parameters
            self._process = process
            _write(
                self.path,
                JvmInfo(
                    pid=process.pid,
                    port=parameters.port,
                    secret=parameters.auth_token,
                    previous_pid=previous[0] if previous else None,
                    previous_code=previous[1] if previous else None,
                ),
            )
            # Create Spark's context now, not in the first batch: a pool process
            # attaching later gets it at once (building it on a new JVM takes seconds).
            _jvm_context(gateway.jvm, self._conf)
            # This process only starts the JVM; its own connection would be copied into
            # every pool process it forks.
            gateway.close()
        # The worker's first JVM only: one started again after a crash has its work
        # waiting, which would stop the warm-up at once.
        if previous is None and self._warm_up_rounds > 0:
            self._start_warm_up(process.pid)
        return process

    def _start_warm_up(self, jvm_pid: int) -> None:
        """``sparkjobs/warm_up.py`` in a process of its own (not a fork: it holds no
        copy of this one's state), recorded as warming once started, so that a batch
        finds it to stop (it attaches to the JVM a second or more later)."""
        root = Path(__file__).resolve().parent.parent
        argv = [sys.executable, "-m", "sparkjobs.warm_up", f"--rounds={self._warm_up_rounds}"]
        with _LAUNCHING:
            self._warm_up = subprocess.Popen(
                argv,
                cwd=root,
                env=os.environ | {INFO_ENV: str(self.path)},
                stdin=subprocess.DEVNULL,
            )
        _write(warm_up_path(self.path, jvm_pid), WarmUp(pid=self._warm_up.pid, state="warming"))

    def _reap_warm_up(self, jvm_pid: int) -> None:
        """Reap a warm-up that ended; one that failed is recorded as stopped (its pid
        is not to be signalled once it may be another process's)."""
        if self._warm_up is None or (code := self._warm_up.poll()) is None:
            return
        self._warm_up = None
        shutil.rmtree(warm_up_folder(self.path, jvm_pid), ignore_errors=True)
        marker = warm_up_path(self.path, jvm_pid)
        warm_up = read_warm_up(marker)
        if warm_up is not None and warm_up.state == "warming":
            log.warning("the warm-up of Spark JVM %s ended with code %s", jvm_pid, code)
            _write(marker, replace(warm_up, state="stopped"))

    def _keep_running(self) -> None:
        backoff = 0.0
        previous: tuple[int, int] | None = None
        while not self._stopping.is_set():
            began = time.monotonic()
            self._process = None
            try:
                process = self._launch(previous)
                log.info("Spark JVM %s started for this worker's pool", process.pid)
                while process.poll() is None and not self._stopping.wait(0.2):
                    self._reap_warm_up(process.pid)
            except Exception:
                log.exception("could not start this worker's Spark JVM")
            if self._stopping.is_set():
                return
            previous = self._ended()
            if time.monotonic() - began > _UP_RESETS_BACKOFF_S:
                backoff = 0.0
            log.warning(
                "this worker's Spark JVM exited (%s); starting another in %.0f s",
                "never started" if previous is None else f"pid {previous[0]}, code {previous[1]}",
                backoff,
            )
            if self._stopping.wait(backoff):
                return
            backoff = min(max(backoff * 2, 1.0), _BACKOFF_MAX_S)

    def _ended(self) -> tuple[int, int] | None:
        """The JVM that just ended and its exit code, recorded for the pool processes
        attached to it (they report it)."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:  # launched, but its context could not be made
            process.kill()
        code = process.wait()
        info = read_info(self.path)
        if info is not None and info.pid == process.pid:
            _write(self.path, replace(info, previous_pid=process.pid, previous_code=code))
        shutil.rmtree(pids_folder(self.path, process.pid), ignore_errors=True)
        return process.pid, code


@cache  # once per process: the hooks cannot be removed
def hold_forks_during_launches() -> None:
    """Make every later fork of this process wait for a JVM launch under way (its start
    and its context: a few seconds); a fork with no launch under way does not wait."""
    os.register_at_fork(
        before=_LAUNCHING.acquire,
        after_in_parent=_LAUNCHING.release,
        after_in_child=_LAUNCHING.release,
    )


def remove_left_behind(folder: Path) -> None:
    """The files of workers killed before they could remove them (a SIGKILL): their
    JVM ended with them, and a file per killed worker would pile up over days."""
    for entry in folder.glob(f"{FILE_PREFIX}*"):
        worker = entry.name.removeprefix(FILE_PREFIX).split(".")[0]
        if worker.isdigit() and not alive(int(worker)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def wait_for_live(path: Path, *, unlike: int | None = None) -> JvmInfo:
    """The worker's JVM once it listens (a JVM other than ``unlike``, the dead one)."""
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while True:
        info = read_info(path)
        if info is not None and info.pid != unlike and alive(info.pid):
            return info
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"this worker's Spark JVM did not start within {ATTACH_TIMEOUT_S:.0f} s "
                "(its main process logs why)"
            )
        time.sleep(0.1)


def attach(info: JvmInfo, conf: SparkConf) -> SparkContext:
    """A SparkContext on the worker's JVM, after cancelling the jobs of the pool
    processes that died attached to it (a killed batch would hold the cores)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    os.environ["PYSPARK_GATEWAY_PORT"] = str(info.port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = info.secret
    gateway = launch_gateway()  # type: ignore[no-untyped-call]
    jvm = gateway.jvm
    jsc = jvm.org.apache.spark.api.java.JavaSparkContext.fromSparkContext(_jvm_context(jvm, conf))
    context = SparkContext(conf=conf, gateway=gateway, jsc=jsc)
    _cancel_the_dead(info, context)
    return context


def pids_folder(path: Path, jvm_pid: int) -> Path:
    """The pool processes that attached to one JVM, a file each, named by pid."""
    return path.with_name(f"{path.name}.{jvm_pid}.pids")


def _jvm_context(jvm: Any, conf: SparkConf) -> Any:
    """The JVM's one SparkContext, made with ``conf`` by whoever comes first (the main
    process at the JVM's start; Spark's constructor lock makes a pool process wait)."""
    jconf = jvm.org.apache.spark.SparkConf()
    for key, value in conf.getAll():
        jconf.set(key, value)
    return jvm.org.apache.spark.SparkContext.getOrCreate(jconf)


def _cancel_the_dead(info: JvmInfo, context: SparkContext) -> None:
    path = info_path()
    if path is None:
        return
    folder = pids_folder(path, info.pid)
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.name.isdigit() and not alive(int(entry.name)):
            context.cancelJobsWithTag(job_tag(int(entry.name)))
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    (folder / str(os.getpid())).touch()
