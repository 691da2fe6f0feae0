"""Real Chromium (Debian's package, installed by `make test` when missing) driven by
Playwright's Python package. Never `playwright install`: machines may be offline."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("BPCONSOLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "browser"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make test` (it installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop running in this thread (it switches
    # greenlets; nothing runs concurrently), which Django's async-safety check cannot
    # tell from real async code. Allowed while the browser is up (the database flush
    # after each test included), and undone when this module's browser closes.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(autouse=True)
def _no_stale_control_plane(services: Any) -> None:
    """Run ids restart at 1 with every test database while the test ZooKeeper keeps its
    data between sessions: a new run must not show an old run's flags and routes."""
    from orchestrator.models import Run
    from orchestrator.zk.control_plane import ControlPlane

    with ControlPlane.connect(services.zk_hosts) as control:
        runs = f"{control.root}/runs"
        if control.client.exists(runs) is None:
            return
        for name in control.client.get_children(runs):
            if not (name.isdigit() and Run.objects.filter(pk=int(name)).exists()):
                control.delete_run(name)
