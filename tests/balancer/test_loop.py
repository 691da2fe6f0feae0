"""The balancer tick: how the throttling, routing and migration layers compose."""

from __future__ import annotations

import sys

import pytest

from balancer.loop import BalancerState, Decision, forget, step
from balancer.model import NodeObservation, Observation
from balancer.policy import MB, Policy
from balancer.pressure import MigrationState, migration_step
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import layered, node, observe

QUIET = {"routing": "static", "migration": "off"}
# s1 feeds b1, b2 (one interchangeable stage), which feed the sink k1
FAN = layered(("s", 1), ("b", 2), ("k", 1))


def policy(**values: str) -> Policy:
    return Policy.from_mapping({**QUIET, **values})


def kinds(decision: Decision) -> list[str]:
    return [a.kind for a in decision.actions]


def experiment(time_s: float = 0.0, **nodes: NodeObservation) -> Observation:
    """The published 5-node topology: 0 -> 1, 2, 3 -> 4 (see pressure-migration.md)."""
    mbit = 1_000_000 / 8
    bandwidths = {("0", "1"): 50, ("0", "2"): 50, ("0", "3"): 100}
    bandwidths |= {("1", "4"): 25, ("2", "4"): 25, ("3", "4"): 75}
    topology = Topology.build(
        [NodeSpec("0", kind="source"), *(NodeSpec(n) for n in "123"), NodeSpec("4", kind="sink")],
        [LinkSpec(src, dst, bw * mbit) for (src, dst), bw in bandwidths.items()],
    )
    observed = {n.id: node(n.id) for n in topology.nodes} | nodes
    return Observation(time_s=time_s, interval_s=1.0, topology=topology, nodes=observed)


@pytest.mark.parametrize("throttling", ["none", "window"])
def test_without_a_tick_level_throttling_a_full_pipeline_gets_no_action(throttling: str) -> None:
    observation = observe(FAN, 0.0, {"b1": 1.0, "b2": 1.0, "k1": 1.0})

    decision = step(observation, BalancerState(), policy(throttling=throttling))

    assert decision.actions == []
    assert decision.state == BalancerState()


def test_watermark_throttling_slows_the_upstream_on_the_flag_raised_in_the_same_tick() -> None:
    observation = observe(FAN, 0.0, {"b1": 0.9, "b2": 0.5, "k1": 0.5})

    decision = step(observation, BalancerState(), policy(throttling="watermark"))

    assert kinds(decision) == ["set_thresholds", "set_flag", "set_rate"]
    assert [a.coefficient for a in decision.actions if a.kind == "set_rate"] == [0.9]
    assert decision.state.rates["s1"].coefficient == 0.9
    assert set(decision.state.watermarks) == {"b1", "b2", "k1"}


def test_stepwise_throttling_signals_direct_upstreams() -> None:
    observation = observe(FAN, 0.0, buffered={"k1": 60 * MB})

    decision = step(observation, BalancerState(), policy(throttling="stepwise"))

    assert [(a.kind, a.signal, a.target) for a in decision.actions] == [
        ("stepwise_signal", "slow", "b1"),
        ("stepwise_signal", "slow", "b2"),
    ]
    assert set(decision.state.stepwise.in_flight) == {"b1", "b2"}


def test_credit_throttling_grants_credits() -> None:
    decision = step(observe(FAN, 0.0), BalancerState(), policy(throttling="credit"))

    assert kinds(decision) == ["set_credits", "set_credits", "set_credits"]
    assert decision.state.credit.last_grant_s == 0.0


def test_stop_resume_throttling_stops_upstreams_of_a_full_queue() -> None:
    decision = step(
        observe(FAN, 0.0, {"k1": 1.0}), BalancerState(), policy(throttling="stop_resume")
    )

    assert [(a.node, a.coefficient) for a in decision.actions] == [("b1", 0.0), ("b2", 0.0)]
    assert decision.state.stop_resume.holding == {"k1"}


def test_water_level_routing_shifts_shares_and_static_routing_does_not() -> None:
    observation = observe(FAN, 0.0, {"b1": 0.5, "b2": 0.2})

    static = step(observation, BalancerState(), policy(throttling="none"))
    water = step(observation, BalancerState(), policy(throttling="none", routing="water_level"))

    assert static.actions == []
    assert kinds(water) == ["set_shares"]
    assert water.state.shares[("s1", "b")]["b1"] == pytest.approx(0.45)


def test_pressure_migration_is_delegated_to_the_migration_module() -> None:
    # Given branch 1 in backpressure: 90% full and filling
    observation = experiment(**{"1": node("1", 0.9, in_rate=6e6, out_rate=3e6)})
    run = policy(throttling="none", migration="pressure")

    decision = step(observation, BalancerState(), run)

    expected, migration = migration_step(observation, MigrationState(), run)
    assert decision.actions == expected
    assert kinds(decision) == ["start_migration"]
    assert decision.state.migration == migration


def test_turning_migration_off_stops_the_migrations_under_way() -> None:
    observation = experiment(**{"1": node("1", 0.9, in_rate=6e6, out_rate=3e6)})
    running = step(observation, BalancerState(), policy(throttling="none", migration="pressure"))

    stopped = step(observation, running.state, policy(throttling="none"))

    assert kinds(stopped) == ["stop_migration"]
    assert stopped.state.migration == MigrationState(tick=2)


def test_with_migration_off_the_loop_never_needs_the_migration_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry in sys.modules makes any import of balancer.pressure fail
    monkeypatch.setitem(sys.modules, "balancer.pressure", None)

    decision = step(observe(FAN, 0.0, {"b1": 0.9}), BalancerState(), policy(throttling="watermark"))

    assert decision.state.migration is None
    assert decision.actions


def test_layers_compose_in_order_throttling_routing_migration() -> None:
    # Given node 1 in backpressure and branch 2 behind a full sink queue
    observation = experiment(
        **{
            "1": node("1", 0.9, in_rate=6e6, out_rate=3e6),
            "4": node("4", 1.0),
        }
    )
    run = Policy.from_mapping(
        {"throttling": "stop_resume", "routing": "water_level", "migration": "pressure"}
    )

    decision = step(observation, BalancerState(), run)

    # No stage has two instances here, so routing has nothing to say
    assert kinds(decision) == ["set_rate", "set_rate", "set_rate", "start_migration"]


def test_a_layer_keeps_its_state_while_another_one_runs() -> None:
    watermarked = step(
        observe(FAN, 0.0, {"b1": 0.9}), BalancerState(), policy(throttling="watermark")
    )

    credited = step(observe(FAN, 1.0), watermarked.state, policy(throttling="credit"))

    assert credited.state.watermarks == watermarked.state.watermarks
    assert credited.state.rates == watermarked.state.rates


def test_the_same_inputs_give_the_same_decision() -> None:
    observation = experiment(**{"1": node("1", 0.9, in_rate=6e6, out_rate=3e6)})
    run = Policy()

    assert step(observation, BalancerState(), run) == step(observation, BalancerState(), run)


def test_a_retired_instance_is_forgotten_and_the_next_tick_decides_without_it() -> None:
    # Given branch 1 migrating its data, flagged, with its own watermark state
    hot = experiment(**{"1": node("1", 0.9, in_rate=6e6, out_rate=3e6)})
    run = policy(throttling="watermark", migration="pressure", routing="water_level")
    state = step(hot, BalancerState(), run).state
    assert state.migration is not None and state.migration.active
    assert "1" in state.watermarks
    # When a hot rescale retires node 1
    remaining = frozenset({"0", "2", "3", "4"})
    pruned = forget(state, remaining)
    # Then nothing refers to it any more, and a tick on the new graph runs
    assert "1" not in pruned.watermarks and "1" not in pruned.rates
    assert pruned.migration is not None and not pruned.migration.active
    assert all("1" not in values for values in pruned.shares.values())
    graph = Topology.build(
        [NodeSpec("0", kind="source"), NodeSpec("2"), NodeSpec("3"), NodeSpec("4", kind="sink")],
        [LinkSpec("0", "2"), LinkSpec("0", "3"), LinkSpec("2", "4"), LinkSpec("3", "4")],
    )
    after = Observation(0.5, 1.0, graph, {n: node(n) for n in remaining})
    step(after, pruned, run)
