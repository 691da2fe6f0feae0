"""Dynamic stepwise backpressure (docs/spec/stepwise-backpressure.md)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.model import SetSpeed, StepwiseSignal
from balancer.policy import MB, Policy
from balancer.stepwise import (
    StepwiseState,
    TaskSpeed,
    apply_signal,
    speed_floor,
    stepwise_step,
)
from balancer.topology import Topology
from tests.balancer.builders import layered, node, observe

POLICY = Policy()  # overload 50 MB, underload 500 KB, sensitivity 2 s, v = 0.5
OVER = 60 * MB
UNDER = 100 * 1024
BETWEEN = 10 * MB


def with_speeds(
    topology: Topology,
    time_s: float,
    buffered: Mapping[str, float],
    speeds: Mapping[str, TaskSpeed],
):
    """An observation whose tasks report ``speeds`` (their last written task state)."""
    nodes = {
        n: node(
            n,
            buffered_bytes=buffered.get(n, 0.0),
            speed=s.speed,
            origin_speed=s.origin_speed,
            in_backpressure=s.in_backpressure,
        )
        for n, s in speeds.items()
    }
    return observe(topology, time_s, buffered=buffered, nodes=nodes)


def signals_of(actions: list[StepwiseSignal]) -> list[tuple[str, str, str]]:
    return [(a.signal, a.origin, a.target) for a in actions]


def slow(target: str, origin: str = "t") -> StepwiseSignal:
    return StepwiseSignal(reason="", signal="slow", target=target, origin=origin)


def restore(target: str, origin: str = "t") -> StepwiseSignal:
    return StepwiseSignal(reason="", signal="restore", target=target, origin=origin)


def test_an_overloaded_task_slows_each_direct_upstream_and_no_other() -> None:
    # Given s1 -> a1, a2 -> b1 with b1 overloaded
    topology = layered(("s", 1), ("a", 2), ("b", 1))

    actions, _ = stepwise_step(observe(topology, buffered={"b1": OVER}), StepwiseState(), POLICY)

    # Then a1 and a2 are slowed, the source s1 is not
    assert signals_of(actions) == [("slow", "b1", "a1"), ("slow", "b1", "a2")]
    assert (
        actions[0].reason
        == "b1 buffers 60.0 MB >= overload 50.0 MB: slow direct upstream a1 by 0.5"
    )


def test_slow_records_origin_v_and_halves_the_speed() -> None:
    set_speed, speed = apply_signal(slow("a1", "b1"), TaskSpeed(0.8), POLICY)

    assert speed == TaskSpeed(0.4, 0.8, in_backpressure=True)
    assert set_speed == SetSpeed(
        reason="slow from b1: speed 0.8 -> 0.4 (origin 0.8, floor 0.08)",
        node="a1",
        speed=0.4,
        origin_speed=0.8,
        in_backpressure=True,
    )


def test_repeated_overload_halves_and_recovery_doubles_back_to_origin() -> None:
    # Given s1 -> t1, with t1's signals delivered to s1 before the next tick
    topology = layered(("s", 1), ("t", 1))
    state, speed = StepwiseState(), TaskSpeed()
    history = []

    def tick(time_s: float, buffered: float) -> None:
        nonlocal state, speed
        observation = with_speeds(topology, time_s, {"t1": buffered}, {"s1": speed})
        signals, state = stepwise_step(observation, state, POLICY)
        for signal in signals:
            _, speed = apply_signal(signal, speed, POLICY)
        history.append((time_s, speed.speed, speed.in_backpressure))

    # When t1 is overloaded for three evaluations, then underloaded
    for t in (0, 1, 2, 3, 4):
        tick(float(t), OVER)
    for t in range(5, 15):
        tick(float(t), UNDER)

    # Then s1 halves at each evaluation (every 2 s: 0, 2, 4, ...); once t1 has been
    # underloaded for 2 s at an evaluation it doubles back one step per evaluation and
    # leaves backpressure when it is back at its origin speed
    assert history == [
        (0.0, 0.5, True),
        (1.0, 0.5, True),
        (2.0, 0.25, True),
        (3.0, 0.25, True),
        (4.0, 0.125, True),
        (5.0, 0.125, True),
        (6.0, 0.125, True),  # evaluated, but underloaded only since 5 s
        (7.0, 0.125, True),
        (8.0, 0.25, True),
        (9.0, 0.25, True),
        (10.0, 0.5, True),
        (11.0, 0.5, True),
        (12.0, 1.0, False),
        (13.0, 1.0, False),
        (14.0, 1.0, False),
    ]


def test_underload_must_last_without_interruption() -> None:
    topology = layered(("s", 1), ("t", 1))
    in_bp = {"s1": TaskSpeed(0.5, 1.0, in_backpressure=True)}
    state = StepwiseState()

    _, state = stepwise_step(with_speeds(topology, 0.0, {"t1": UNDER}, in_bp), state, POLICY)
    # a load between the thresholds at 1 s breaks the underload
    _, state = stepwise_step(with_speeds(topology, 1.0, {"t1": BETWEEN}, in_bp), state, POLICY)
    _, state = stepwise_step(with_speeds(topology, 1.5, {"t1": UNDER}, in_bp), state, POLICY)
    early, state = stepwise_step(with_speeds(topology, 2.0, {"t1": UNDER}, in_bp), state, POLICY)
    on_time, _ = stepwise_step(with_speeds(topology, 4.0, {"t1": UNDER}, in_bp), state, POLICY)

    assert early == []  # evaluated at 2 s, but underloaded only since 1.5 s
    assert signals_of(on_time) == [("restore", "t1", "s1")]
    assert "for 2.5 s >= sensitivity 2 s" in on_time[0].reason


def test_restore_only_reaches_upstreams_in_backpressure() -> None:
    topology = layered(("a", 2), ("t", 1))
    speeds = {"a1": TaskSpeed(0.5, 1.0, in_backpressure=True), "a2": TaskSpeed()}
    state = StepwiseState(underload_since_s={"t1": 0.0})

    actions, _ = stepwise_step(with_speeds(topology, 5.0, {"t1": UNDER}, speeds), state, POLICY)

    assert signals_of(actions) == [("restore", "t1", "a1")]


def test_a_pending_slow_down_is_not_doubled_by_a_second_overloaded_task() -> None:
    # Given a1 feeding b1 and b2, both overloaded in the same round
    topology = layered(("a", 1), ("b", 2))

    actions, state = stepwise_step(
        observe(topology, 0.0, buffered={"b1": OVER, "b2": OVER}), StepwiseState(), POLICY
    )

    # Then a1 receives a single slow-down
    assert signals_of(actions) == [("slow", "b1", "a1")]
    assert set(state.in_flight) == {"a1"}


def test_a_signal_stays_in_flight_until_the_target_reports_it_applied() -> None:
    # Given b1 and b2 evaluated at different times, both overloaded, both fed by a1
    topology = layered(("a", 1), ("b", 2))
    state = StepwiseState(last_eval_s={"b2": 0.0})
    first, state = stepwise_step(
        observe(topology, 1.0, buffered={"b1": OVER, "b2": OVER}), state, POLICY
    )
    assert signals_of(first) == [("slow", "b1", "a1")]

    # When b2 is due but a1 still reports its old state (the message is queued)
    unapplied, _ = stepwise_step(
        observe(topology, 2.0, buffered={"b1": OVER, "b2": OVER}), state, POLICY
    )
    # Then a1 is skipped
    assert unapplied == []

    # When a1 has reported the slow-down applied, b2's slow-down goes out
    applied = {"a1": TaskSpeed(0.5, 1.0, in_backpressure=True)}
    later, _ = stepwise_step(
        with_speeds(topology, 2.0, {"b1": OVER, "b2": OVER}, applied), state, POLICY
    )
    assert signals_of(later) == [("slow", "b2", "a1")]


def test_a_signal_never_seen_applied_expires_after_one_sensitivity_period() -> None:
    topology = layered(("a", 1), ("b", 1))
    _, state = stepwise_step(observe(topology, 0.0, buffered={"b1": OVER}), StepwiseState(), POLICY)

    actions, state = stepwise_step(observe(topology, 2.0, buffered={"b1": OVER}), state, POLICY)

    assert signals_of(actions) == [("slow", "b1", "a1")]


def test_no_restore_races_a_slow_down_of_the_same_round() -> None:
    # Given a1 in backpressure feeding b1 (long underloaded) and b2 (overloaded)
    topology = layered(("a", 1), ("b", 2))
    speeds = {"a1": TaskSpeed(0.5, 1.0, in_backpressure=True)}
    state = StepwiseState(underload_since_s={"b1": 0.0})

    actions, _ = stepwise_step(
        with_speeds(topology, 5.0, {"b1": UNDER, "b2": OVER}, speeds), state, POLICY
    )

    # Then only the slow-down is sent
    assert signals_of(actions) == [("slow", "b2", "a1")]


def test_an_upstream_at_its_floor_is_not_signalled() -> None:
    topology = layered(("a", 1), ("b", 1))
    at_floor = {"a1": TaskSpeed(0.1, 1.0, in_backpressure=True)}

    actions, state = stepwise_step(
        with_speeds(topology, 0.0, {"b1": OVER}, at_floor), StepwiseState(), POLICY
    )

    assert actions == []
    assert state.in_flight == {}


def test_a_task_is_evaluated_at_most_once_per_sensitivity_period() -> None:
    topology = layered(("a", 1), ("b", 1))
    _, state = stepwise_step(observe(topology, 0.0), StepwiseState(), POLICY)

    # b1 turns overloaded 1 s after an evaluation that found nothing
    actions, state = stepwise_step(observe(topology, 1.0, buffered={"b1": OVER}), state, POLICY)
    assert actions == []

    actions, _ = stepwise_step(observe(topology, 2.0, buffered={"b1": OVER}), state, POLICY)
    assert signals_of(actions) == [("slow", "b1", "a1")]


def test_nodes_that_left_the_observation_are_forgotten() -> None:
    topology = layered(("a", 1), ("b", 1))
    state = StepwiseState(last_eval_s={"gone": 0.0}, underload_since_s={"gone": 0.0})

    _, state = stepwise_step(observe(topology, 0.0, omit=frozenset({"a1"})), state, POLICY)

    assert set(state.last_eval_s) == {"b1"}
    assert set(state.underload_since_s) == {"b1"}


def test_an_unobserved_upstream_is_not_signalled() -> None:
    topology = layered(("a", 1), ("b", 1))
    observation = observe(topology, 0.0, buffered={"b1": OVER}, omit=frozenset({"a1"}))

    actions, _ = stepwise_step(observation, StepwiseState(), POLICY)

    assert actions == []


def test_restore_never_exceeds_origin_v() -> None:
    set_speed, speed = apply_signal(restore("a1"), TaskSpeed(0.75, 1.0, True), POLICY)

    assert speed == TaskSpeed(1.0, 1.0, in_backpressure=False)
    assert set_speed is not None
    assert (
        set_speed.reason == "restore from t: speed 0.75 -> 1 (back at origin, out of backpressure)"
    )


def test_restore_below_origin_stays_in_backpressure() -> None:
    set_speed, speed = apply_signal(restore("a1"), TaskSpeed(0.2, 1.0, True), POLICY)

    assert speed == TaskSpeed(0.4, 1.0, in_backpressure=True)
    assert set_speed is not None
    assert set_speed.reason == "restore from t: speed 0.2 -> 0.4 (origin 1)"


def test_a_stale_restore_is_ignored() -> None:
    assert apply_signal(restore("a1"), TaskSpeed(0.7), POLICY) == (None, TaskSpeed(0.7))


def test_slow_down_stops_at_the_floor() -> None:
    policy = Policy.from_mapping({"backpressure_step": 0.05})

    _, speed = apply_signal(slow("a1"), TaskSpeed(1.0), policy)

    assert speed.speed == pytest.approx(speed_floor(1.0, policy)) == pytest.approx(0.1)


@settings(max_examples=200, deadline=None)
@given(
    v=st.sampled_from([0.05, 0.3, 0.5, 0.7, 0.95]),
    floor=st.sampled_from([0.01, 0.1, 0.2]),
    initial=st.floats(min_value=0.05, max_value=1.0),
    signals=st.lists(st.sampled_from(["slow", "restore"]), max_size=40),
)
def test_speeds_stay_within_floor_and_origin(
    v: float, floor: float, initial: float, signals: list[str]
) -> None:
    policy = Policy.from_mapping({"backpressure_step": v, "rate_floor": floor})
    speed = TaskSpeed(initial, initial)
    for name in signals:
        _, speed = apply_signal(slow("a1") if name == "slow" else restore("a1"), speed, policy)
        if speed.in_backpressure:
            assert speed.origin_speed == initial
            low = speed_floor(initial, policy)
            assert low - 1e-12 <= speed.speed < initial
        else:
            assert speed.speed == initial
