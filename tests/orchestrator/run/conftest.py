"""Fixtures of the run's tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from orchestrator.services.credentials import zk_client
from orchestrator.services.launcher import Endpoints
from orchestrator.zk.control_plane import ControlPlane


@pytest.fixture
def plane(services: Endpoints) -> Iterator[ControlPlane]:
    """A control plane under a root of its own in the session's ZooKeeper, removed after."""
    root = f"/test-{uuid.uuid4().hex}"
    with ControlPlane.connect(services.zk_hosts, root) as plane:
        yield plane
    cleaner = zk_client(services.zk_hosts)
    cleaner.start(10)
    try:
        cleaner.delete(root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()
