"""The chaos suite's faults: what can be hit, how each target is found in ``make run``'s
process tree, how it is hit, and how to tell that it (or its replacement) is back.

Used by bench/chaos.py and its short version in the tests. Targets are found by command
line among the descendants of the console process (``python -m
orchestrator.services.runconsole``), never by name over the whole machine, so another
stack on the same machine (the test suite's, another bench's) is never hit.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import psutil

from orchestrator.services import embedded
from orchestrator.services.embedded import tcp_answers

LOOPBACK = "127.0.0.1"
HEARTBEAT_PREFIX = "bpconsole:spark-worker:"  # orchestrator/services/heartbeat.py


class Kind(StrEnum):
    """A fault. Each SIGKILLs one process, except ``sigstop``, which pauses one for
    longer than the ZooKeeper session timeout and then lets it go on."""

    SPARK_CHILD = "spark-child"  # the Celery prefork child running the Spark batches
    SPARK_JVM = "spark-jvm"  # that child's Spark JVM
    CONTROL = "control-worker"
    BEAT = "beat"
    DAPHNE = "daphne"
    POSTGRES = "postgres"
    REDIS = "redis"
    ZOOKEEPER = "zookeeper"
    SIGSTOP = "sigstop"


# A process of the console (one worker's, beat's) as opposed to a service the console
# embeds: the two have different recovery targets (15 s and 30 s at p95).
SERVICE_KINDS = frozenset({Kind.DAPHNE, Kind.POSTGRES, Kind.REDIS, Kind.ZOOKEEPER})

# What the supervisor calls each process in its "<name> exited with code ..." lines; a
# Spark pool child or JVM is restarted by its own parent, not by the supervisor.
SUPERVISED_NAME: dict[Kind, str] = {
    Kind.CONTROL: "control worker",
    Kind.BEAT: "celery beat",
    Kind.DAPHNE: "ASGI server",
    Kind.POSTGRES: "postgresql",
    Kind.REDIS: "redis",
    Kind.ZOOKEEPER: "zookeeper",
}


def parse_kinds(text: str) -> list[Kind]:
    """``--kinds``: names separated by commas, each optionally ``=weight`` (how many
    times it is in the draw's bag); ``all`` is every kind once."""
    bag: list[Kind] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, weight = part.partition("=")
        kinds = list(Kind) if name == "all" else [Kind(name)]
        bag += kinds * (int(weight) if weight else 1)
    if not bag:
        raise ValueError("no fault kind given")
    return bag


# -- the process tree -----------------------------------------------------------------


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def alive(pid: int) -> bool:
    """A running process: a zombie (killed, not reaped yet) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _celery(cmd: list[str], what: str) -> bool:
    return "celery" in cmd and what in cmd


def _is_spark_worker(cmd: list[str]) -> bool:
    return _celery(cmd, "worker") and "spark" in cmd


@dataclass(frozen=True)
class Tree:
    """The console's descendants at one moment, by command line."""

    console_pid: int

    def _children(self, pid: int) -> list[psutil.Process]:
        try:
            return [c for c in psutil.Process(pid).children() if alive(c.pid)]
        except psutil.NoSuchProcess:
            return []

    def _direct(self, matches: Callable[[list[str]], bool]) -> list[int]:
        return [c.pid for c in self._children(self.console_pid) if matches(_cmdline(c))]

    def spark_workers(self) -> list[int]:
        """The Spark workers' main processes (``BPCONSOLE_SPARK_WORKERS`` of them)."""
        return self._direct(_is_spark_worker)

    def spark_children(self) -> list[int]:
        """The Spark workers' prefork pool children (same command line as their parent)."""
        return [
            c.pid
            for main in self.spark_workers()
            for c in self._children(main)
            if _is_spark_worker(_cmdline(c))
        ]

    def spark_jvms(self) -> list[int]:
        """The Spark JVMs, each a ``java`` child of a Spark worker's main process, which
        keeps it for its pool (sparkjobs/shared_jvm.py)."""
        out = []
        for main in self.spark_workers():
            for process in self._children(main):
                try:
                    if process.name() == "java":
                        out.append(process.pid)
                except psutil.NoSuchProcess:
                    continue
        return out

    def pids(self, kind: Kind) -> list[int]:
        """The live processes a fault of ``kind`` may hit (``sigstop``: a worker's)."""
        if kind is Kind.SPARK_CHILD:
            return self.spark_children()
        if kind is Kind.SPARK_JVM:
            return self.spark_jvms()
        if kind is Kind.SIGSTOP:
            return self.pids(Kind.CONTROL) + self.spark_children()
        matchers: dict[Kind, Callable[[list[str]], bool]] = {
            Kind.CONTROL: lambda c: _celery(c, "worker") and "control" in c,
            Kind.BEAT: lambda c: _celery(c, "beat"),
            Kind.DAPHNE: lambda c: "daphne" in c,
            # PostgreSQL's postmaster; its backends are its children, not the console's.
            Kind.POSTGRES: lambda c: bool(c) and c[0].endswith("/postgres"),
            # Redis rewrites its title to "/path/redis-server 127.0.0.1:<port>".
            Kind.REDIS: lambda c: bool(c) and "redis-server" in c[0],
            Kind.ZOOKEEPER: lambda c: "org.apache.zookeeper.server.ZooKeeperServerMain" in c,
        }
        return self._direct(matchers[kind])


def hit(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig``; False when the process is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


# -- is it back? ----------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    """Where the stack's services answer (the console's ``services.json``)."""

    database_url: str
    redis_url: str
    zk_port: int
    http_port: int
    health_token: str


def postgres_answers(endpoints: Endpoints) -> bool:
    import psycopg

    try:
        with psycopg.connect(endpoints.database_url, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


def redis_answers(endpoints: Endpoints) -> bool:
    return embedded.redis_answers(endpoints.redis_url, timeout_s=1)


def zookeeper_answers(endpoints: Endpoints) -> bool:
    # "srvr" is answered only once the server serves (embedded.ZooKeeper.ready).
    return tcp_answers(endpoints.zk_port, b"srvr", b"Zookeeper version", timeout_s=1.0)


def daphne_answers(endpoints: Endpoints) -> bool:
    request = urllib.request.Request(
        f"http://{LOOPBACK}:{endpoints.http_port}/healthz?spark=0",
        headers={"Authorization": f"Bearer {endpoints.health_token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=3) as answer:  # noqa: S310 - loopback
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def spark_heartbeat_at(endpoints: Endpoints, pid: int) -> tuple[float, str] | None:
    """The time and JVM state of the last heartbeat of the Spark pool child ``pid``."""
    import redis

    client = redis.Redis.from_url(endpoints.redis_url, socket_timeout=1, socket_connect_timeout=1)
    try:
        keys = list(client.scan_iter(match=f"{HEARTBEAT_PREFIX}*:{pid}", count=100))
        raw = client.get(keys[0]) if keys else None
    except redis.RedisError:
        return None
    finally:
        client.close()
    if not isinstance(raw, bytes | str):
        return None
    beat = json.loads(raw)
    return float(beat["at"]), str(beat["jvm"])


def control_answers(endpoints: Endpoints, pid: int) -> bool:
    """The control worker ``pid`` answers a Celery ping (worker names are ``control@host``,
    so the pid is checked on the process, the answer on the name)."""
    from celery import Celery

    if not alive(pid):
        return False
    # Not the process's current app: tasks sent after this would go to this broker.
    app = Celery(broker=endpoints.redis_url, set_as_current=False)
    try:
        replies = app.control.ping(timeout=1.0) or []
    except Exception:  # noqa: BLE001 - no answer (Redis away too) is the answer
        return False
    finally:
        app.close()
    return any(name.startswith("control@") for reply in replies for name in reply)


def log_says_since(log: Path, offset: int, text: str) -> bool:
    """Whether ``text`` was written to ``log`` after byte ``offset``."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            return text.encode() in f.read()
    except OSError:
        return False


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0
