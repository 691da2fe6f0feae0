"""Water-level rebalancing of traffic shares (docs/spec/watermark-flags.md, last part)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.model import Observation, SetShares
from balancer.policy import MB, Policy
from balancer.shares import interchangeable_groups, measured_tick, rebalance, shares_tick
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import layered, node, observe

POLICY = Policy()
THIRD = 1 / 3


def test_worked_example_levels_05_02_02() -> None:
    # Given levels 0.5, 0.2, 0.2 and equal shares
    levels = {"b1": 0.5, "b2": 0.2, "b3": 0.2}

    actions, shares = rebalance("a1", "b", levels, None, policy=POLICY)

    # Then b1 gives 0.1 of its share, split evenly between b2 and b3
    assert shares == pytest.approx({"b1": 0.3, "b2": 0.35, "b3": 0.35})
    assert sum(shares.values()) == pytest.approx(1.0)
    assert actions == [
        SetShares(
            reason=(
                "b1 has the highest level 0.50 (lowest peer 0.20): 0.033 of its share "
                "moved to 2 lower-level peer(s)"
            ),
            upstream="a1",
            shares=shares,
            stage="b",
        )
    ]


def test_the_emptiest_peer_gets_the_most() -> None:
    levels = {"b1": 0.5, "b2": 0.3, "b3": 0.1}

    _, shares = rebalance("a1", "b", levels, None, policy=POLICY)

    gain_b2, gain_b3 = shares["b2"] - THIRD, shares["b3"] - THIRD
    assert gain_b3 == pytest.approx(2 * gain_b2)
    assert shares["b1"] == pytest.approx(0.3)


def test_equal_levels_leave_the_shares_alone() -> None:
    current = {"b1": 0.5, "b2": 0.3, "b3": 0.2}

    actions, shares = rebalance("a1", "b", dict.fromkeys(current, 0.4), current, policy=POLICY)

    assert actions == []
    assert shares == current


def test_the_heavy_node_gives_until_min_share_and_no_further() -> None:
    current = {"b1": 0.055, "b2": 0.945}
    levels = {"b1": 0.9, "b2": 0.1}

    _, shares = rebalance("a1", "b", levels, current, policy=POLICY)
    assert shares["b1"] == pytest.approx(0.05)

    actions, again = rebalance("a1", "b", levels, shares, policy=POLICY)
    assert actions == []
    assert again == shares


def test_a_group_too_large_for_min_share_keeps_half_the_equal_split_as_floor() -> None:
    # Given 40 instances: 40 * 0.05 > 1, so min_share cannot hold for all of them
    members = [f"b{i}" for i in range(1, 41)]
    levels = {m: 0.1 for m in members} | {"b1": 0.9}
    shares = None

    # When b1 stays the fullest for many ticks
    for _ in range(100):
        _, shares = rebalance("a1", "b", levels, shares, policy=POLICY)

    # Then it gives down to half its equal share, 1/80, and no further
    assert shares["b1"] == pytest.approx(1 / 80)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_a_group_of_exactly_one_over_min_share_sits_at_its_floor() -> None:
    members = [f"b{i}" for i in range(1, 21)]
    levels = {m: 0.1 for m in members} | {"b1": 0.9}

    actions, shares = rebalance("a1", "b", levels, None, policy=POLICY)

    assert actions == []
    assert shares == pytest.approx(dict.fromkeys(members, 0.05))


def test_a_draining_node_goes_to_zero_and_its_peers_absorb_its_share() -> None:
    current = {"b1": 0.2, "b2": 0.2, "b3": 0.6}
    levels = dict.fromkeys(current, 0.3)

    actions, shares = rebalance(
        "a1", "b", levels, current, policy=POLICY, draining=frozenset({"b1"})
    )

    # b2 and b3 keep their 1:3 split
    assert shares == pytest.approx({"b1": 0.0, "b2": 0.25, "b3": 0.75})
    assert "draining b1" in actions[0].reason


def test_peers_with_nothing_split_a_drained_share_evenly() -> None:
    current = {"b1": 1.0, "b2": 0.0, "b3": 0.0}
    draining = frozenset({"b1", "b2"})

    _, shares = rebalance(
        "a1", "b", dict.fromkeys(current, 0.0), current, policy=POLICY, draining=draining
    )

    assert shares == pytest.approx({"b1": 0.0, "b2": 0.0, "b3": 1.0})


def test_a_node_back_from_draining_is_raised_to_the_minimum_share() -> None:
    current = {"b1": 0.0, "b2": 0.4, "b3": 0.6}

    actions, shares = rebalance("a1", "b", dict.fromkeys(current, 0.2), current, policy=POLICY)

    # b2 and b3 pay for b1's 0.05 in proportion to their excess over the floor (0.35:0.55)
    assert shares["b1"] == pytest.approx(0.05)
    assert shares["b2"] == pytest.approx(0.4 - 0.05 * 0.35 / 0.9)
    assert shares["b3"] == pytest.approx(0.6 - 0.05 * 0.55 / 0.9)
    assert "b1 raised to the minimum share" in actions[0].reason


def test_every_member_draining_keeps_routing_as_it_is() -> None:
    current = {"b1": 0.5, "b2": 0.5}

    actions, shares = rebalance(
        "a1", "b", {"b1": 0.9, "b2": 0.1}, current, policy=POLICY, draining=frozenset(current)
    )

    assert actions == []
    assert shares == current


def test_shares_for_another_set_of_members_restart_equal() -> None:
    # Given shares from before b3 was added
    current = {"b1": 0.7, "b2": 0.3}

    actions, shares = rebalance(
        "a1", "b", {"b1": 0.2, "b2": 0.2, "b3": 0.2}, current, policy=POLICY
    )

    assert shares == pytest.approx(dict.fromkeys(["b1", "b2", "b3"], THIRD))
    assert actions[0].reason == "members of stage b changed: shares reset to equal"


def test_groups_are_per_upstream_and_stage_and_only_mergeable() -> None:
    nodes = [
        NodeSpec("s1", kind="source"),
        NodeSpec("m1", stage="m"),
        NodeSpec("m2", stage="m"),
        NodeSpec("k1", stage="k", mergeable=False),
        NodeSpec("k2", stage="k", mergeable=False),
        NodeSpec("x1", stage="x"),
    ]
    links = [LinkSpec("s1", n) for n in ("m1", "m2", "k1", "k2", "x1")]
    links += [LinkSpec("m1", "x1"), LinkSpec("m2", "x1")]

    groups = interchangeable_groups(Topology.build(nodes, links))

    # k is not mergeable, x has a single instance
    assert groups == [("s1", "m", ("m1", "m2"))]


def test_tick_rebalances_every_upstream_and_keeps_groups_it_cannot_see() -> None:
    topology = layered(("a", 2), ("b", 3))
    levels = {"b1": 0.5, "b2": 0.2, "b3": 0.2}

    actions, shares = shares_tick(observe(topology, 0.0, levels), {}, POLICY)

    assert [(a.upstream, a.stage) for a in actions] == [("a1", "b"), ("a2", "b")]
    assert shares[("a1", "b")] == pytest.approx({"b1": 0.3, "b2": 0.35, "b3": 0.35})

    # When b3 is not observed, the shares in force stay
    actions, later = shares_tick(observe(topology, 1.0, omit=frozenset({"b3"})), shares, POLICY)
    assert actions == []
    assert later == shares

    # and a group never balanced before has nothing to keep
    actions, later = shares_tick(observe(topology, 1.0, omit=frozenset({"b3"})), {}, POLICY)
    assert later == {}


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=2, max_value=25),
    rounds=st.lists(
        st.tuples(
            st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=25, max_size=25),
            st.sets(st.integers(0, 24), max_size=3),
        ),
        min_size=1,
        max_size=15,
    ),
    step=st.sampled_from([0.05, 0.1, 0.5, 1.0]),
    min_share=st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.45]),
)
def test_shares_sum_to_one_and_respect_the_minimum(
    size: int, rounds: list[tuple[list[float], set[int]]], step: float, min_share: float
) -> None:
    policy = Policy.from_mapping({"balance_step": step, "min_share": min_share})
    members = [f"b{i}" for i in range(size)]
    floor = min_share if size * min_share <= 1 else 1 / (2 * size)
    shares: dict[str, float] | None = None
    for level_values, draining_index in rounds:
        levels = dict(zip(members, level_values, strict=False))
        draining = frozenset(members[i] for i in draining_index if i < size)
        _, shares = rebalance("a1", "b", levels, shares, policy=policy, draining=draining)

        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
        active = [m for m in members if m not in draining]
        if active:
            assert all(shares[m] >= floor - 1e-9 for m in active)
            assert all(shares[m] == 0.0 for m in draining)


def test_upstreams_of_one_stage_with_different_shares_are_balanced_separately() -> None:
    topology = layered(("a", 2), ("b", 2))
    levels = {"b1": 0.6, "b2": 0.2}
    shares = {("a1", "b"): {"b1": 0.8, "b2": 0.2}}

    _, new = shares_tick(observe(topology, 0.0, levels), shares, POLICY)

    assert new[("a1", "b")] == pytest.approx({"b1": 0.72, "b2": 0.28})
    assert new[("a2", "b")] == pytest.approx({"b1": 0.45, "b2": 0.55})


def test_shares_in_force_that_do_not_sum_to_one_are_renormalised() -> None:
    # Given shares rounded somewhere on their way (they sum to 0.99)
    current = {"b1": 0.5, "b2": 0.49}

    _, shares = rebalance("a1", "b", {"b1": 0.9, "b2": 0.1}, current, policy=POLICY)

    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-12)
    assert shares["b1"] == pytest.approx(0.45 / 0.99)


# --- routing = measured: shares in proportion to measured capacities ---------------------


def measured(rates: dict[str, float], **kwargs: object) -> Observation:
    """Stage b of three instances (b1..b3) behind one source, each on a worker of its own
    at the given rates unless ``resources`` says otherwise."""
    resources = kwargs.get("resources") or {}
    topology = layered(("a", 1), ("b", 3), ("c", 1))
    nodes = {
        n: node(n, capacity_bps=rate, resource=resources.get(n, f"w-{n}"))  # type: ignore[union-attr]
        for n, rate in rates.items()
    }
    return observe(topology, nodes=nodes, draining=kwargs.get("draining", frozenset()))  # type: ignore[arg-type]


def test_measured_shares_follow_the_instances_true_rates() -> None:
    seen = measured({"b1": 6 * MB, "b2": 3 * MB, "b3": 1.5 * MB})

    actions, shares = measured_tick(seen, {}, Policy())

    assert {m: round(v, 3) for m, v in shares[("a1", "b")].items()} == {
        "b1": 0.571,
        "b2": 0.286,
        "b3": 0.143,
    }
    (action,) = actions
    assert isinstance(action, SetShares) and action.upstream == "a1"
    assert "b1 6.00, b2 3.00, b3 1.50" in action.reason


def test_measured_shares_wait_for_every_rate_and_ignore_noise() -> None:
    unmeasured = measured({"b1": 6 * MB, "b2": math.inf, "b3": 1.5 * MB})
    assert measured_tick(unmeasured, {}, Policy()) == ([], {})

    _, shares = measured_tick(measured({"b1": 6 * MB, "b2": 3 * MB, "b3": 1.5 * MB}), {}, Policy())
    # A few per cent of noise in the estimates moves nothing.
    noisy = measured({"b1": 6.1 * MB, "b2": 2.95 * MB, "b3": 1.5 * MB})
    actions, kept = measured_tick(noisy, shares, Policy())
    assert actions == [] and kept == shares
    # A worker that slowed down does.
    slower = measured({"b1": 2 * MB, "b2": 3 * MB, "b3": 1.5 * MB})
    actions, moved = measured_tick(slower, shares, Policy())
    assert len(actions) == 1 and moved[("a1", "b")]["b2"] > moved[("a1", "b")]["b1"]


def test_measured_shares_keep_the_floor_and_split_a_shared_resource_evenly() -> None:
    seen = measured(
        {"b1": 8 * MB, "b2": 8 * MB, "b3": 0.01 * MB}, resources={"b1": "w1", "b2": "w1"}
    )
    _, shares = measured_tick(seen, {}, Policy())
    split = shares[("a1", "b")]
    assert math.isclose(split["b1"], split["b2"])
    assert math.isclose(split["b3"], Policy().min_share)
    assert math.isclose(sum(split.values()), 1.0)


def test_a_drained_member_gets_no_measured_share() -> None:
    seen = measured({"b1": 4 * MB, "b2": 4 * MB, "b3": 4 * MB}, draining=frozenset({"b3"}))
    _, shares = measured_tick(seen, {}, Policy())
    assert shares[("a1", "b")] == {"b1": 0.5, "b2": 0.5, "b3": 0.0}


@settings(max_examples=60)
@given(st.lists(st.floats(0.01, 100.0), min_size=3, max_size=3))
def test_measured_shares_sum_to_one_above_the_floor(rates: list[float]) -> None:
    seen = measured({f"b{i + 1}": r * MB for i, r in enumerate(rates)})
    _, shares = measured_tick(seen, {}, Policy())
    # Shares within the noise of the equal split in force stay as they are.
    split = shares.get(("a1", "b"), dict.fromkeys(("b1", "b2", "b3"), 1 / 3))
    assert math.isclose(sum(split.values()), 1.0)
    assert min(split.values()) >= Policy().min_share - 1e-12
