"""Adaptive watermarks and flags, as specified in docs/spec/watermark-flags.md."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.model import ClearFlag, SetFlag, SetThresholds
from balancer.policy import Policy
from balancer.watermark import (
    HIGH_RANGE,
    LOW_RANGE,
    WatermarkState,
    _declared_range,
    flags_after,
    watermark_step,
    watermark_tick,
)
from tests.balancer.builders import layered, node, observe

POLICY = Policy()


def kinds(actions: list) -> list[str]:
    return [a.kind for a in actions]


def test_worked_example_watermark_sequence() -> None:
    # Given H=0.7, W=0.2 and a window where 2 of the 4 earlier samples were at or above H
    state = WatermarkState(
        high_water=0.7,
        low_water=0.2,
        sample_times=(1.0, 2.0, 3.0, 4.0),
        sample_above=(False, True, False, True),
        last_sample_s=4.0,
    )

    # When the level is 0.72 (duty 3/5 = 0.6 >= D = 0.5)
    actions, state = watermark_step(node("n", 0.72), 5.0, state, POLICY)

    # Then H and W rise to 0.8/0.3, the flag is set and the window is cleared
    assert (state.high_water, state.low_water) == (0.8, 0.3)
    assert state.sample_times == ()
    assert actions == [
        SetThresholds(
            reason=(
                "level 0.72 >= high water 0.70 (duty 0.60 >= 0.50): thresholds raised to 0.80/0.30"
            ),
            node="n",
            high_water=0.8,
            low_water=0.3,
        ),
        SetFlag(reason="level 0.72 >= high water 0.70: flag set", node="n"),
    ]

    # When the level drops to 0.15 (H is raised)
    actions, state = watermark_step(node("n", 0.15, flagged=True), 6.0, state, POLICY)
    # Then H and W go back to 0.7/0.2, the flag is deleted, the window cleared
    assert (state.high_water, state.low_water) == (0.7, 0.2)
    assert state.sample_times == ()
    assert kinds(actions) == ["set_thresholds", "clear_flag"]

    # When the level is 0.15 again: 0.7 is still above the minimum 0.6
    actions, state = watermark_step(node("n", 0.15), 7.0, state, POLICY)
    assert (state.high_water, state.low_water) == (0.6, 0.1)
    assert kinds(actions) == ["set_thresholds"]

    # When the level is 0.05: H is at its minimum and stays there; the flag stays absent
    actions, state = watermark_step(node("n", 0.05), 8.0, state, POLICY)
    assert (state.high_water, state.low_water) == (0.6, 0.1)
    assert actions == []


def test_duty_counts_only_samples_inside_the_window() -> None:
    # Given a 5 s window sampled every second
    policy = Policy.from_mapping({"bp_window_s": 5.0})
    state = WatermarkState.initial(policy)
    levels = [0.5, 0.5, 0.72, 0.5, 0.72]
    for t, level in enumerate(levels):
        actions, state = watermark_step(node("n", level), float(t), state, policy)
        # duties 0, 0, 1/3, 1/3, 2/5: never enough to raise
        assert not [a for a in actions if isinstance(a, SetThresholds)]
    assert state.duty == pytest.approx(0.4)

    # When the sample at t=0 leaves the window and another high sample arrives
    actions, state = watermark_step(node("n", 0.72, flagged=True), 5.0, state, policy)

    # Then the duty is 3/5 (not 3/6) and the thresholds rise
    assert "duty 0.60" in actions[0].reason
    assert (state.high_water, state.low_water) == (0.8, 0.3)


def test_duty_is_counted_again_from_zero_after_a_reset() -> None:
    # Given thresholds just raised (window cleared) after many high samples
    state = WatermarkState(0.7, 0.2, tuple(map(float, range(10))), (True,) * 10, 9.0)
    _, state = watermark_step(node("n", 0.75, flagged=True), 10.0, state, POLICY)
    assert state.high_water == 0.8

    # When the next samples are below, then at, the new H
    _, state = watermark_step(node("n", 0.5, flagged=True), 11.0, state, POLICY)
    _, state = watermark_step(node("n", 0.5, flagged=True), 12.0, state, POLICY)
    actions, state = watermark_step(node("n", 0.85, flagged=True), 13.0, state, POLICY)

    # Then only the samples since the reset count: duty 1/3, no raise
    assert actions == []
    assert state.high_water == 0.8
    assert state.duty == pytest.approx(1 / 3)


def test_an_empty_window_has_no_duty() -> None:
    assert WatermarkState.initial(POLICY).duty == 0.0


def test_thresholds_adapt_within_the_ranges_declared_in_the_policy() -> None:
    assert (HIGH_RANGE, LOW_RANGE) == ((0.6, 0.9), (0.1, 0.4))
    with pytest.raises(TypeError, match="closed range"):
        _declared_range("bp_window_s")


def test_a_call_within_the_sampling_period_is_ignored() -> None:
    state = WatermarkState.initial(POLICY)
    _, state = watermark_step(node("n", 0.5), 0.0, state, POLICY)

    actions, later = watermark_step(node("n", 0.95), 0.5, state, POLICY)

    assert actions == []
    assert later == state


def test_a_sample_due_up_to_float_noise_early_is_taken() -> None:
    policy = Policy.from_mapping({"sampling_period_s": 0.1})
    state = WatermarkState.initial(policy)
    _, state = watermark_step(node("n", 0.5), 0.2, state, policy)

    # 0.1 + 0.2 is 0.30000000000000004 and 0.3 - 0.2 is 0.09999999999999998
    _, state = watermark_step(node("n", 0.5), 0.3, state, policy)

    assert len(state.sample_times) == 2


def test_raising_at_the_top_of_the_range_changes_no_threshold_but_clears_the_window() -> None:
    state = WatermarkState(0.9, 0.4, (0.0,), (True,), 0.0)

    actions, state = watermark_step(node("n", 0.95, flagged=True), 1.0, state, POLICY)

    assert actions == []
    assert (state.high_water, state.low_water, state.sample_times) == (0.9, 0.4, ())
    assert state.last_sample_s == 1.0


def test_thresholds_clamp_each_to_its_own_range() -> None:
    # Given a gap wider than the ranges allow at the top (H 0.8, W 0.2, step 0.2)
    policy = Policy.from_mapping({"high_water": 0.8, "low_water": 0.2, "watermark_step": 0.2})
    state = WatermarkState.initial(policy)

    _, state = watermark_step(node("n", 0.85), 0.0, state, policy)

    # Then H stops at 0.9 while W moves the full step
    assert (state.high_water, state.low_water) == (0.9, 0.4)


def test_a_flag_present_is_kept_and_not_set_again() -> None:
    state = WatermarkState.initial(POLICY)
    actions, _ = watermark_step(node("n", 0.8, flagged=True), 0.0, state, POLICY)
    assert SetFlag not in map(type, actions)


def test_a_flag_lost_from_zookeeper_is_restored_while_the_level_stays_high() -> None:
    state = WatermarkState(0.9, 0.4)
    actions, state = watermark_step(node("n", 0.95), 0.0, state, POLICY)
    assert kinds(actions) == ["set_flag"]

    # The observation still shows no flag (someone deleted the znode)
    actions, state = watermark_step(node("n", 0.95), 1.0, state, POLICY)

    assert kinds(actions) == ["set_flag"]


def test_a_level_between_the_thresholds_changes_nothing() -> None:
    state = WatermarkState(0.8, 0.3, (0.0,), (True,), 0.0)

    actions, after = watermark_step(node("n", 0.5, flagged=True), 1.0, state, POLICY)

    assert actions == []
    assert (after.high_water, after.low_water) == (0.8, 0.3)
    assert (after.sample_times, after.sample_above) == ((0.0, 1.0), (True, False))


def test_low_level_clears_the_flag_without_moving_thresholds_at_their_minimum() -> None:
    state = WatermarkState(0.6, 0.1)

    actions, after = watermark_step(node("n", 0.05, flagged=True), 0.0, state, POLICY)

    assert actions == [ClearFlag(reason="level 0.05 <= low water 0.10: flag cleared", node="n")]
    assert (after.high_water, after.low_water) == (0.6, 0.1)


def test_tick_covers_compute_nodes_only_and_forgets_removed_nodes() -> None:
    topology = layered(("s", 1), ("b", 2), ("k", 1))
    states = {"gone": WatermarkState(0.9, 0.4)}

    actions, new_states = watermark_tick(
        observe(topology, 0.0, {"s1": 1.0, "b1": 0.9, "b2": 0.5, "k1": 0.5}), states, POLICY
    )

    assert [(a.kind, a.node) for a in actions] == [("set_thresholds", "b1"), ("set_flag", "b1")]
    assert set(new_states) == {"b1", "b2", "k1"}


def test_flags_after_applies_this_ticks_actions_to_the_observed_flags() -> None:
    topology = layered(("s", 1), ("b", 3))
    observation = observe(topology, flagged=frozenset({"b1", "b2"}))

    flagged = flags_after(
        observation, [ClearFlag(reason="", node="b1"), SetFlag(reason="", node="b3")]
    )

    assert flagged == {"b2", "b3"}


policies = st.builds(
    lambda high, low, step, duty, window: Policy.from_mapping(
        {
            "high_water": high,
            "low_water": low,
            "watermark_step": step,
            "duty_ratio": duty,
            "bp_window_s": window,
        }
    ),
    high=st.sampled_from([0.6, 0.65, 0.7, 0.8, 0.9]),
    low=st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.4]),
    step=st.sampled_from([0.05, 0.1, 0.15, 0.3]),
    duty=st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    window=st.sampled_from([1.0, 5.0, 60.0]),
)
levels = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(policy=policies, sequence=st.lists(levels, min_size=1, max_size=60))
def test_thresholds_stay_in_their_ranges_and_move_together(
    policy: Policy, sequence: list[float]
) -> None:
    state = WatermarkState.initial(policy)
    flagged = False
    for t, level in enumerate(sequence):
        before = (state.high_water, state.low_water)
        actions, state = watermark_step(node("n", level, flagged=flagged), float(t), state, policy)
        flagged = flagged_after(flagged, actions)
        d_high, d_low = state.high_water - before[0], state.low_water - before[1]

        assert HIGH_RANGE[0] <= state.high_water <= HIGH_RANGE[1]
        assert LOW_RANGE[0] <= state.low_water <= LOW_RANGE[1]
        assert d_high * d_low >= 0, "H and W moved in opposite directions"
        assert abs(d_high) <= policy.watermark_step + 1e-9
        assert abs(d_low) <= policy.watermark_step + 1e-9
        moved = d_high != 0 or d_low != 0
        assert moved == any(isinstance(a, SetThresholds) for a in actions)


@settings(max_examples=200, deadline=None)
@given(policy=policies, level=levels, initially_flagged=st.booleans())
def test_a_constant_level_never_makes_a_flag_flap(
    policy: Policy, level: float, initially_flagged: bool
) -> None:
    state = WatermarkState.initial(policy)
    flagged = initially_flagged
    history = [flagged]
    for t in range(40):
        actions, state = watermark_step(node("n", level, flagged=flagged), float(t), state, policy)
        flagged = flagged_after(flagged, actions)
        history.append(flagged)

    changes = sum(1 for a, b in itertools.pairwise(history) if a != b)
    assert changes <= 1


def flagged_after(flagged: bool, actions: list) -> bool:
    for action in actions:
        if isinstance(action, SetFlag):
            flagged = True
        elif isinstance(action, ClearFlag):
            flagged = False
    return flagged
