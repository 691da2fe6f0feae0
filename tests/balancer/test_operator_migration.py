"""An operator's "migrate this branch's data now": same choice as the detector's."""

from __future__ import annotations

from balancer.model import Observation
from balancer.policy import Policy
from balancer.pressure import operator_migration
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import node

MBPS = 1_000_000 / 8


def observation(levels: dict[str, float]) -> Observation:
    topology = Topology.build(
        [
            NodeSpec("src", "source"),
            *(NodeSpec(n, stage="agg") for n in ("a1", "a2", "a3")),
            NodeSpec("out", "sink"),
        ],
        [
            LinkSpec("src", "a1", 50 * MBPS),
            LinkSpec("src", "a2", 50 * MBPS),
            LinkSpec("src", "a3", 100 * MBPS),
            LinkSpec("a1", "out", 25 * MBPS),
            LinkSpec("a2", "out", 25 * MBPS),
            LinkSpec("a3", "out", 75 * MBPS),
        ],
    )
    nodes = {n: node(n, levels.get(n, 0.0), buffered_bytes=0.0) for n in topology.order}
    return Observation(0.0, 1.0, topology, nodes)


def test_operator_migration_picks_the_lightest_other_branch() -> None:
    # Given a1 full, a2 half full and a3 empty with the widest links
    action = operator_migration(
        observation({"a1": 0.9, "a2": 0.5, "a3": 0.0}), "a1", Policy(), "vera"
    )
    # Then a1's data goes to a3, and the reason names the operator
    assert action is not None
    assert (action.branch_node, action.heavy, action.light) == ("src", ("a1",), ("a3",))
    assert "operator vera" in action.reason
    assert set(action.scores) == {"a2", "a3"}
    assert action.scores["a3"] < action.scores["a2"]


def test_a_node_on_no_branch_cannot_be_migrated() -> None:
    assert operator_migration(observation({}), "src", Policy(), "vera") is None
    assert operator_migration(observation({}), "out", Policy(), "vera") is None
