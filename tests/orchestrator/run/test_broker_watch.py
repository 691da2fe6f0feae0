"""The driver knows when Redis restarted (and so lost every queued batch message)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from orchestrator.run.broker_watch import BrokerWatch
from orchestrator.services.embedded import Redis, free_port

pytestmark = pytest.mark.integration


def test_a_restart_is_seen_once_and_an_outage_alone_is_not_a_restart(tmp_path: Path) -> None:
    redis = Redis(
        name="redis",
        log_file=tmp_path / "redis.log",
        data_dir=tmp_path,
        port=free_port(),
        password="a-password",
    )
    redis.start()
    try:
        watch = BrokerWatch(redis.url())
        # The first look only learns which server answers
        assert watch.restarted() is False
        assert watch.restarted() is False
        # While the server is down nothing can be said
        assert redis.process is not None
        redis.process.send_signal(signal.SIGKILL)
        redis.process.wait()
        assert watch.restarted() is False
        # Once a new server answers on the same address, the restart is seen once
        redis.start()
        assert watch.restarted() is True
        assert watch.restarted() is False
    finally:
        redis.stop()


def test_an_unreachable_broker_never_counts_as_restarted() -> None:
    watch = BrokerWatch(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    assert watch.restarted() is False
    assert time.monotonic() - started < 3  # bounded by its socket timeouts
