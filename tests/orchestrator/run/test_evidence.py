"""An action's event names the nodes it was decided about, in whatever field they sit."""

from __future__ import annotations

from balancer.model import NodeState, SetShares, StartMigration, StepwiseSignal
from orchestrator.run.evidence import observed_for


def state(level: float) -> NodeState:
    return NodeState(
        level=level,
        buffered_bytes=0,
        in_rate=0.0,
        out_rate=0.0,
        high_water=0.8,
        low_water=0.3,
        flagged=False,
        rate_coefficient=1.0,
        speed=1.0,
        origin_speed=1.0,
        in_backpressure=False,
        full_in_s=None,
        capacity_bps=None,
        resource="spark pool",
        busy=None,
        capacity_rps=None,
    )


SEEN = {name: state(i / 10) for i, name in enumerate(["source", "a1", "a2", "b1", "b2", "sink"])}


def test_a_migration_shows_its_branch_node_and_every_branch_it_chose_between() -> None:
    action = StartMigration(
        reason="a1 flagged",
        branch_node="source",
        heavy=("a1", "a2"),
        light=("b1",),
        backpressure_node="a2",
        scores={"a1": 3.0, "b1": 0.5},
        targets={"b1": 1.0},
    )
    assert observed_for(action.to_json(), SEEN) == {
        n: SEEN[n] for n in ["a1", "a2", "b1", "source"]
    }


def test_shares_name_their_downstreams_and_labels_or_prose_name_nothing() -> None:
    shares = SetShares(reason="sink is full", upstream="source", shares={"a1": 0.7, "b1": 0.3})
    assert set(observed_for(shares.to_json(), SEEN)) == {"source", "a1", "b1"}
    # "slow" is a signal, and the reason's words are not nodes even when they match one
    signal = StepwiseSignal(reason="sink", signal="slow", target="a1", origin="b2")
    assert set(observed_for(signal.to_json(), {**SEEN, "slow": state(0)})) == {"a1", "b2"}
