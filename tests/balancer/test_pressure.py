"""Pressure migration (docs/spec/pressure-migration.md): detection, tracing, score,
light branch, recovery, and our proportional plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancer.model import NodeObservation, Observation, StartMigration, StopMigration
from balancer.policy import MB, Policy
from balancer.pressure import (
    Branch,
    BranchPlan,
    MigrationState,
    branch_capacity,
    branches_of,
    is_backpressure_node,
    migration_step,
    pressure_score,
    proportional_plan,
    score_branches,
    trace_heavy_branch,
)
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import node, observe

MBIT = MB / 8  # bytes per second in one Mb/s
PUBLISHED = Policy(migration="pressure")  # alpha 0.3, beta 0.5, bp 0.8, recovery 0.5


def reference() -> Topology:
    """The published 5-node experiment: 0 feeds branches 1, 2, 3, which merge into 4."""
    nodes = [
        NodeSpec("0", kind="source"),
        *(NodeSpec(n, stage="agg") for n in "123"),
        NodeSpec("4", kind="sink"),
    ]
    bandwidths = {"01": 50, "02": 50, "03": 100, "14": 25, "24": 25, "34": 75}
    links = [LinkSpec(k[0], k[1], mbps * MBIT) for k, mbps in bandwidths.items()]
    return Topology.build(nodes, links)


def chain() -> Topology:
    """s feeds a -> b -> k and c -> k: the branch through a is two nodes long."""
    nodes = [NodeSpec("s", kind="source"), *(NodeSpec(n) for n in "abc"), NodeSpec("k", "sink")]
    links = [LinkSpec(*pair, 10.0) for pair in ("sa", "ab", "bk", "sc", "ck")]
    return Topology.build(nodes, links)


def branch_state(**nodes: NodeObservation) -> Observation:
    """The reference topology with the given node observations (others empty, idle)."""
    return observe(reference(), 1.0, nodes=nodes)


# --- detection ------------------------------------------------------------------------------


def test_a_full_queue_filling_faster_than_it_drains_is_a_backpressure_node() -> None:
    assert is_backpressure_node(node("1", 0.9, in_rate=50.0, out_rate=25.0), PUBLISHED)


def test_a_full_queue_that_is_draining_is_not_a_backpressure_node() -> None:
    assert not is_backpressure_node(node("1", 0.95, in_rate=25.0, out_rate=25.0), PUBLISHED)
    assert not is_backpressure_node(node("1", 0.95, in_rate=10.0, out_rate=25.0), PUBLISHED)


def test_queue_usage_must_be_strictly_above_the_threshold() -> None:
    assert not is_backpressure_node(node("1", 0.8, in_rate=50.0, out_rate=25.0), PUBLISHED)


# --- tracing --------------------------------------------------------------------------------


def test_the_heavy_branch_of_a_task_node_is_the_node_itself_below_the_source() -> None:
    assert trace_heavy_branch(reference(), "1") == ("0", ("1",))


def test_tracing_walks_up_a_chain_to_the_first_node_with_several_downstreams() -> None:
    assert trace_heavy_branch(chain(), "b") == ("s", ("a", "b"))


def test_a_merge_node_or_a_path_without_a_branch_node_has_no_heavy_branch() -> None:
    # The sink merges three branches: the pressure is not one branch's.
    assert trace_heavy_branch(reference(), "4") is None
    # s -> a -> k never branches.
    line = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("a"), NodeSpec("k", "sink")],
        [LinkSpec("s", "a"), LinkSpec("a", "k")],
    )
    assert trace_heavy_branch(line, "a") is None


def test_a_branch_runs_from_the_child_down_the_chain_and_into_the_merge() -> None:
    (through_a, through_c) = branches_of(chain(), "s")

    assert through_a == Branch("s", ("a", "b"), (("s", "a"), ("a", "b"), ("b", "k")))
    assert through_c == Branch("s", ("c",), (("s", "c"), ("c", "k")))


def test_a_branch_capacity_is_its_narrowest_link_or_node() -> None:
    topology = reference()
    capacities = [branch_capacity(topology, b) for b in branches_of(topology, "0")]

    assert capacities == [25 * MBIT, 25 * MBIT, 75 * MBIT]


# --- the score ------------------------------------------------------------------------------


def test_score_normalises_the_gap_by_input_capacity_and_bandwidth_by_the_widest() -> None:
    # Branch 1: Q 0.9, 50 Mb/s in, 25 out -> gap 25/50 = 0.5; bottleneck 25 of 75 -> 1/3.
    # Branch 2: Q 0.2, 10 in, 25 out -> gap -15/50 = -0.3 (draining).
    # Branch 3: Q 0.5, in = out -> gap 0; bottleneck 75 of 75 -> 1.
    observation = branch_state(
        **{
            "1": node("1", 0.9, in_rate=50 * MBIT, out_rate=25 * MBIT),
            "2": node("2", 0.2, in_rate=10 * MBIT, out_rate=25 * MBIT),
            "3": node("3", 0.5, in_rate=75 * MBIT, out_rate=75 * MBIT),
        }
    )

    scores = score_branches(observation, branches_of(observation.topology, "0"), PUBLISHED)

    assert scores["1"] == pytest.approx((0.3 * 0.9 + 0.7 * 0.5) / math.sqrt(1 / 3))
    assert scores["3"] == pytest.approx(0.3 * 0.5)
    # A draining branch's negative pressure is scaled by b**beta, not divided: the narrow
    # draining branch 2 must not look lighter than it would with a wide link.
    assert scores["2"] == pytest.approx((0.3 * 0.2 - 0.7 * 0.3) * math.sqrt(1 / 3))


def test_the_gap_is_clamped_to_minus_one_and_one() -> None:
    # 200 Mb/s arriving over a 50 Mb/s link is a measurement glitch, not a gap of 3.
    observation = branch_state(**{"1": node("1", 0.0, in_rate=200 * MBIT, out_rate=50 * MBIT)})

    scores = score_branches(observation, branches_of(observation.topology, "0"), PUBLISHED)

    assert scores["1"] == pytest.approx(0.7 * 1.0 / math.sqrt(1 / 3))


unit = st.floats(0.0, 1.0)
gap = st.floats(-1.0, 1.0)
ratio = st.floats(0.01, 1.0)
alpha = st.floats(0.01, 0.99)
beta = st.floats(0.05, 10.0)


@given(q1=unit, q2=unit, g=gap, b=ratio, a=alpha, e=beta)
def test_score_never_falls_as_queue_usage_rises(
    *, q1: float, q2: float, g: float, b: float, a: float, e: float
) -> None:
    low, high = sorted((q1, q2))
    assert pressure_score(low, g, b, a, e) <= pressure_score(high, g, b, a, e) + 1e-12


@given(q=unit, g1=gap, g2=gap, b=ratio, a=alpha, e=beta)
def test_score_never_falls_as_the_rate_gap_rises(
    *, q: float, g1: float, g2: float, b: float, a: float, e: float
) -> None:
    low, high = sorted((g1, g2))
    assert pressure_score(q, low, b, a, e) <= pressure_score(q, high, b, a, e) + 1e-12


@given(q=unit, g=gap, b1=ratio, b2=ratio, a=alpha, e=beta)
def test_score_decreases_as_bandwidth_rises(
    *, q: float, g: float, b1: float, b2: float, a: float, e: float
) -> None:
    narrow, wide = sorted((b1, b2))
    numerator = a * q + (1 - a) * g
    assert pressure_score(q, g, wide, a, e) <= pressure_score(q, g, narrow, a, e) + 1e-12
    if narrow < wide and abs(numerator) > 1e-6 and wide**e - narrow**e > 1e-6:
        assert pressure_score(q, g, wide, a, e) < pressure_score(q, g, narrow, a, e)


@given(st.floats(1.0, 100.0), st.floats(1.0, 100.0))
def test_a_narrower_bottleneck_never_lowers_a_measured_branch_score(
    mbps_1: float, mbps_2: float
) -> None:
    # Same measurements on two topologies that differ only in branch 1's exit link.
    narrow, wide = sorted((mbps_1, mbps_2))

    def score(exit_mbps: float) -> float:
        links = [LinkSpec(*p, 100 * MBIT) for p in ("01", "02", "24")]
        topology = Topology.build(
            [NodeSpec("0", "source"), NodeSpec("1"), NodeSpec("2"), NodeSpec("4", "sink")],
            [*links, LinkSpec("1", "4", exit_mbps * MBIT)],
        )
        observation = observe(
            topology, 1.0, nodes={"1": node("1", 0.7, in_rate=60 * MBIT, out_rate=20 * MBIT)}
        )
        return score_branches(observation, branches_of(topology, "0"), PUBLISHED)["1"]

    assert score(wide) <= score(narrow) + 1e-12


# --- the published mechanism ---------------------------------------------------------------


def overloaded_branch_1(level: float = 0.9) -> Observation:
    return branch_state(
        **{
            "1": node("1", level, in_rate=50 * MBIT, out_rate=25 * MBIT),
            "2": node("2", 0.2, in_rate=10 * MBIT, out_rate=25 * MBIT),
            "3": node("3", 0.5, in_rate=75 * MBIT, out_rate=75 * MBIT),
        }
    )


def test_a_backpressure_node_sends_its_branch_to_the_lowest_pressure_branch() -> None:
    actions, state = migration_step(overloaded_branch_1(), MigrationState(), PUBLISHED)

    (start,) = actions
    assert isinstance(start, StartMigration)
    assert (start.branch_node, start.heavy, start.light, start.share) == ("0", ("1",), ("2",), 1.0)
    assert start.backpressure_node == "1"
    assert start.scores["2"] < start.scores["3"] < start.scores["1"]
    assert "1 in backpressure" in start.reason
    assert state.bp_list == ("1",)


def test_the_heavy_branch_is_never_its_own_light_branch_even_when_it_scores_lowest() -> None:
    # Branch 1 is barely in backpressure (Q 0.81, 26 in / 25 out): score 0.257 / 0.577.
    # Branches 2 and 3 sit at Q 0.8 (not above it) but fill at full input speed:
    # 0.94 / 0.577 and 0.94 / 1. Branch 1 scores lowest, yet 3 is the light branch.
    observation = branch_state(
        **{
            "1": node("1", 0.81, in_rate=26 * MBIT, out_rate=25 * MBIT),
            "2": node("2", 0.8, in_rate=50 * MBIT, out_rate=0.0),
            "3": node("3", 0.8, in_rate=100 * MBIT, out_rate=0.0),
        }
    )

    (start,), _ = migration_step(observation, MigrationState(), PUBLISHED)

    assert isinstance(start, StartMigration)
    assert min(start.scores, key=lambda c: start.scores[c]) == "1"
    assert (start.heavy, start.light) == (("1",), ("3",))


def test_when_every_branch_is_heavy_nothing_migrates() -> None:
    full = {n: node(n, 0.9, in_rate=50 * MBIT, out_rate=25 * MBIT) for n in "123"}

    actions, state = migration_step(branch_state(**full), MigrationState(), PUBLISHED)

    assert actions == []
    assert state.bp_list == ()


def test_a_non_mergeable_branch_never_takes_migrated_data() -> None:
    topology = Topology.build(
        [
            NodeSpec("0", "source"),
            NodeSpec("1"),
            NodeSpec("2", mergeable=False),
            NodeSpec("3"),
            NodeSpec("4", "sink"),
        ],
        reference().links,
    )
    observation = observe(topology, 1.0, nodes=dict(overloaded_branch_1().nodes))

    (start,), _ = migration_step(observation, MigrationState(), PUBLISHED)

    assert isinstance(start, StartMigration)
    assert start.light == ("3",)


def test_migration_goes_on_until_the_node_drains_below_the_recovery_threshold() -> None:
    _, state = migration_step(overloaded_branch_1(), MigrationState(), PUBLISHED)

    # Still at 0.6 (>= 0.5): keep migrating, no new action.
    actions, state = migration_step(overloaded_branch_1(0.6), state, PUBLISHED)
    assert actions == []
    assert state.bp_list == ("1",)

    actions, state = migration_step(overloaded_branch_1(0.45), state, PUBLISHED)
    assert actions == [
        StopMigration(
            reason="1 relieved: Q 0.45 < 0.50, default routing restored",
            branch_node="0",
            heavy=("1",),
            backpressure_node="1",
        )
    ]
    assert state.bp_list == ()


def test_recovery_is_checked_only_every_recovery_check_ticks() -> None:
    policy = PUBLISHED.replace(recovery_check=2)
    _, state = migration_step(overloaded_branch_1(), MigrationState(), policy)  # tick 1

    actions, state = migration_step(overloaded_branch_1(0.6), state, policy)  # tick 2: check
    assert actions == []
    actions, state = migration_step(overloaded_branch_1(0.45), state, policy)  # tick 3
    assert actions == []
    actions, state = migration_step(overloaded_branch_1(0.45), state, policy)  # tick 4: check
    assert [type(a) for a in actions] == [StopMigration]


def test_a_light_branch_that_becomes_heavy_hands_the_migration_on() -> None:
    _, state = migration_step(overloaded_branch_1(), MigrationState(), PUBLISHED)
    # Branch 2 (the light one) now fills up too; branch 1 is still at 0.7.
    observation = branch_state(
        **{
            "1": node("1", 0.7, in_rate=0.0, out_rate=25 * MBIT),
            "2": node("2", 0.9, in_rate=50 * MBIT, out_rate=25 * MBIT),
            "3": node("3", 0.3, in_rate=60 * MBIT, out_rate=75 * MBIT),
        }
    )

    actions, state = migration_step(observation, state, PUBLISHED)

    starts = {a.heavy: a.light for a in actions if isinstance(a, StartMigration)}
    assert starts == {("2",): ("3",), ("1",): ("3",)}
    assert state.bp_list == ("1", "2")


def test_turning_migration_off_stops_what_is_under_way() -> None:
    _, state = migration_step(overloaded_branch_1(), MigrationState(), PUBLISHED)

    actions, state = migration_step(overloaded_branch_1(), state, Policy(migration="off"))

    assert [type(a) for a in actions] == [StopMigration]
    assert state.active == ()


# --- ours: proportional ------------------------------------------------------------------------

CAPACITIES = {"1": 25 * MBIT, "2": 25 * MBIT, "3": 75 * MBIT}
EVEN_DEMAND = {c: 125 * MBIT / 3 for c in CAPACITIES}


def balanced_queues(drain_s: float) -> dict[str, float]:
    return {c: cap * drain_s for c, cap in CAPACITIES.items()}


def test_only_the_excess_over_capacity_moves_and_it_goes_where_there_is_room() -> None:
    # Equal tags on 25/25/75 Mb/s branches: each narrow branch gets 41.7 but takes 25,
    # so 16.7/41.7 = 40% of it moves; the wide branch has 33.3 of room and takes it all.
    plan = proportional_plan(EVEN_DEMAND, CAPACITIES, queued=balanced_queues(2.0), horizon_s=3.0)

    assert plan == [
        BranchPlan("1", pytest.approx(0.4), {"3": 1.0}),
        BranchPlan("2", pytest.approx(0.4), {"3": 1.0}),
    ]


def test_excess_is_spread_over_several_light_branches_by_their_room() -> None:
    demand = {"1": 100 * MBIT, "2": 5 * MBIT, "3": 20 * MBIT}

    (plan,) = proportional_plan(demand, CAPACITIES, queued=balanced_queues(1.0), horizon_s=3.0)

    # Room: branch 2 has 25 - 5 = 20, branch 3 has 75 - 20 = 55; branch 1 moves 75 of 100.
    assert plan.child == "1"
    assert plan.share == pytest.approx(0.75)
    assert plan.targets == pytest.approx({"2": 20 / 75, "3": 55 / 75})


def test_a_queue_ahead_of_the_common_drain_time_is_offered_less() -> None:
    # Branch 3 holds 4 s of work, the others none: the common drain time is 2.4 s, so
    # branch 3 sheds (75 * 2.4 - 300) / 3 = -40 Mb/s of its fair 75 and takes its own
    # 50 only in part; the narrow branches get the rest.
    queued = {"1": 0.0, "2": 0.0, "3": 300 * MBIT}
    demand = {"1": 25 * MBIT, "2": 25 * MBIT, "3": 75 * MBIT}

    plan = proportional_plan(demand, CAPACITIES, queued=queued, horizon_s=3.0)

    (heavy,) = plan
    assert heavy.child == "3"
    assert heavy.share == pytest.approx(40 / 75)
    assert heavy.targets == pytest.approx({"1": 0.5, "2": 0.5})


def test_when_tags_match_capacities_nothing_moves() -> None:
    demand = {"1": 25 * MBIT, "2": 25 * MBIT, "3": 75 * MBIT}

    assert proportional_plan(demand, CAPACITIES, queued=balanced_queues(1.0), horizon_s=3) == []


def source_with_coming(mix: dict[str, float]) -> Observation:
    """The reference topology whose source holds ``mix`` (MB per tag) at its queue head."""
    topology = reference()
    head = {tag: mb * MB for tag, mb in mix.items()}
    return observe(topology, 1.0, nodes={"0": node("0", head_by_route=head)})


def test_proportional_migration_moves_the_predicted_excess_of_every_branch() -> None:
    ours = Policy(migration="proportional")

    actions, state = migration_step(
        source_with_coming({"1": 20, "2": 20, "3": 20}), MigrationState(), ours
    )

    starts = {a.heavy: (a.share, dict(a.targets)) for a in actions}
    assert starts == {("1",): (0.4, {"3": 1.0}), ("2",): (0.4, {"3": 1.0})}
    assert all(isinstance(a, StartMigration) and a.light == ("3",) for a in actions)

    # The same coming mix next tick: the plan in force stands, nothing to send.
    actions, state = migration_step(source_with_coming({"1": 20, "2": 20, "3": 20}), state, ours)
    assert actions == []

    # Tags now match the capacities: both migrations end.
    actions, state = migration_step(source_with_coming({"1": 12, "2": 12, "3": 36}), state, ours)
    assert {(type(a), a.heavy) for a in actions} == {
        (StopMigration, ("1",)),
        (StopMigration, ("2",)),
    }
    assert state.active == ()


def test_proportional_migration_needs_a_measure_of_the_coming_data() -> None:
    actions, _ = migration_step(
        observe(reference(), 1.0), MigrationState(), Policy(migration="proportional")
    )

    assert actions == []
