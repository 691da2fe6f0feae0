"""Production settings pass Django's deployment checks; secrets come from the environment."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.launcher import PROJECT_ROOT


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_production_passes_check_deploy() -> None:
    result = _check(
        {
            "DJANGO_SETTINGS_MODULE": "webapp.settings.production",
            "SECRET_KEY": "x" * 64 + "-not-a-real-secret-" + "y" * 20,
            "ALLOWED_HOSTS": "console.example.org",
        }
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_to_start_without_a_secret_key() -> None:
    env = {"DJANGO_SETTINGS_MODULE": "webapp.settings.production", "SECRET_KEY": ""}
    result = _check(env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
