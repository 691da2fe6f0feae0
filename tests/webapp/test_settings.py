"""Production settings pass Django's deployment checks; secrets come from the environment."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from orchestrator.services.launcher import PROJECT_ROOT
from webapp.console.checks import RUNNING_AS_ROOT, check_not_root
from webapp.settings.env import env_seconds, full_origins


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


PRODUCTION = {
    "DJANGO_SETTINGS_MODULE": "webapp.settings.production",
    "SECRET_KEY": "x" * 64 + "-not-a-real-secret-" + "y" * 20,
    "ALLOWED_HOSTS": "console.example.org",
}


def test_production_passes_check_deploy() -> None:
    # (the test machine may run as root: that warning has its own tests below)
    result = _check({**PRODUCTION, "BPCONSOLE_SILENCED_CHECKS": RUNNING_AS_ROOT})
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_deploy_warns_when_the_console_runs_as_root(monkeypatch) -> None:
    # Given a process whose effective user is root
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    # Then the check warns, and `check --deploy` includes it (a plain `check` does not)
    [warning] = check_not_root()
    assert warning.level == checks.WARNING and warning.id == RUNNING_AS_ROOT
    assert "runs as root" in warning.msg and "unprivileged user" in warning.hint
    deploy = checks.run_checks(include_deployment_checks=True, tags=[checks.Tags.security])
    assert RUNNING_AS_ROOT in {m.id for m in deploy}
    assert RUNNING_AS_ROOT not in {m.id for m in checks.run_checks()}


def test_the_root_check_is_quiet_for_an_unprivileged_user(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert check_not_root() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="shows only when the test runs as root")
def test_production_check_deploy_fails_on_root_unless_silenced() -> None:
    result = _check(PRODUCTION)
    assert result.returncode != 0
    assert RUNNING_AS_ROOT in result.stderr + result.stdout


def test_a_celery_worker_started_as_root_logs_a_warning(monkeypatch, caplog) -> None:
    import weakref

    from celery.signals import worker_ready

    from orchestrator.celery import _warn_when_root

    # The warning runs when a worker is ready (not sent here: other receivers register
    # the worker in ZooKeeper)
    receivers = [r() if isinstance(r, weakref.ref) else r for _, r in worker_ready.receivers]
    assert _warn_when_root in receivers
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with caplog.at_level(logging.WARNING, logger="orchestrator.celery"):
        _warn_when_root(sender=None)
    assert "runs as root" in caplog.text


def test_websocket_origins_must_be_full_origins() -> None:
    # scheme, host and port are kept (lower case); anything less exact is refused
    assert full_origins("X", ["HTTP://127.0.0.1:8000/", "https://console.example.org"]) == [
        "http://127.0.0.1:8000",
        "https://console.example.org",
    ]
    for wrong in (
        "127.0.0.1",
        "*",
        "https://*.example.org",
        "http://.example.org",
        "ftp://h",
        "https://h/path",
        "https://user@h",
        "http://h:port",
    ):
        with pytest.raises(ImproperlyConfigured, match="is not an origin"):
            full_origins("BPCONSOLE_ALLOWED_ORIGINS", [wrong])


def test_production_refuses_to_start_without_a_secret_key() -> None:
    env = {"DJANGO_SETTINGS_MODULE": "webapp.settings.production", "SECRET_KEY": ""}
    result = _check(env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf", "", "1e999"])
def test_a_duration_that_is_not_a_number_of_seconds_is_refused(monkeypatch, raw: str) -> None:
    monkeypatch.setenv("BPCONSOLE_DRIVER_START_S", raw)
    with pytest.raises(ImproperlyConfigured, match=r"BPCONSOLE_DRIVER_START_S=.* seconds"):
        env_seconds("BPCONSOLE_DRIVER_START_S", 30.0)


def test_a_duration_is_read_in_seconds_or_defaults(monkeypatch) -> None:
    monkeypatch.setenv("BPCONSOLE_DRIVER_START_S", "12.5")
    assert env_seconds("BPCONSOLE_DRIVER_START_S", 30.0) == 12.5
    monkeypatch.delenv("BPCONSOLE_DRIVER_START_S")
    assert env_seconds("BPCONSOLE_DRIVER_START_S", 30.0) == 30.0


def test_the_data_folder_is_not_an_input_root_by_default(tmp_path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"BPCONSOLE_INPUT_ROOTS", "BPCONSOLE_DATA_DIR"}
    }
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.INPUT_ROOTS); print(settings.DATA_DIR)",
        ],
        cwd=PROJECT_ROOT,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "webapp.settings.test",
            "BPCONSOLE_VAR_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        check=True,
    )
    roots, data = shown.stdout.splitlines()
    assert roots == repr([str(tmp_path / "inputs")])
    assert data == str(tmp_path / "data")


@pytest.mark.parametrize("raw", ["-1", "101", "four"])
def test_a_warm_up_round_count_out_of_range_stops_the_console_saying_why(raw: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "BPCONSOLE_SPARK_WARM_UP_ROUNDS": raw},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "BPCONSOLE_SPARK_WARM_UP_ROUNDS" in result.stderr
