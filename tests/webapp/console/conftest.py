"""Fixtures shared by the console's tests."""

from __future__ import annotations

import pytest

from orchestrator import service


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Runs are created for real but not handed to a worker (none runs in these tests)."""
    started: list[int] = []
    monkeypatch.setattr(service, "start_run", lambda run: started.append(run.pk))
    return started
