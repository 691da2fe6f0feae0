"""Is each service up? Used by ``manage.py doctor`` and ``GET /healthz``.

What a viewer reads on ``/healthz`` (a check's ``detail``) names the service, its version
and its state, never where it is: no URL, host, port or credential, and no exception's
own text (a driver's error message names the address it could not reach). Where the
service is and what exactly failed are the check's ``local`` text, which only the
server's shell sees (``manage.py doctor``), with any password of a URL left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from django.conf import settings
from django.db import connection

from orchestrator.services.credentials import ZkAddress, without_password

SPARK_CHECK_TIMEOUT_S = 120
SPARK_CACHE_S = 60.0


class CheckJson(TypedDict):
    service: str
    up: bool
    detail: str


@dataclass(frozen=True)
class Check:
    service: str
    up: bool
    # For anyone who may see the health page: no address, URL or secret.
    detail: str
    # For the server's shell only: where the service is, the error's own message.
    local: str = ""

    def to_json(self) -> CheckJson:
        return {"service": self.service, "up": self.up, "detail": self.detail}


class Down(Exception):
    """A service found down, said in words anyone may read (``detail``), and for the
    server's shell only (``local``)."""

    def __init__(self, detail: str, local: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.local = local


def _guard(service: str, probe: Callable[[], str], where: str) -> Check:
    """The check of ``service`` at ``where`` (for ``local`` only): ``probe`` returns
    what the service says of itself, without its address, or raises :class:`Down`."""
    try:
        return Check(service, up=True, detail=probe(), local=f"at {where}")
    except Down as exc:
        return Check(service, up=False, detail=exc.detail, local=exc.local or f"at {where}")
    except Exception as exc:  # noqa: BLE001 - the failure is the answer
        return Check(
            service,
            up=False,
            detail=f"does not answer ({type(exc).__name__})",
            local=f"at {where}: {type(exc).__name__}: {exc}",
        )


def check_postgresql() -> Check:
    def probe() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            version = cursor.fetchone()[0]
        return f"{version.split(' on ')[0]} answers"

    database = settings.DATABASES["default"]
    return _guard("postgresql", probe, f"{database['HOST']}:{database['PORT']}")


def check_redis() -> Check:
    def probe() -> str:
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
        )
        try:
            info = client.info("server")
        finally:
            client.close()
        return f"Redis {info['redis_version']} answers"

    return _guard("redis", probe, without_password(settings.REDIS_URL))


def check_zookeeper() -> Check:
    def probe() -> str:
        from orchestrator.services.credentials import zk_client

        client = zk_client(settings.ZK_HOSTS, timeout=3, connection_retry={"max_tries": 1})
        try:
            client.start(timeout=3)
            client.get_children("/")
            session = client.client_id[0] if client.client_id else 0
        finally:
            client.stop()
            client.close()
        return f"ZooKeeper answers (session {session:#x})"

    return _guard("zookeeper", probe, ZkAddress.parse(settings.ZK_HOSTS).redacted())


_spark_lock = threading.Lock()
_spark_cache: tuple[float, Check] | None = None


def check_spark(*, max_age_s: float = SPARK_CACHE_S) -> Check:
    """Run a tiny Spark job in a child process; reuse a recent answer (it takes seconds)."""
    global _spark_cache  # noqa: PLW0603 - a process-wide cache of an expensive probe
    with _spark_lock:
        if _spark_cache and time.monotonic() - _spark_cache[0] < max_age_s:
            return _spark_cache[1]
        check = _run_spark_job()
        _spark_cache = (time.monotonic(), check)
        return check


def _run_spark_job() -> Check:
    try:
        result = subprocess.run(
            [sys.executable, "-m", "sparkjobs.probe"],
            capture_output=True,
            text=True,
            timeout=SPARK_CHECK_TIMEOUT_S,
            check=False,
            env={**os.environ, "SPARK_MASTER": settings.SPARK_MASTER},
        )
    except subprocess.TimeoutExpired:
        return Check("spark", up=False, detail=f"no answer within {SPARK_CHECK_TIMEOUT_S} s")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (result.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return Check(
            "spark",
            up=False,
            detail=f"the probe job exited with {result.returncode}",
            local=tail[0],
        )
    answer = json.loads(lines[-1])
    return Check(
        "spark",
        up=bool(answer["ok"]),
        detail=str(answer["detail"]),
        local=str(answer.get("local", "")),
    )


def check_spark_workers() -> Check:
    """The Spark workers' own word on their JVMs (``orchestrator/services/heartbeat.py``): cheap,
    and it sees what a separate probe job cannot, a worker whose JVM has died."""

    def probe() -> str:
        from orchestrator.services.heartbeat import INTERVAL_S, beats

        entries = beats()
        if not entries:
            raise Down(
                "no Spark worker has reported in the last "
                f"{3 * INTERVAL_S:g} s: no batch can run (start one: celery ... worker -Q spark)"
            )
        dead = [b for b in entries if b["jvm"].startswith("exited")]
        if dead:
            # Counted, not named: a worker's name is its host's.
            how = ", ".join(sorted({b["jvm"] for b in dead}))
            raise Down(
                f"{len(dead)} of {len(entries)} Spark worker(s) report a dead JVM ({how}; "
                "each starts a new session at its next batch)",
                "; ".join(f"{b['worker']}: Spark JVM {b['jvm']}" for b in dead),
            )
        waiting = sum(1 for b in entries if b["jvm"] == "not started")
        later = f" ({waiting} start theirs at their first batch)" if waiting else ""
        return f"{len(entries)} Spark worker(s) report in, none with a dead JVM{later}"

    return _guard("spark-workers", probe, "the workers' heartbeats in Redis")


def run_checks(*, spark: bool = True, spark_job: bool = False) -> list[Check]:
    """The services, and with ``spark`` the Spark workers' heartbeats (cheap: one Redis
    read, what ``/healthz`` asks on every call); ``spark_job`` also runs a Spark job
    (seconds: ``manage.py doctor``, to see that Spark itself works here)."""
    checks = [check_postgresql(), check_redis(), check_zookeeper()]
    if spark:
        checks.append(check_spark_workers())
    if spark_job:
        checks.append(check_spark())
    return checks
