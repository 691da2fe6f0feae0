"""The simulator on cases small enough to compute by hand."""

from __future__ import annotations

import numpy as np
import pytest

from balancer.model import Action, Observation, StartMigration
from balancer.policy import MB, Policy
from balancer.sim.control import controllers_for
from balancer.sim.engine import SimResult, Simulator
from balancer.sim.workload import Workload
from balancer.topology import LinkSpec, NodeSpec, Topology

STATIC = {"routing": "static", "migration": "off"}


def packets(count: int, tags: tuple[str, ...], tag_index: list[int] | None = None) -> Workload:
    """``count`` 1 MB packets all emitted at t=0 (tag 0 unless ``tag_index`` says)."""
    index = np.array(tag_index if tag_index is not None else [0] * count, dtype=np.int64)
    return Workload(tags, MB, np.zeros(count), index)


def run(topology: Topology, workload: Workload, policy: Policy) -> SimResult:
    return Simulator(topology, workload, policy, controllers_for(policy)).run(max_time_s=1e4)


def test_a_single_link_drains_at_its_bandwidth_plus_its_latency() -> None:
    # Given 10 packets of 1 MB behind one 1 MB/s link with 0.25 s latency
    topology = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("k", "sink")], [LinkSpec("s", "k", MB, 0.25)]
    )

    result = run(topology, packets(10, ("k",)), Policy.from_mapping(STATIC))

    # Then packet k is serialised during [k, k+1) and lands 0.25 s later.
    assert result.done_times.tolist() == [k + 1.25 for k in range(10)]
    assert result.completion_s == 10.25


def test_a_full_queue_stops_its_upstream_and_resumes_it_at_half() -> None:
    # Given s -> a (10 MB queue, free link) -> k (1 MB/s), 20 packets at t=0
    topology = Topology.build(
        [NodeSpec("s", "source"), NodeSpec("a", capacity_bytes=10 * MB), NodeSpec("k", "sink")],
        [LinkSpec("s", "a"), LinkSpec("a", "k", MB)],
    )
    policy = Policy.from_mapping({**STATIC, "throttling": "stop_resume"})

    result = run(topology, packets(20, ("a",)), policy)

    # When: a fills at once (10 MB) and stops s. Its link takes 2 packets at t=0 (one on
    # the wire, one in the send buffer) and one more each second, so a is at 5 MB (50%)
    # at t=3: s resumes, refills a with 5 packets, stops; the same again at t=8.
    assert result.left_source.tolist() == [0.0] * 10 + [3.0] * 5 + [8.0] * 5
    # a's link never idles: one packet per second reaches the sink.
    assert result.done_times.tolist() == [float(k + 1) for k in range(20)]
    # Stops at 0, 3, 8; resumes at 3, 8 and at 13 (a drained to 50%, s already empty).
    assert result.actions == {"set_rate": 6}


def two_branches() -> Topology:
    nodes = [NodeSpec("s", "source"), NodeSpec("b1"), NodeSpec("b2"), NodeSpec("k", "sink")]
    links = [LinkSpec(*pair, 8 * MB) for pair in (("s", "b1"), ("s", "b2"))]
    links += [LinkSpec(b, "k", 4 * MB) for b in ("b1", "b2")]
    return Topology.build(nodes, links)


def test_without_migration_every_packet_takes_its_tagged_branch() -> None:
    workload = packets(40, ("b1", "b2"), [0, 0, 0, 1] * 10)

    result = run(two_branches(), workload, Policy.from_mapping({**STATIC, "throttling": "credit"}))

    assert result.migrated_share == 0.0
    # b1 carries its 30 packets at 4 MB/s: the run takes about 7.5 s.
    assert result.completion_s == pytest.approx(7.5, abs=0.5)


class MigrateQuarter:
    """A controller that, at its first call, sends a quarter of b1's traffic to b2."""

    period_s = 1.0

    def __init__(self) -> None:
        self.sent = False

    def decide(self, observation: Observation) -> list[Action]:
        if self.sent:
            return []
        self.sent = True
        return [
            StartMigration(reason="test", branch_node="s", heavy=("b1",), light=("b2",), share=0.25)
        ]


def test_a_migration_diverts_exactly_its_share_of_the_heavy_branch() -> None:
    # Given 40 packets tagged b1, emitted after the controller's first call at t=0
    workload = Workload(("b1", "b2"), MB, 1.0 + 0.1 * np.arange(40), np.zeros(40, np.int64))
    policy = Policy.from_mapping(STATIC)

    result = Simulator(two_branches(), workload, policy, [MigrateQuarter()]).run(1e4)

    # Error diffusion: every 4th packet moves, none drawn at random.
    assert result.migrated_share == 0.25
    assert result.actions == {"start_migration": 1}
