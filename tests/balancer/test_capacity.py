"""Measured capacity (balancer/capacity.py): a node's true processing rate is its batches'
bytes over their busy seconds, over a window of busy time, with how sure it is; and the
decisions that use it (balancer/pressure.py, balancer/shares.py) act on it where no knob
is set, never between instances that share one resource."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from balancer.capacity import MIN_CONFIDENCE, BatchSample, CapacityMeter, overall, stage_bps
from balancer.model import SetShares, StartMigration
from balancer.policy import MB, Policy
from balancer.pressure import MigrationState, branch_capacity, branches_of, migration_step
from balancer.shares import shares_tick
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import node, observe

# --- the meter --------------------------------------------------------------------------------


def test_capacity_is_bytes_over_busy_seconds_whatever_the_node_was_offered() -> None:
    meter = CapacityMeter()
    # Two batches of 10 MB in 2 s and 30 MB in 4 s: 40 MB in 6 s of busy time, however
    # long the node sat idle between them.
    meter.add([BatchSample(("a",), 10 * MB, 2.0, 100.0), BatchSample(("a",), 30 * MB, 4.0, 900.0)])
    found = meter.capacity("a")
    assert math.isclose(found.bytes_per_s, 40 * MB / 6.0)
    assert found.confidence == 1.0
    assert found.known


def test_records_per_second_come_from_the_same_batches_and_busy_time() -> None:
    meter = CapacityMeter()
    meter.add(
        [
            BatchSample(("a",), 10 * MB, 2.0, 100.0, records=50_000),
            BatchSample(("a",), 30 * MB, 4.0, 900.0, records=100_000),
        ]
    )
    assert math.isclose(meter.capacity("a").records_per_s, 150_000 / 6.0)
    meter.add([BatchSample(("b",), 5 * MB, 1.0)])  # a batch that counted no records
    assert meter.capacity("b").records_per_s == 0.0


def test_an_unmeasured_node_has_no_capacity_and_nothing_is_known_of_it() -> None:
    meter = CapacityMeter()
    meter.add([BatchSample(("a",), 0.0, 1.0), BatchSample(("a",), 5 * MB, 0.0)])
    assert meter.capacity("a").bytes_per_s == math.inf
    assert not meter.capacity("a").known
    assert stage_bps(meter.capacities(["a"]), "a", ["a"]) == math.inf


def test_confidence_grows_with_busy_time_and_one_completed_batch_is_a_measure() -> None:
    meter = CapacityMeter(sure_after_s=10.0)
    meter.running([BatchSample(("a",), 1 * MB, 1.0)])
    assert MIN_CONFIDENCE > 0.1 and not meter.capacity("a").known  # a second running
    meter.running([])
    meter.add([BatchSample(("a",), 1 * MB, 0.25)])  # a fast worker's batch
    assert math.isclose(meter.capacity("a").confidence, 0.025)
    assert meter.capacity("a").known
    meter.add([BatchSample(("a",), 4 * MB, 4.75)])
    assert math.isclose(meter.capacity("a").confidence, 0.5)
    assert stage_bps(meter.capacities(["a"]), "a", ["a"]) == 1 * MB


def test_the_estimate_follows_a_worker_that_slowed_down() -> None:
    meter = CapacityMeter(window_busy_s=10.0)
    meter.add([BatchSample(("a",), 10 * MB, 1.0) for _ in range(10)])  # 10 MB/s
    meter.add([BatchSample(("a",), 10 * MB, 10.0) for _ in range(2)])  # now 1 MB/s
    assert meter.capacity("a").bytes_per_s < 1.5 * MB


def test_a_batch_running_longer_than_the_completed_ones_say_lowers_the_estimate_now() -> None:
    meter = CapacityMeter()
    meter.add([BatchSample(("a",), 10 * MB, 1.0) for _ in range(5)])  # 10 MB/s
    # A batch of 10 MB has run 20 s: the worker cannot be doing more than 0.5 MB/s now.
    meter.running([BatchSample(("a",), 10 * MB, 20.0)])
    assert math.isclose(meter.capacity("a").bytes_per_s, 60 * MB / 25.0)
    # Once it is no longer running (it ended, or was given back) the history alone counts.
    meter.running([])
    assert math.isclose(meter.capacity("a").bytes_per_s, 10 * MB)


def test_a_running_batch_on_time_changes_nothing() -> None:
    meter = CapacityMeter()
    meter.add([BatchSample(("a",), 10 * MB, 1.0) for _ in range(5)])
    meter.running([BatchSample(("a",), 10 * MB, 0.5)])  # halfway through, on pace
    assert math.isclose(meter.capacity("a").bytes_per_s, 10 * MB)


def test_a_node_with_only_a_running_batch_is_slower_only_than_a_peer_measured_faster() -> None:
    meter = CapacityMeter()
    meter.running([BatchSample(("slow",), 2 * MB, 0.5), BatchSample(("fast",), 4 * MB, 0.5)])
    assert not meter.capacity("slow").known  # half a second says too little
    meter.running([BatchSample(("slow",), 2 * MB, 8.0), BatchSample(("fast",), 4 * MB, 8.0)])
    found = meter.capacity("slow")
    assert found.known and math.isclose(found.bytes_per_s, MB / 4) and found.done_s == 0
    assert found.records_per_s == 0.0  # records are counted only when a batch ends
    # Both still on their first batch (each starting its worker's job): two bounds say
    # nothing of which is faster, and neither counts.
    both = meter.capacities(["slow", "fast"])
    assert stage_bps(both, "slow", ["slow", "fast"]) == math.inf
    assert stage_bps(both, "fast", ["slow", "fast"]) == math.inf
    # Once the peer has completed batches at a higher rate, the bound proves the node slower.
    meter.add([BatchSample(("fast",), 4 * MB, 1.0)])
    meter.running([BatchSample(("slow",), 2 * MB, 9.0)])
    both = meter.capacities(["slow", "fast"])
    assert math.isclose(stage_bps(both, "slow", ["slow", "fast"]), 2 * MB / 9.0)
    assert math.isclose(stage_bps(both, "fast", ["slow", "fast"]), 4 * MB)
    # A peer measured slower than the bound proves nothing.
    assert stage_bps(both, "slow", ["slow", "other"]) == math.inf


@given(
    st.lists(st.tuples(st.floats(1.0, 1e9), st.floats(0.01, 100.0)), min_size=1, max_size=20),
    st.lists(st.tuples(st.floats(1.0, 1e9), st.floats(0.01, 100.0)), max_size=3),
)
def test_running_batches_only_ever_lower_the_estimate(
    done: list[tuple[float, float]], running: list[tuple[float, float]]
) -> None:
    meter = CapacityMeter(window_busy_s=1e6)
    meter.add([BatchSample(("a",), size, busy) for size, busy in done])
    before = meter.capacity("a").bytes_per_s
    meter.running([BatchSample(("a",), size, ran) for size, ran in running])
    assert meter.capacity("a").bytes_per_s <= before * (1 + 1e-9)


def test_a_shared_batch_counts_its_whole_size_and_time_at_each_node_it_ran() -> None:
    meter = CapacityMeter()
    meter.add([BatchSample(("a1", "a2"), 12 * MB, 3.0)])
    assert meter.capacity("a1").bytes_per_s == meter.capacity("a2").bytes_per_s == 4 * MB


def test_a_node_moved_to_another_resource_starts_its_estimate_again() -> None:
    meter = CapacityMeter()
    meter.add([BatchSample(("a",), 10 * MB, 2.0, 5.0)])
    meter.forget("a")
    assert not meter.capacity("a").known
    assert meter.busy_share("a", 6.0) is None


def test_busy_share_is_the_part_of_the_last_window_the_batches_ran() -> None:
    meter = CapacityMeter(busy_over_s=10.0)
    meter.add([BatchSample(("a",), MB, 2.0, ended_s=95.0), BatchSample(("a",), MB, 3.0, 99.0)])
    share = meter.busy_share("a", 100.0)
    assert share is not None and math.isclose(share, 0.5)
    assert meter.busy_share("a", 200.0) == 0.0
    assert meter.busy_share("b", 100.0) is None


@given(
    st.lists(
        st.tuples(st.floats(1.0, 1e9), st.floats(0.01, 100.0)),
        min_size=1,
        max_size=40,
    )
)
def test_the_estimate_lies_between_the_slowest_and_fastest_batch(
    batches: list[tuple[float, float]],
) -> None:
    meter = CapacityMeter(window_busy_s=30.0)
    meter.add([BatchSample(("a",), size, busy) for size, busy in batches])
    rates = [size / busy for size, busy in batches]
    found = meter.capacity("a").bytes_per_s
    assert min(rates) * (1 - 1e-9) <= found <= max(rates) * (1 + 1e-9)


def test_overall_is_the_ratio_of_a_whole_runs_totals() -> None:
    found = overall(
        [
            BatchSample(("a",), 10.0, 1.0),
            BatchSample(("a", "b"), 30.0, 3.0),
            BatchSample(("b",), 0, 0),
        ]
    )
    assert found == {"a": 10.0, "b": 10.0}


# --- decisions on measured capacities --------------------------------------------------------


def fan() -> Topology:
    """s feeds three aggregating branches a1..a3 of one stage, merging into k, with no
    emulation knob anywhere."""
    nodes = [
        NodeSpec("s", kind="source"),
        *(NodeSpec(f"a{i}", stage="a", capacity_bytes=64 * MB) for i in (1, 2, 3)),
        NodeSpec("k", kind="sink"),
    ]
    links = [LinkSpec("s", f"a{i}") for i in (1, 2, 3)] + [
        LinkSpec(f"a{i}", "k") for i in (1, 2, 3)
    ]
    return Topology.build(nodes, links)


def test_without_knobs_a_branch_is_as_wide_as_its_measured_capacity() -> None:
    topology = fan()
    observation = observe(topology, nodes={"a1": node("a1", capacity_bps=3 * MB)})
    branch = next(b for b in branches_of(topology, "s") if b.child == "a1")
    assert branch_capacity(topology, branch) == math.inf
    assert branch_capacity(topology, branch, observation.nodes) == 3 * MB


def test_a_declared_rate_stands_in_for_the_measured_one() -> None:
    topology = Topology.build(
        [
            NodeSpec("s", kind="source"),
            NodeSpec("a", max_rate_bps=1 * MB),
            NodeSpec("k", kind="sink"),
        ],
        [LinkSpec("s", "a"), LinkSpec("a", "k")],
    )
    observation = observe(topology, nodes={"a": node("a", capacity_bps=9 * MB)})
    (branch,) = branches_of(topology, "s") or (None,)
    assert branch is not None
    assert branch_capacity(topology, branch, observation.nodes) == 1 * MB


def heavy_a1(resources: dict[str, str]) -> dict[str, object]:
    """a1 in backpressure; a2 light, a3 half full; each on the given resource, with
    measured capacities (a1 the slowest)."""
    capacity = {"a1": 1 * MB, "a2": 4 * MB, "a3": 4 * MB}
    levels = {"a1": 0.95, "a2": 0.05, "a3": 0.5}
    return {
        name: node(
            name,
            levels[name],
            in_rate=8 * MB if name == "a1" else 1 * MB,
            out_rate=1 * MB,
            capacity_bps=capacity[name],
            resource=resources[name],
        )
        for name in capacity
    }


def test_published_migration_moves_data_to_a_branch_on_another_worker() -> None:
    nodes = heavy_a1({"a1": "w1", "a2": "w2", "a3": "w3"})
    actions, _ = migration_step(
        observe(fan(), nodes=nodes), MigrationState(), Policy(migration="pressure")
    )
    starts = [a for a in actions if isinstance(a, StartMigration)]
    assert [(a.heavy, a.light) for a in starts] == [(("a1",), ("a2",))]


def test_no_migration_lands_on_the_worker_the_heavy_branch_runs_on() -> None:
    # a2 is the lightest, but it shares w1 with a1: the data goes to a3.
    nodes = heavy_a1({"a1": "w1", "a2": "w1", "a3": "w3"})
    actions, _ = migration_step(
        observe(fan(), nodes=nodes), MigrationState(), Policy(migration="pressure")
    )
    assert [a.light for a in actions if isinstance(a, StartMigration)] == [("a3",)]


def test_branches_of_one_shared_pool_never_migrate() -> None:
    nodes = heavy_a1(dict.fromkeys(("a1", "a2", "a3"), "spark pool"))
    for migration in ("pressure", "proportional"):
        actions, _ = migration_step(
            observe(fan(), nodes=nodes), MigrationState(), Policy(migration=migration)
        )
        assert not [a for a in actions if isinstance(a, StartMigration)], migration


def test_proportional_plans_from_measured_capacities_alone() -> None:
    topology = fan()
    nodes = heavy_a1({"a1": "w1", "a2": "w2", "a3": "w3"})
    nodes["s"] = node(
        "s",
        head_by_route={"a1": 30 * MB, "a2": 3 * MB, "a3": 3 * MB},
        in_rate_by_route={"a1": 6 * MB, "a2": 1 * MB, "a3": 1 * MB},
        resource="s",
    )
    actions, _ = migration_step(
        observe(topology, nodes=nodes), MigrationState(), Policy(migration="proportional")
    )
    starts = [a for a in actions if isinstance(a, StartMigration)]
    assert starts, "a1 gets six times what its measured 1 MB/s can take: some must move"
    assert all(a.heavy == ("a1",) and set(a.targets) <= {"a2", "a3"} for a in starts)


def test_shares_stay_put_among_instances_of_one_resource_and_move_across_workers() -> None:
    topology = fan()
    levels = {"a1": 0.9, "a2": 0.1, "a3": 0.1}
    policy = Policy(routing="water_level")
    shared = {n: node(n, lv, resource="spark pool") for n, lv in levels.items()}
    actions, _ = shares_tick(observe(topology, nodes=shared), {}, policy)
    assert not [a for a in actions if isinstance(a, SetShares)]
    apart = {n: node(n, lv, resource=f"w-{n}") for n, lv in levels.items()}
    actions, _ = shares_tick(observe(topology, nodes=apart), {}, policy)
    shifted = [a for a in actions if isinstance(a, SetShares)]
    assert shifted and shifted[0].shares["a1"] < 1 / 3


def test_a_branch_bounded_by_an_emulation_knob_is_a_resource_of_its_own() -> None:
    # The demo's branches share one Spark pool, but each is bounded by its emulated
    # link: moving data off the full one does relieve it.
    nodes = [
        NodeSpec("s", kind="source"),
        *(NodeSpec(f"a{i}", stage="a", capacity_bytes=64 * MB) for i in (1, 2, 3)),
        NodeSpec("k", kind="sink"),
    ]
    links = [LinkSpec("s", f"a{i}", 1 * MB) for i in (1, 2, 3)]
    links += [LinkSpec(f"a{i}", "k") for i in (1, 2, 3)]
    topology = Topology.build(nodes, links)
    observed = heavy_a1(dict.fromkeys(("a1", "a2", "a3"), "spark pool"))
    actions, _ = migration_step(
        observe(topology, nodes=observed), MigrationState(), Policy(migration="pressure")
    )
    assert [a.light for a in actions if isinstance(a, StartMigration)] == [("a2",)]
