"""The live driver grants credit at the policy's credit interval, between the balancer's
ticks, from the pools as it reads them each loop: a pool a batch emptied is offered to
its upstream at once, as the simulator's credit controller does."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from balancer.model import Action, SetCredits
from balancer.policy import Policy
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import MB
from orchestrator.run.driver import RunDriver

TOPOLOGY = Topology.build(
    [
        NodeSpec("source", "source", capacity_bytes=8 * MB),
        NodeSpec("task1", stage="agg", capacity_bytes=8 * MB),
        NodeSpec("task2", stage="agg", capacity_bytes=8 * MB),
        NodeSpec("sink", "sink", capacity_bytes=8 * MB),
    ],
    [
        *(LinkSpec("source", task) for task in ("task1", "task2")),
        *(LinkSpec(task, "sink") for task in ("task1", "task2")),
    ],
)


@dataclass
class Table:
    applied: list[Action] = field(default_factory=list)

    def apply(self, action: Action) -> None:
        self.applied.append(action)


def driver(throttling: str, pools: dict[str, int]) -> Any:
    return SimpleNamespace(
        policy=Policy.from_mapping({"throttling": throttling}),
        flows={n: SimpleNamespace(queued_bytes=b) for n, b in pools.items()},
        topology=TOPOLOGY,
        table=Table(),
        next_grant=0.0,
    )


def grants(state: Any) -> dict[str, dict[str, float]]:
    return {a.upstream: dict(a.credits) for a in state.table.applied if isinstance(a, SetCredits)}


def test_credit_follows_the_pools_at_the_credit_interval_not_the_tick() -> None:
    state = driver("credit", {"task1": 8 * MB, "task2": 2 * MB})

    RunDriver._grant_credits(state, 10.0)
    assert grants(state)["source"] == {"task1": 0.0, "task2": 6 * MB}

    # task1's batch ended: its pool is empty; within the interval nothing is granted...
    state.flows["task1"].queued_bytes = 0
    state.table.applied.clear()
    RunDriver._grant_credits(state, 10.05)
    assert grants(state) == {}
    # ...at the interval (100 ms by default, a fifth of a tick) its room is credit.
    RunDriver._grant_credits(state, 10.1)
    assert grants(state)["source"] == {"task1": 8 * MB, "task2": 6 * MB}
    # The sink's upstreams get theirs too; a node with no pool yet is empty.
    assert grants(state)["task1"] == {"sink": 4 * MB}


def test_no_credit_is_granted_under_another_throttling() -> None:
    state = driver("stop_resume", {"task1": 0})

    RunDriver._grant_credits(state, 10.0)

    assert state.table.applied == []
