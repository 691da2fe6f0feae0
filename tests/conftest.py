"""Shared fixtures: real services started by the project's own launcher.

Pure tests (balancer/, the simulator) start nothing. The first test that needs the
database, Redis or ZooKeeper starts the embedded services once for the session under
``var/test`` (or uses DATABASE_URL / REDIS_URL / ZK_HOSTS when set), and the session
stops them at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from orchestrator.celery import app as celery_app
from orchestrator.services.embedded import die_with_parent
from orchestrator.services.launcher import PROJECT_ROOT, Endpoints, Launcher
from webapp.settings.env import database_from_url

TEST_LEASE_S = 8
# The suite's Spark workers take a batch within seconds of their start: a warm-up
# (sparkjobs/warm_up.py) would only share the two cores with the tests. Its own tests
# ask for one.
os.environ.setdefault("BPCONSOLE_SPARK_WARM_UP_ROUNDS", "0")
# Each of pytest-xdist's worker processes runs a stack of its own (its services, workers
# and files), in a folder of its own.
TEST_VAR_DIR = Path(
    os.environ.get("BPCONSOLE_TEST_VAR_DIR", str(PROJECT_ROOT / "var" / "test"))
) / os.environ.get("PYTEST_XDIST_WORKER", "")


@pytest.fixture(autouse=True)
def _celery_app_stays_the_consoles() -> Iterator[None]:
    """A ``Celery(...)`` built in a test (a probe pinging another stack's workers) becomes
    the process's current app unless built with ``set_as_current=False``, and every task
    sent after it (``drive_run.apply_async``) would go to that stack's broker, long gone:
    a later test, not this one, would fail. So each test must leave the console's app
    current."""
    yield
    from celery import current_app

    left = current_app._get_current_object()
    celery_app.set_current()  # the next test starts right whatever this one did
    assert left is celery_app, (
        f"this test left {left} as Celery's current app: build it with set_as_current=False"
    )


@pytest.fixture(scope="session")
def services() -> Iterator[Endpoints]:
    launcher = Launcher(TEST_VAR_DIR, environ=dict(os.environ))
    endpoints = launcher.start()
    settings.REDIS_URL = endpoints.redis_url
    settings.ZK_HOSTS = endpoints.zk_hosts
    settings.CELERY_BROKER_URL = endpoints.redis_url
    settings.CELERY_RESULT_BACKEND = endpoints.redis_url
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [endpoints.redis_url]
    # The test database is new each session: a run's files left by the last session
    # would be taken for those of the run that gets its number now.
    for stale in ("data", "sinks"):
        shutil.rmtree(TEST_VAR_DIR / stale, ignore_errors=True)
    settings.DATA_DIR = TEST_VAR_DIR / "data"
    settings.BPCONSOLE_SINK_ROOT = TEST_VAR_DIR / "sinks"
    celery_app.conf.broker_url = endpoints.redis_url
    celery_app.conf.result_backend = endpoints.redis_url
    try:
        yield endpoints
    finally:
        launcher.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(services: Endpoints) -> None:
    # Mutate in place: Django's connection handler holds this very dict.
    settings.DATABASES["default"].update(database_from_url(services.database_url))


def child_env(services: Endpoints) -> dict[str, str]:
    """Environment for a child process (manage.py, a worker) using the test services and
    the test database. Tests sharing rows with a child use ``transactional_db``."""
    server, _, _ = services.database_url.rpartition("/")
    return {
        **os.environ,
        **services.as_env(),
        "DATABASE_URL": f"{server}/{settings.DATABASES['default']['NAME']}",
        "DJANGO_SETTINGS_MODULE": "webapp.settings.test",
        "BPCONSOLE_VAR_DIR": str(TEST_VAR_DIR),
        "BPCONSOLE_DATA_DIR": str(TEST_VAR_DIR / "data"),
        # Where this process checks a Parquet sink is where the workers write it.
        "BPCONSOLE_SINK_ROOT": str(settings.BPCONSOLE_SINK_ROOT),
        "BPCONSOLE_LEASE_S": str(TEST_LEASE_S),
        # A batch prefetched by a worker a test killed is sent again after a lease too.
        "BPCONSOLE_QUEUED_BATCH_S": str(TEST_LEASE_S),
        # The ledger's tests keep bare pending runs that no driver may take: the session's
        # watchdog starts a run whose start was lost after an hour, not 30 s (the rule
        # is tested by calling the watchdog in the test's own process).
        "BPCONSOLE_DRIVER_START_S": "3600",
        # A continuous run's old rows go within seconds, so the tests that kill its
        # processes also cover coalesced merged chunks and deleted segment rows.
        "BPCONSOLE_MERGED_KEEP_S": "1",
        "BPCONSOLE_SEGMENT_ROWS_KEEP_S": "2",
        "SPARK_DRIVER_MEMORY": "768m",
    }


@dataclass
class Workers:
    """The console's worker processes for a test session: two control workers (one can
    be killed while the other takes over), one Spark worker, and beat (the watchdog)."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Another pool on the same broker (tests/cluster) needs other node names and its
    # own beat schedule file.
    host: str = "bpconsole-test"
    beat_schedule: Path = TEST_VAR_DIR / "beat-schedule"

    def start(
        self, name: str, wrap: Callable[[list[str]], list[str]] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start worker ``name``; ``wrap`` rewrites its command line (e.g. to start it in
        a cgroup of its own)."""
        args = WORKER_COMMANDS[name.rstrip("0123456789")]
        args = [
            a.replace("{name}", name)
            .replace("{host}", self.host)
            .replace("{beat_schedule}", str(self.beat_schedule))
            for a in args
        ]
        argv = [sys.executable, "-m", "celery", "-A", "orchestrator.celery", *args]
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            wrap(argv) if wrap is not None else argv,
            env=self.env,
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
        )
        self.processes[name] = process
        return process

    def wait_ready(self, names: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = {f"{n}@{self.host}" for n in names}
        while time.monotonic() < deadline:
            replies = celery_app.control.ping(timeout=1.0) or []
            if wanted <= {name for reply in replies for name in reply}:
                return
        raise RuntimeError(f"workers {sorted(wanted)} did not answer; logs in {self.log_dir}")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


WORKER_COMMANDS = {
    "control": [
        "worker",
        "-Q",
        "control",
        "--pool",
        "threads",
        "--concurrency",
        "6",
        "-n",
        "{name}@{host}",
        "--loglevel",
        "INFO",
    ],
    "spark": [
        "worker",
        "-Q",
        "spark",
        "--concurrency",
        "1",
        "-n",
        "{name}@{host}",
        "--loglevel",
        "INFO",
    ],
    "beat": ["beat", "--loglevel", "INFO", "--schedule", "{beat_schedule}"],
}


@pytest.fixture(scope="session")
def workers(services: Endpoints, django_db_setup: None) -> Iterator[Workers]:
    env = child_env(services)
    log_dir = TEST_VAR_DIR / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    pool = Workers(env, log_dir)
    try:
        for name in ("control1", "control2", "spark1", "beat"):
            pool.start(name)
        pool.wait_ready(["control1", "control2", "spark1"])
        yield pool
    finally:
        pool.stop()


@dataclass
class AsgiServer:
    """The console's ASGI server (daphne) as a child process on the test services and
    the test database: pages, the API and websockets, as a browser reaches them."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="session")
def asgi_server(services: Endpoints, django_db_setup: None) -> Iterator[AsgiServer]:
    import urllib.request

    from orchestrator.services.embedded import free_port

    port = free_port()
    log_path = TEST_VAR_DIR / "log" / "daphne.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "webapp.asgi:application",
            ],
            # The pages the browser loads from this port may open websockets to it.
            env={**child_env(services), "BPCONSOLE_ALLOWED_ORIGINS": f"http://127.0.0.1:{port}"},
            cwd=PROJECT_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/login/", timeout=2) as answer:  # noqa: S310
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"daphne did not serve {url}; log in {log_path}")
        time.sleep(0.2)
    try:
        yield AsgiServer(url, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession shared by the Spark transform tests."""
    from sparkjobs.session import spark_session

    session = spark_session(master="local[2]", app_name="bpconsole-tests")
    yield session
    session.stop()
