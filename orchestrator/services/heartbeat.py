"""Each Spark worker's heartbeat: is its Spark JVM alive? Read by ``/healthz``.

A worker process keeps one JVM for its whole life. When that JVM dies (killed, out of
memory) the worker starts a new session at its next batch (``sparkjobs.session``);
until then, and whatever the worker is doing, this heartbeat says so. The entry lives
in Redis with a time to live, so a worker that is gone disappears from the list.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import TypedDict

import redis
from django.conf import settings

from sparkjobs.session import jvm_exit_code, jvm_started

log = logging.getLogger(__name__)

KEY_PREFIX = "bpconsole:spark-worker:"
INTERVAL_S = 5.0


class Beat(TypedDict):
    worker: str
    jvm: str  # "up", "not started" (no batch yet) or "exited with code N"
    at: float


_started: dict[str, threading.Thread] = {}


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def beat(worker: str) -> Beat:
    code = jvm_exit_code()
    if code is not None:
        jvm = f"exited with code {code}"
    else:
        jvm = "up" if jvm_started() else "not started"
    entry = Beat(worker=worker, jvm=jvm, at=time.time())
    client = _client()
    try:
        client.set(KEY_PREFIX + worker, json.dumps(entry), ex=int(3 * INTERVAL_S))
    finally:
        client.close()
    return entry


def start() -> None:
    """Beat every few seconds from this process (idempotent): from each Spark worker
    process as it starts (``orchestrator/celery.py``), and again from the batch that
    starts its session."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if worker in _started:
        return

    def loop() -> None:
        while True:
            try:
                beat(worker)
            except redis.RedisError as error:
                # Redis restarting (or gone at the end of a test session): one line, not a
                # traceback every beat; the next beat writes the entry again.
                log.warning("spark heartbeat of %s not written: %s", worker, error)
            time.sleep(INTERVAL_S)

    thread = threading.Thread(target=loop, name="spark-heartbeat", daemon=True)
    _started[worker] = thread
    thread.start()


def beats() -> list[Beat]:
    client = _client()
    try:
        keys = sorted(client.scan_iter(match=KEY_PREFIX + "*", count=100))
        values = client.mget(keys) if keys else []
    finally:
        client.close()
    return [json.loads(v) for v in values if v]
