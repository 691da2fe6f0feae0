"""Upstream rate coefficient and scale-out trigger (docs/spec/watermark-flags.md)."""

from __future__ import annotations

from balancer.model import ScaleOutRequest, SetRate
from balancer.policy import Policy
from balancer.rate import RateState, rate_step, rate_tick
from tests.balancer.builders import layered, observe

POLICY = Policy()
# u1 feeds the ten instances b1..b10 of stage b.
TOPOLOGY = layered(("u", 1), ("b", 10))


def flags(*numbers: int) -> frozenset[str]:
    return frozenset(f"b{n}" for n in numbers)


def check(state: RateState, flagged: frozenset[str], time_s: float, policy: Policy = POLICY):
    return rate_step("u1", flagged, TOPOLOGY, time_s=time_s, state=state, policy=policy)


def test_more_flags_lower_k_by_one_step() -> None:
    actions, state = check(RateState(1.0), flags(1), 0.0)

    assert state.coefficient == 0.9
    assert actions == [
        SetRate(
            reason="flagged downstreams 0 -> 1: rate coefficient lowered 1.00 -> 0.90",
            node="u1",
            coefficient=0.9,
        )
    ]


def test_fewer_flags_raise_k_by_one_step_and_never_above_one() -> None:
    actions, state = check(RateState(0.5, flagged_count=3), flags(1), 0.0)
    assert state.coefficient == 0.6
    assert [a.coefficient for a in actions] == [0.6]

    actions, state = check(RateState(1.0, flagged_count=3), flags(1), 0.0)
    assert state.coefficient == 1.0
    assert actions == []


def test_an_unchanged_count_changes_nothing_even_if_other_nodes_are_flagged() -> None:
    # b2 replaced b1 in the flags: same count
    actions, state = check(RateState(0.7, flagged_count=1), flags(2) | {"elsewhere"}, 0.0)

    assert actions == []
    assert (state.coefficient, state.flagged_count) == (0.7, 1)


def test_k_walks_down_to_exactly_k_min_then_to_the_floor() -> None:
    # Given ever more flagged downstreams, one more at each check
    state = RateState(1.0)
    coefficients = []
    for count in range(1, 10):
        _, state = check(state, flags(*range(1, count + 1)), float(count))
        coefficients.append(state.coefficient)

    # Then k loses 0.1 per check without float drift: 0.2 is still >= k_min, so the
    # ninth check reaches the floor 0.1 instead of asking for a scale-out
    assert coefficients == [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]


def test_below_k_min_a_half_flagged_stage_asks_for_a_scale_out() -> None:
    # Given k at its floor, below k_min
    actions, state = check(RateState(0.1, flagged_count=4), flags(1, 2, 3, 4, 5), 0.0)

    # 5/10 of stage b flagged >= S = 0.5
    assert actions == [
        ScaleOutRequest(
            reason=(
                "rate coefficient 0.10 < k_min 0.20 and 5/10 of stage b flagged >= 0.50: "
                "one more instance requested"
            ),
            stage="b",
            upstream="u1",
        )
    ]
    assert state.coefficient == 0.1


def test_below_k_min_a_stage_under_the_scale_out_ratio_asks_nothing() -> None:
    actions, _ = check(RateState(0.1, flagged_count=3), flags(1, 2, 3, 4), 0.0)
    assert actions == []


def test_between_floor_and_k_min_more_flags_scale_out_instead_of_slowing() -> None:
    policy = Policy.from_mapping({"rate_min": 0.5})

    actions, state = check(RateState(0.4, flagged_count=5), flags(*range(1, 7)), 0.0, policy)

    assert [type(a) for a in actions] == [ScaleOutRequest]
    assert state.coefficient == 0.4


def test_a_floor_equal_to_k_min_still_reaches_the_scale_out() -> None:
    policy = Policy.from_mapping({"rate_min": 0.2, "rate_floor": 0.2})

    actions, state = check(RateState(0.2, flagged_count=5), flags(*range(1, 7)), 0.0, policy)

    assert [type(a) for a in actions] == [ScaleOutRequest]
    assert "at the floor 0.20" in actions[0].reason
    assert state.coefficient == 0.2


def test_the_scale_out_ratio_is_over_every_parallel_node_of_the_stage() -> None:
    # u1 feeds only c1, c2 of the four instances of stage c
    topology = layered(("u", 1), ("c", 2))
    wide = layered(("u", 1), ("c", 4))
    narrow = type(topology).build(wide.nodes, [lk for lk in wide.links if lk.dst in {"c1", "c2"}])
    state = RateState(0.1, flagged_count=1)

    half, _ = rate_step(
        "u1", frozenset({"c1", "c2"}), narrow, time_s=0.0, state=state, policy=POLICY
    )
    strict = Policy.from_mapping({"scale_out_ratio": 0.6})
    none, _ = rate_step(
        "u1", frozenset({"c1", "c2"}), narrow, time_s=0.0, state=state, policy=strict
    )

    assert [(a.stage, "2/4" in a.reason) for a in half] == [("c", True)]
    assert none == []


def test_checks_at_most_once_per_sampling_period() -> None:
    _, state = check(RateState(1.0), flags(1), 0.0)

    actions, later = check(state, flags(1, 2), 0.5)
    assert actions == []
    assert later == state

    actions, _ = check(state, flags(1, 2), 1.0)
    assert [a.coefficient for a in actions] == [0.8]


def test_tick_checks_every_node_with_downstreams() -> None:
    topology = layered(("s", 1), ("a", 2), ("k", 1))
    observation = observe(topology, 3.0)

    # Given a1 (fed by s1) and k1 (fed by a1 and a2) flagged; a1 already slowed to 0.5
    actions, states = rate_tick(
        observation, frozenset({"a1", "k1"}), {"a1": RateState(0.5)}, POLICY
    )

    # Then each upstream lowers its own k; the sink k1 has no rate to set
    assert [(a.node, a.coefficient) for a in actions] == [("s1", 0.9), ("a1", 0.4), ("a2", 0.9)]
    assert set(states) == {"s1", "a1", "a2"}
    assert states["a2"] == RateState(0.9, 1, 3.0)


def test_a_check_that_finds_the_same_count_does_not_delay_the_next_change() -> None:
    # Given k lowered at 0 s, and the same flags seen again at 1 s
    _, state = check(RateState(1.0), flags(1), 0.0)
    _, state = check(state, flags(1), 1.0)

    # When a second flag appears at 1.5 s (a sampling period after the last change)
    actions, _ = check(state, flags(1, 2), 1.5)

    # Then k moves at once
    assert [a.coefficient for a in actions] == [0.8]
