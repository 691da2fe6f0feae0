"""Shared fixtures: real services started by the project's own launcher.

Pure tests (balancer/, the simulator) start nothing. The first test that needs the
database, Redis or ZooKeeper starts the embedded services once for the session under
``var/test`` (or uses DATABASE_URL / REDIS_URL / ZK_HOSTS when set), and the session
stops them at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from orchestrator.launcher import PROJECT_ROOT, Endpoints, Launcher
from webapp.settings.env import database_from_url

TEST_VAR_DIR = Path(os.environ.get("BPCONSOLE_TEST_VAR_DIR", str(PROJECT_ROOT / "var" / "test")))


@pytest.fixture(scope="session")
def services() -> Iterator[Endpoints]:
    launcher = Launcher(TEST_VAR_DIR, environ=dict(os.environ))
    endpoints = launcher.start()
    settings.REDIS_URL = endpoints.redis_url
    settings.ZK_HOSTS = endpoints.zk_hosts
    settings.CELERY_BROKER_URL = endpoints.redis_url
    settings.CELERY_RESULT_BACKEND = endpoints.redis_url
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [endpoints.redis_url]
    try:
        yield endpoints
    finally:
        launcher.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(services: Endpoints) -> None:
    # Mutate in place: Django's connection handler holds this very dict.
    settings.DATABASES["default"].update(database_from_url(services.database_url))


@pytest.fixture
def service_env(services: Endpoints, django_db_setup: None) -> dict[str, str]:
    """Environment for a child process (manage.py, a worker) using the test services and
    the test database. Pair it with ``transactional_db`` so the child sees the rows."""
    server, _, _ = services.database_url.rpartition("/")
    return {
        **os.environ,
        **services.as_env(),
        "DATABASE_URL": f"{server}/{settings.DATABASES['default']['NAME']}",
        "DJANGO_SETTINGS_MODULE": "webapp.settings.test",
        "BPCONSOLE_VAR_DIR": str(TEST_VAR_DIR),
    }
