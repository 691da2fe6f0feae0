"""A new driver takes over the shares its predecessor left, never its migrations: its
balancer would not know them, so nothing would end them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from balancer.loop import BalancerState, step
from balancer.model import NodeObservation, StopMigration
from balancer.policy import Policy
from balancer.topology import Topology
from orchestrator.pipeline.graph import balancer_topology
from orchestrator.pipeline.routes import Routes, route
from orchestrator.run.route_store import RouteStore
from tests.balancer.builders import node, observe

DEMO = Path(__file__).resolve().parents[3] / "webapp/console/topologies/landing-demo.yaml"
BRANCHES = ["task1", "task2", "task3"]
# What a dead driver may leave for the source: the shares the demo's run page showed
# after restarts, and the hot branch's peers migrated into it, the full node.
LEFT = {
    "shares": {"task1": 0.05, "task2": 0.46, "task3": 0.49},
    "migrations": {"task2": {"task1": 1.0}, "task3": {"task1": 1.0}},
}


class StoredRoutes:
    """ZooKeeper's routes znodes as the dead driver left them."""

    def __init__(self, tables: dict[str, dict[str, Any]]) -> None:
        self.tables = tables

    def read_routes(self, run: str, node: str) -> tuple[dict[str, Any], int] | None:
        table = self.tables.get(node)
        return None if table is None else (table, 3)


def demo() -> Topology:
    return balancer_topology(yaml.safe_load(DEMO.read_text()))


def restored(tables: dict[str, dict[str, Any]]) -> tuple[RouteStore, dict[str, Any]]:
    store = RouteStore(StoredRoutes(tables), "7")  # type: ignore[arg-type]
    ended = store.restore(demo())
    return store, ended


def sent_to(routes: Routes, segments: int = 2000) -> dict[str, int]:
    counts = dict.fromkeys(BRANCHES, 0)
    for index in range(segments):
        target, _ = route(f"r7.c{index:07d}", "k", BRANCHES, routes)
        counts[target] += 1
    return counts


def hot_branch_full() -> dict[str, NodeObservation]:
    return {"task1": node("task1", 1.0, in_rate=1.2e6, out_rate=1.0e6)}


def test_a_fresh_balancer_never_ends_a_migration_it_did_not_start() -> None:
    # Given the table the dead driver left: every segment goes to the full task1
    assert sent_to(Routes.from_json(LEFT)) == {"task1": 2000, "task2": 0, "task3": 0}
    # When a new driver's balancer (no state) watches the run, task2 and task3 empty
    topology, policy = demo(), Policy(routing="water_level", migration="pressure")
    state, stops = BalancerState(), []
    for tick in range(10):
        observation = observe(topology, tick * 0.2, nodes=hot_branch_full())
        decision = step(observation, state, policy)
        state = decision.state
        stops += [a for a in decision.actions if isinstance(a, StopMigration)]
    # Then it never stops those migrations: only a restore without them frees task2
    # and task3
    assert stops == []


def test_a_restore_keeps_the_shares_and_ends_the_migrations() -> None:
    store, ended = restored({"source": LEFT})
    assert store.get("source") == Routes(LEFT["shares"])
    assert ended == {"source": LEFT["migrations"]}
    counts = sent_to(store.get("source"))
    assert all(counts[branch] > 0 for branch in BRANCHES), counts


def test_nodes_without_a_stored_table_or_migrations_restore_as_they_were() -> None:
    store, ended = restored({"source": {"shares": {"task1": 1.0}, "migrations": {}}})
    assert ended == {}
    assert store.get("source") == Routes({"task1": 1.0})
    assert store.get("task1") == Routes()
