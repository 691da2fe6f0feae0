"""Start what is not configured, record where it is, stop what we started.

``DATABASE_URL``, ``REDIS_URL`` and ``ZK_HOSTS`` name external services; for each one
that is unset the launcher starts the embedded service under the state folder
(``BPCONSOLE_VAR_DIR``, default ``./var``) and records its address in
``services.json`` there, so a ``manage.py`` command run from another shell while the
console is up uses the same services (see :func:`recorded_endpoints`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType

from orchestrator.services.credentials import (
    ZkAddress,
    private_dir,
    secret,
    without_password,
    write_private,
)
from orchestrator.services.embedded import (
    EmbeddedService,
    Postgres,
    Redis,
    ServiceError,
    ZooKeeper,
    check_java,
    free_port,
)

ENV_KEYS = {"postgresql": "DATABASE_URL", "redis": "REDIS_URL", "zookeeper": "ZK_HOSTS"}
DEFAULT_ZK_ROOT = "/bpconsole"
RECORD_FILE = "services.json"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def var_dir_from_env(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("BPCONSOLE_VAR_DIR", str(PROJECT_ROOT / "var"))).resolve()


@dataclass(frozen=True)
class Endpoints:
    database_url: str
    redis_url: str
    zk_hosts: str

    def as_env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "ZK_HOSTS": self.zk_hosts,
        }

    def redacted(self) -> dict[str, str]:
        """:meth:`as_env` with every password left out: what may be printed."""
        return {
            "DATABASE_URL": without_password(self.database_url),
            "REDIS_URL": without_password(self.redis_url),
            "ZK_HOSTS": ZkAddress.parse(self.zk_hosts).redacted(),
        }


@dataclass
class Launcher:
    """Context manager: ``with Launcher(var_dir) as endpoints: ...``."""

    var_dir: Path
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    timeout_s: float = 60.0
    started: list[EmbeddedService] = field(default_factory=list)
    start_seconds: dict[str, float] = field(default_factory=dict)

    def _wanted(self) -> list[EmbeddedService]:
        services: list[EmbeddedService] = []
        logs = self.var_dir / "log"
        if not self.environ.get("DATABASE_URL"):
            services.append(
                Postgres(
                    "postgresql",
                    logs / "postgresql.log",
                    data_dir=self.var_dir / "postgresql" / "data",
                    port=free_port(),
                    password=secret(self.var_dir, "postgresql"),
                    state_dir=self.var_dir,
                )
            )
        if not self.environ.get("REDIS_URL"):
            services.append(
                Redis(
                    "redis",
                    logs / "redis.log",
                    data_dir=self.var_dir / "redis",
                    port=free_port(),
                    password=secret(self.var_dir, "redis"),
                )
            )
        if not self.environ.get("ZK_HOSTS"):
            services.append(
                ZooKeeper(
                    "zookeeper",
                    logs / "zookeeper.log",
                    data_dir=self.var_dir / "zookeeper" / "data",
                    port=free_port(),
                    password=secret(self.var_dir, "zookeeper"),
                    root=self.environ.get("BPCONSOLE_ZK_ROOT", DEFAULT_ZK_ROOT),
                )
            )
        return services

    def start(self) -> Endpoints:
        check_java()
        private_dir(self.var_dir)
        wanted = self._wanted()
        began = time.monotonic()
        try:
            # Launch all first, then wait: the JVM and initdb start in parallel.
            for service in wanted:
                service.launch()
                self.started.append(service)
            deadline = began + self.timeout_s
            for service in wanted:
                service.wait_ready(deadline)
                self.start_seconds[service.name] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        urls = {s.name: s.url() for s in wanted}
        endpoints = Endpoints(
            database_url=self.environ.get("DATABASE_URL") or urls["postgresql"],
            redis_url=self.environ.get("REDIS_URL") or urls["redis"],
            zk_hosts=self.environ.get("ZK_HOSTS") or urls["zookeeper"],
        )
        self._record(endpoints)
        return endpoints

    def _record(self, endpoints: Endpoints) -> None:
        # The URLs hold the embedded services' passwords: the file is 0600 from its start.
        record = {"pid": os.getpid(), **asdict(endpoints)}
        write_private(self.var_dir / RECORD_FILE, json.dumps(record, indent=2))

    def stop(self) -> None:
        record = self.var_dir / RECORD_FILE
        if record.exists() and _recorded_pid(record) == os.getpid():
            record.unlink()
        for service in reversed(self.started):
            service.stop()
        self.started.clear()

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recorded_endpoints(var_dir: Path) -> Endpoints | None:
    """The endpoints a live launcher recorded under ``var_dir``, if its process lives."""
    path = var_dir / RECORD_FILE
    pid = _recorded_pid(path)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    data = json.loads(path.read_text())
    return Endpoints(data["database_url"], data["redis_url"], data["zk_hosts"])


__all__ = ["ENV_KEYS", "Endpoints", "Launcher", "ServiceError", "recorded_endpoints"]
