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
