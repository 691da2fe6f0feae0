"""Operators' commands reach the run's driver through ZooKeeper's queue
(orchestrator/run/commands.py). A command the driver could not carry out because the
database failed under it (a deadlock, a restart) is not lost: it and the commands taken
after it wait in the queue for the driver's next attempt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from django.db import OperationalError

from balancer.policy import Policy
from orchestrator.run.actions import ActionTable
from orchestrator.run.commands import OperatorCommands
from orchestrator.zk.control_plane import ControlPlane
from tests.balancer.builders import layered, observe

pytestmark = pytest.mark.integration

RUN = "7"


class Rescale:
    """The hot-rescale control's door for commands, whose database fails once."""

    current = None

    def __init__(self) -> None:
        self.carried_out: list[str] = []
        self.failures = 1

    def command(self, command: Mapping[str, Any]) -> bool:
        if self.failures:
            self.failures -= 1
            raise OperationalError("deadlock detected")
        self.carried_out.append(command["node"])
        return False


def test_commands_the_database_failed_under_wait_in_the_queue_for_the_next_attempt(
    plane: ControlPlane,
) -> None:
    table = ActionTable(plane, run_id=int(RUN), on_graph_change=lambda: None)
    rescale = Rescale()
    table.rescale = rescale  # type: ignore[assignment]
    commands = OperatorCommands(table, Policy())
    for node in ("a1", "a2"):
        plane.put_command(RUN, {"command": "remove_instance", "node": node, "user": "otto"})
    commands.pending = 2
    seen = observe(layered(("s", 1), ("a", 2), ("k", 1)))

    with pytest.raises(OperationalError):
        commands.handle(seen)
    assert rescale.carried_out == []

    commands.handle(seen)  # the driver's next attempt
    assert rescale.carried_out == ["a1", "a2"]
    assert plane.take_commands(RUN) == []
