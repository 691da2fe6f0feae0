"""Scale-out sized in one step from measured rates (balancer/sizing.py, DS2): a stage's
target input, its capacity over the resources it runs on, the instances it needs, the
measured trigger and the flags trigger's request sized alike; and the way back, a
resource the stage no longer needs."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from balancer.loop import BalancerState, step
from balancer.model import SHARED_POOL, Observation, ScaleOutRequest, SourceLoad
from balancer.policy import MB, Policy
from balancer.rate import RateState
from balancer.sizing import (
    MAX_INSTANCES_PER_STAGE,
    SCALE_IN_HEADROOM,
    ArrivalMeter,
    ScalingState,
    others_measured,
    scaling_step,
    size_stage,
    size_stages,
    sized,
    source_target,
    spare_without,
)
from tests.balancer.builders import layered, node, observe


def three_workers(
    rates: tuple[float, ...] = (6 * MB, 3 * MB, 1.5 * MB),
    *,
    arrival: float | None = 12 * MB,
    backlog: float = 0.0,
    reduction: float = 0.01,
    resources: tuple[str, ...] = ("w1", "w2", "w3"),
) -> Observation:
    """The worked example: a source, one stage of three instances on workers of the
    given true rates, each sending on ``reduction`` of its input, a sink."""
    topology = layered(("src", 1), ("op", len(rates)), ("sink", 1))
    topology = topology.with_reductions({f"op{i}": reduction for i in range(1, len(rates) + 1)})
    nodes = {
        f"op{i}": node(f"op{i}", capacity_bps=rate, resource=resources[i - 1])
        for i, rate in enumerate(rates, start=1)
    }
    seen = observe(topology, nodes=nodes)
    return dataclasses.replace(seen, source=SourceLoad(backlog, arrival))


def test_the_worked_example_of_the_measured_capacity_spec() -> None:
    # Three instances on workers of true rates 6, 3 and 1.5 MB/s, selectivity 0.01, a
    # source arriving at 12 MB/s with no backlog, H = 60 s.
    size = size_stages(three_workers(), horizon_s=60.0)["op"]

    assert math.isclose(size.capacity_bps, 10.5 * MB)
    assert size.overloaded and math.isclose(size.load, 12 / 10.5)
    assert [round(size.shares[m], 3) for m in ("op1", "op2", "op3")] == [0.571, 0.286, 0.143]
    assert math.isclose(size.mean_rate_bps, 3.5 * MB)
    assert size.wanted == 4  # ceil(12 / 3.5): one more instance, on a new worker
    assert math.isclose(size.hold, 0.875)  # the source held at 10.5/12 until it runs
    assert size.describe().endswith("4 wanted; until they run it keeps up with 0.88 of it")
    # With a backlog of 180 MB: target 12 + 180/60 = 15 MB/s, p* = ceil(15 / 3.5) = 5.
    backlogged = size_stages(three_workers(backlog=180 * MB), horizon_s=60.0)["op"]
    assert math.isclose(backlogged.target_bps, 15 * MB) and backlogged.wanted == 5
    # A 512 MB bounded input on the three instances: bound 512 / 10.5 = 48.8 s.
    assert round(512 * MB / size.capacity_bps, 1) == 48.8


def test_a_later_stage_s_target_counts_the_reductions_before_it() -> None:
    # src -> stage a (sends on half of what it takes) -> stage b -> sink.
    topology = layered(("src", 1), ("a", 2), ("b", 2), ("sink", 1))
    topology = topology.with_reductions({"a1": 0.5, "a2": 0.5})
    nodes = {n: node(n, capacity_bps=2 * MB, resource=f"w-{n}") for n in ("a1", "a2", "b1", "b2")}
    seen = dataclasses.replace(observe(topology, nodes=nodes), source=SourceLoad(0.0, 6 * MB))

    sizes = size_stages(seen, horizon_s=60.0)

    assert sorted(sizes) == ["a", "b"]  # only operator stages are sized
    assert math.isclose(sizes["a"].target_bps, 6 * MB) and sizes["a"].wanted == 3
    assert math.isclose(sizes["b"].target_bps, 3 * MB) and sizes["b"].wanted == 2
    assert sizes["a"].overloaded and not sizes["b"].overloaded


def test_instances_that_share_a_resource_count_once_at_its_rate() -> None:
    # op1 and op2 on one worker (a fused batch shows the worker's rate at both).
    seen = three_workers((4 * MB, 4 * MB, 2 * MB), resources=("w1", "w1", "w2"))
    size = size_stages(seen, horizon_s=60.0)["op"]
    assert size.resources == 2
    assert math.isclose(size.capacity_bps, 6 * MB)
    assert math.isclose(size.shares["op1"] + size.shares["op2"], 4 / 6)
    assert math.isclose(size.shares["op1"], size.shares["op2"])


def test_what_waits_in_a_stage_s_pools_is_backlog_it_must_drain_too() -> None:
    seen = three_workers(arrival=6 * MB)
    queued = {
        n: dataclasses.replace(o, buffered_bytes=60 * MB)
        for n, o in seen.nodes.items()
        if n.startswith("op")
    }
    seen = dataclasses.replace(seen, nodes={**seen.nodes, **queued})
    size = size_stages(seen, horizon_s=60.0)["op"]
    assert math.isclose(size.target_bps, 6 * MB + 180 * MB / 60.0) and size.wanted == 3


def test_a_keyed_stage_is_not_sized() -> None:
    topology = layered(("src", 1), ("op", 2), ("sink", 1), mergeable=False)
    nodes = {n: node(n, capacity_bps=1 * MB, resource=f"w-{n}") for n in ("op1", "op2")}
    seen = dataclasses.replace(observe(topology, nodes=nodes), source=SourceLoad(0.0, 9 * MB))
    assert size_stages(seen, horizon_s=60.0) == {}


def test_an_unmeasured_instance_leaves_its_stage_unsized() -> None:
    size = size_stages(three_workers((6 * MB, math.inf, 1.5 * MB)), horizon_s=60.0)["op"]
    assert not size.known and size.wanted == 0 and not size.overloaded
    assert "not measured" in size.describe()


def test_nothing_is_sized_without_an_arrival_rate() -> None:
    assert size_stages(three_workers(arrival=None), horizon_s=60.0) == {}
    assert source_target(SourceLoad(100.0, None), 60.0) is None
    plain = observe(layered(("src", 1), ("op", 2), ("sink", 1)))
    assert plain.source is None and size_stages(plain, horizon_s=60.0) == {}


def test_the_wanted_count_is_capped() -> None:
    size = size_stages(three_workers(arrival=1000 * MB), horizon_s=60.0)["op"]
    assert size.wanted == MAX_INSTANCES_PER_STAGE


@given(
    rates=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6),
    arrival=st.floats(0.0, 500.0),
    backlog=st.floats(0.0, 5000.0),
)
def test_the_wanted_instances_at_the_mean_rate_cover_the_target(
    rates: list[float], arrival: float, backlog: float
) -> None:
    seen = three_workers(
        tuple(r * MB for r in rates),
        arrival=arrival * MB,
        backlog=backlog * MB,
        resources=tuple(f"w{i}" for i in range(len(rates))),
    )
    target = source_target(seen.source, 60.0) or 0.0  # type: ignore[arg-type]
    size = size_stage(seen, "op", target, horizon_s=60.0)
    assert size.known and 1 <= size.wanted <= MAX_INSTANCES_PER_STAGE
    assert math.isclose(sum(size.shares.values()), 1.0)
    if size.wanted < MAX_INSTANCES_PER_STAGE:
        # Enough: p* at the mean rate takes the target; and not one too many.
        assert size.wanted * size.mean_rate_bps >= size.target_bps * (1 - 1e-9)
        assert size.wanted == 1 or (size.wanted - 1) * size.mean_rate_bps < size.target_bps
    assert size.overloaded == (size.target_bps > size.capacity_bps)
    assert 0 < size.hold <= 1


# --- the measured trigger --------------------------------------------------------------


def measured_policy(ticks: int = 3) -> Policy:
    return Policy.from_mapping({"scale_out": "measured", "scale_out_ticks": ticks})


def test_a_stage_overloaded_for_the_policy_s_ticks_asks_its_missing_instances_at_once() -> None:
    policy = measured_policy(3)
    state = ScalingState()
    seen = three_workers(backlog=180 * MB)  # p* = 5 on three workers
    for tick in (1, 2):
        requests, state = scaling_step(seen, state, policy)
        assert requests == [], f"asked on tick {tick}, before the third overloaded tick"
    requests, state = scaling_step(seen, state, policy)

    assert [(r.stage, r.instances, r.upstream) for r in requests] == [("op", 2, "src1")]
    assert math.isclose(requests[0].capacity_bps, 10.5 * MB)
    assert math.isclose(requests[0].target_bps, 15 * MB)
    assert "overloaded 3 ticks in a row" in requests[0].reason
    assert state.overloaded == {}  # the count starts again


def test_a_tick_that_keeps_up_starts_the_count_again() -> None:
    policy = measured_policy(2)
    _, state = scaling_step(three_workers(), ScalingState(), policy)
    _, state = scaling_step(three_workers(arrival=5 * MB), state, policy)
    requests, state = scaling_step(three_workers(), state, policy)
    assert requests == [] and state.overloaded == {"op": 1}


def test_instances_on_the_shared_pool_are_never_scaled_out_by_measurement() -> None:
    # Pooled: more instances on the same cores add nothing.
    policy = measured_policy(1)
    seen = three_workers((3 * MB, 3 * MB, 3 * MB), resources=(SHARED_POOL,) * 3)
    requests, _ = scaling_step(seen, ScalingState(), policy)
    assert requests == []


def test_placed_instances_sharing_a_worker_scale_out_onto_new_workers() -> None:
    # Three instances on two workers of 2 MB/s: 4 MB/s for 9 MB/s needs five workers.
    policy = measured_policy(1)
    seen = three_workers((2 * MB, 2 * MB, 2 * MB), arrival=9 * MB, resources=("w1", "w1", "w2"))
    requests, _ = scaling_step(seen, ScalingState(), policy)
    assert [(r.stage, r.instances) for r in requests] == [("op", 3)]


def test_the_loop_uses_the_policy_s_trigger() -> None:
    seen = three_workers(backlog=180 * MB)
    measured = step(seen, BalancerState(), measured_policy(1))
    assert [a.instances for a in measured.actions if isinstance(a, ScaleOutRequest)] == [2]
    off = step(seen, BalancerState(), Policy.from_mapping({"scale_out": "off"}))
    assert not any(isinstance(a, ScaleOutRequest) for a in off.actions)


def test_the_flags_trigger_s_request_is_sized_where_the_stage_is_measured() -> None:
    policy = Policy()
    request = ScaleOutRequest(reason="k at floor", stage="op", upstream="src1")

    grown = sized(request, three_workers(backlog=180 * MB), policy)
    assert grown.instances == 2 and "5 wanted" in grown.reason
    # Unmeasured, or instances sharing a resource: the paper's one instance.
    assert sized(request, three_workers((6 * MB, math.inf, 1 * MB)), policy) == request
    pooled = three_workers(resources=(SHARED_POOL,) * 3)
    assert sized(request, pooled, policy) == request
    # A stage that keeps up still gets the instance the flags asked for.
    assert sized(request, three_workers(arrival=1 * MB), policy).instances == 1


def test_the_flags_trigger_scales_out_through_the_loop_sized() -> None:
    # The source's coefficient already at its floor, every instance flagged and full.
    seen = three_workers(backlog=180 * MB)
    nodes = {
        n: dataclasses.replace(o, flagged=True, level=0.95)
        for n, o in seen.nodes.items()
        if n.startswith("op")
    }
    seen = dataclasses.replace(seen, nodes={**seen.nodes, **nodes})
    state = BalancerState(rates={"src1": RateState(0.1)})

    decision = step(seen, state, Policy())

    requests = [a for a in decision.actions if isinstance(a, ScaleOutRequest)]
    assert [(r.stage, r.instances) for r in requests] == [("op", 2)]
    assert "2 more instance(s) requested (stage op: " in requests[0].reason
    assert "5 wanted" in requests[0].reason


# --- the arrival rate ------------------------------------------------------------------


def test_arrival_is_what_was_sent_plus_how_much_the_backlog_grew() -> None:
    meter = ArrivalMeter(window_s=10.0)
    assert meter.add(0.0, 0.0, 0.0) is None
    # Sends 1 MB/s while the backlog grows by 2 MB/s: 3 MB/s arrive.
    for second in range(1, 6):
        found = meter.add(float(second), 1 * MB, 2 * MB * second)
    assert found is not None and math.isclose(found, 3 * MB)


def test_a_source_draining_its_backlog_sends_more_than_arrives() -> None:
    meter = ArrivalMeter(window_s=4.0)
    meter.add(0.0, 0.0, 100 * MB)
    for second in range(1, 20):
        found = meter.add(float(second), 5 * MB, 100 * MB - 4 * MB * second)
    assert found is not None and math.isclose(found, 1 * MB)


def test_the_arrival_rate_follows_a_change_within_its_window() -> None:
    meter = ArrivalMeter(window_s=5.0)
    for second in range(30):
        meter.add(float(second), 10 * MB, 0.0)
    for second in range(30, 40):
        found = meter.add(float(second), 2 * MB, 0.0)
    assert found is not None and math.isclose(found, 2 * MB)


def test_a_resource_goes_back_only_if_the_others_take_the_target_with_headroom() -> None:
    # Workers of 6, 3 and 1.5 MB/s (10.5 in all); the source arriving at 6 MB/s.
    size = size_stages(three_workers(arrival=6 * MB), horizon_s=60.0)["op"]
    # Without op3's worker 9 MB/s remain, 1.5x the target: it may go, saying why
    assert size.resource_of["op3"] == "w3" and size.rates["w3"] == 1.5 * MB
    why = spare_without(size, "op3")
    assert why == (
        "stage op needs 6.00 MB/s and does 9.00 MB/s without op3's resource (1.50 MB/s): "
        f"at least {SCALE_IN_HEADROOM:g}x"
    )
    # Without op1's, 4.5 MB/s remain: less than the target, it stays
    assert spare_without(size, "op1") is None
    # At 8 MB/s, 9 MB/s left is 1.125x: within the headroom, so op3's stays too (a
    # resource given back must not be asked for again at the next tick)
    busier = size_stages(three_workers(arrival=8 * MB), horizon_s=60.0)["op"]
    assert not busier.overloaded and spare_without(busier, "op3") is None


def test_only_measured_resources_may_be_counted_on_and_the_last_one_stays() -> None:
    unmeasured = size_stages(three_workers((6 * MB, math.inf, 1 * MB), arrival=0.0), 60.0)["op"]
    # op3's worker cannot go: op2's, which would remain, is not measured (the runtime
    # then goes by busy shares)
    assert not others_measured(unmeasured, "op3") and spare_without(unmeasured, "op3") is None
    # op2's may: it never got data, and the measured others take the target
    assert (spare_without(unmeasured, "op2") or "").endswith("(not measured): at least 1.25x")
    alone = size_stages(three_workers((6 * MB,), arrival=0.0), horizon_s=60.0)["op"]
    assert spare_without(alone, "op1") is None


@given(
    rates=st.lists(st.floats(0.1, 100.0), min_size=2, max_size=6),
    arrival=st.floats(0.0, 300.0),
)
def test_what_remains_after_a_resource_goes_back_keeps_up_by_the_headroom(
    rates: list[float], arrival: float
) -> None:
    seen = three_workers(
        tuple(r * MB for r in rates),
        arrival=arrival * MB,
        resources=tuple(f"w{i}" for i in range(len(rates))),
    )
    size = size_stages(seen, horizon_s=60.0)["op"]
    for i in range(1, len(rates) + 1):
        member = f"op{i}"
        if spare_without(size, member) is not None:
            left = size.capacity_bps - size.rates[size.resource_of[member]]
            assert left >= size.target_bps * SCALE_IN_HEADROOM
            assert left > size.target_bps or size.target_bps == 0
