"""Max flow, the fluid bound and the minimum migrated share, on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from balancer.policy import MB
from balancer.sim.bound import (
    branch_capacities,
    fluid_bound,
    max_flow,
    minimum_share,
    reduced_max_flow,
    schedule_bound,
)
from balancer.sim.reference import MBIT, reference_topology
from balancer.sim.workload import Workload
from balancer.topology import LinkSpec, NodeSpec, Topology


def test_the_reference_topology_carries_125_mbps() -> None:
    # min(50, 25) + min(50, 25) + min(100, 75)
    assert max_flow(reference_topology()) == pytest.approx(125 * MBIT)


def test_each_reference_branch_alone_carries_its_bottleneck() -> None:
    assert branch_capacities(reference_topology()) == pytest.approx(
        {"1": 25 * MBIT, "2": 25 * MBIT, "3": 75 * MBIT}
    )


def test_a_node_processing_limit_narrows_the_flow_like_a_link() -> None:
    topology = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("a", max_rate_bps=3.0), NodeSpec("k", "sink")],
        [LinkSpec("s", "a", 10.0), LinkSpec("a", "k", 10.0)],
    )

    assert max_flow(topology) == 3.0


def test_unlimited_links_make_an_unlimited_flow() -> None:
    topology = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("k", "sink")], [LinkSpec("s", "k")]
    )

    assert math.isinf(max_flow(topology))


def tagged(arrivals: list[float], tags: list[int]) -> Workload:
    return Workload(("1", "2"), MB, np.array(arrivals), np.array(tags, dtype=np.int64))


def test_a_backlog_drains_at_the_max_flow_rate() -> None:
    # 10 MB at t=0 through 2 MB/s: 5 s.
    assert fluid_bound(tagged([0.0] * 10, [0] * 10), 2 * MB) == 5.0


def test_a_slow_source_sets_the_pace_instead() -> None:
    # One packet per second through 2 MB/s: done half a second after the last arrives.
    assert fluid_bound(tagged([float(k) for k in range(10)], [0] * 10), 2 * MB) == 9.5


def test_the_minimum_share_is_what_a_branch_cannot_finish_by_the_bound() -> None:
    # 10 MB all tagged 1; two 1 MB/s branches drain it by 5 s only if half moves to 2.
    workload = tagged([0.0] * 10, [0] * 10)
    capacities = {"1": MB, "2": MB}

    assert minimum_share(workload, capacities, fluid_bound(workload, 2 * MB)) == 0.5


def test_tags_matching_the_capacities_need_no_migration() -> None:
    workload = tagged([0.0] * 10, [0, 1] * 5)

    assert minimum_share(workload, {"1": MB, "2": MB}, 5.0) == 0.0


def test_an_aggregation_that_shrinks_its_data_lifts_the_links_after_it() -> None:
    # Out of each branch goes a tenth of what came in: the output links (25, 25, 75)
    # carry 250, 250, 750 of the source's Mb/s, so the input links (50, 50, 100) bind.
    reductions = {"1": 0.1, "2": 0.1, "3": 0.1}

    assert reduced_max_flow(reference_topology(), reductions) == pytest.approx(200 * MBIT)


def test_without_reductions_the_flow_is_the_plain_max_flow() -> None:
    assert reduced_max_flow(reference_topology(), {}) == pytest.approx(125 * MBIT)


def test_an_operator_that_grows_its_data_narrows_the_links_after_it() -> None:
    # Branch 3 doubles its data: its 75 Mb/s output link carries 37.5 of the source's.
    flow = reduced_max_flow(reference_topology(), {"3": 2.0})

    assert flow == pytest.approx((25 + 25 + 37.5) * MBIT)


def test_a_node_limit_counts_what_reaches_it_not_what_left_the_source() -> None:
    # a halves the data; b processes 3 bytes/s of a's output, which is 6 of the source's.
    topology = Topology.build(
        [
            NodeSpec("s", "source"),
            NodeSpec("a"),
            NodeSpec("b", max_rate_bps=3.0),
            NodeSpec("k", "sink"),
        ],
        [LinkSpec("s", "a", 100.0), LinkSpec("a", "b", 100.0), LinkSpec("b", "k", 100.0)],
    )

    assert reduced_max_flow(topology, {"a": 0.5}) == pytest.approx(6.0)


def test_an_operator_that_emits_nothing_frees_the_links_after_it() -> None:
    topology = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("a"), NodeSpec("k", "sink")],
        [LinkSpec("s", "a", 10.0), LinkSpec("a", "k", 1.0)],
    )

    assert reduced_max_flow(topology, {"a": 0.0}) == 10.0


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
def test_a_reduction_that_is_not_a_finite_non_negative_number_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="reductions"):
        reduced_max_flow(reference_topology(), {"1": bad})


def test_a_file_read_at_once_drains_at_the_flow_rate() -> None:
    assert schedule_bound(np.array([0.0]), np.array([12.0]), 4.0) == 3.0


def test_uneven_arrivals_bind_at_the_latest_backlog() -> None:
    # 8 bytes at 0 and 8 at 3 through 2 bytes/s: at 3, 2 of the first are left, and
    # the 10 bytes then queued take 5 s more.
    assert schedule_bound(np.array([0.0, 3.0]), np.array([8.0, 8.0]), 2.0) == 8.0
