"""What the balancer sees of a run's pipeline document: a keyed stage is not balanced.

Routing into a keyed (stateful) stage follows key groups, so shifting its shares or
migrating data into one of its instances would change nothing but what the console
shows. The balancer must leave it alone, while an aggregating stage stays balanced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from balancer.model import StartMigration
from balancer.policy import MB, Policy
from balancer.pressure import MigrationState, migration_step
from balancer.shares import interchangeable_groups
from orchestrator.pipeline.graph import balancer_topology
from tests.balancer.builders import node, observe

TOPOLOGIES = Path(__file__).resolve().parents[3] / "webapp/console/topologies"
PRESSURE = Policy(migration="pressure")


def demo(name: str) -> dict[str, Any]:
    return yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text())


def aggregating_twin() -> dict[str, Any]:
    """The running-totals demo with its stage made of plain aggregators."""
    doc = demo("running-totals")
    for item in doc["nodes"]:
        if item.get("operator") == "running":
            item["operator"] = "aggregate"
    return doc


def overloaded_first_instance(doc: dict[str, Any]) -> list[Any]:
    topology = balancer_topology(doc)
    observation = observe(
        topology,
        1.0,
        nodes={
            "totals1": node("totals1", 0.95, in_rate=8 * MB, out_rate=2 * MB),
            "totals2": node("totals2", 0.1, in_rate=1 * MB, out_rate=4 * MB),
        },
    )
    actions, _ = migration_step(observation, MigrationState(), PRESSURE)
    return actions


def test_a_keyed_stage_is_never_rebalanced_nor_sent_migrated_data() -> None:
    doc = demo("running-totals")

    assert interchangeable_groups(balancer_topology(doc)) == []
    assert overloaded_first_instance(doc) == []


def test_the_same_stage_of_aggregators_is_balanced_and_takes_migrated_data() -> None:
    doc = aggregating_twin()

    assert interchangeable_groups(balancer_topology(doc)) == [
        ("source", "totals", ("totals1", "totals2"))
    ]
    (start,) = overloaded_first_instance(doc)
    assert isinstance(start, StartMigration)
    assert (start.heavy, start.light) == (("totals1",), ("totals2",))
