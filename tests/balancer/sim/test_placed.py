"""Placed operators in the simulator (``placement = placed``): each runs its batches on
the Spark worker it was placed on, at the cost fitted from its own batches, never with a
sibling's data, and shows the balancer that worker's rate and name."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from balancer.model import SHARED_POOL
from balancer.policy import Policy
from balancer.sim.calibration import BatchSample, NodeCost, RuntimeModel, fit_node_cost
from balancer.sim.control import BENCHMARK_POLICIES, controllers_for
from balancer.sim.engine import Simulator
from balancer.sim.replay import Replay
from balancer.sim.workload import Workload
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import MB
from tests.balancer.sim.test_calibration import QUIET, at_start, chain, completion, staged
from tests.balancer.sim.test_replay import replay

# Two workers, the first four times as fast as the second, both 0.5 s a batch to start.
FAST = NodeCost(fixed_s=0.5, bytes_per_s=4 * MB, worker="w1")
SLOW = NodeCost(fixed_s=0.5, bytes_per_s=MB, worker="w2")


def two_branches(*, pool_bytes: float) -> Topology:
    """source -> op0, op1 -> sink, each operator's pool ``pool_bytes``."""
    wide = chain(branches=2)
    return Topology.build(
        [
            dataclasses.replace(n, capacity_bytes=pool_bytes) if n.kind == "operator" else n
            for n in wide.nodes
        ],
        wide.links,
    )


def batches_at(fixed_s: float, rate: float, sizes: list[float], gap_s: float) -> list[BatchSample]:
    """Back-to-back batches of these sizes, each ``gap_s`` after the one before."""
    found, at = [], 0.0
    for size in sizes:
        done = at + fixed_s + size / rate
        found.append(BatchSample(at, done, size))
        at = done + gap_s
    return found


def test_a_placed_cost_is_its_own_batches_fit_plus_the_gap_between_them() -> None:
    own = batches_at(0.3, 2 * MB, [MB, 3 * MB, 2 * MB, 5 * MB], gap_s=0.1)

    cost = fit_node_cost(own, worker="w1")

    assert cost.fixed_s == pytest.approx(0.3 + 0.1)
    assert cost.bytes_per_s == pytest.approx(2 * MB)
    assert cost.worker == "w1"


@pytest.mark.parametrize(
    ("own", "rate", "gap"),
    [
        ([BatchSample(0.0, 2.0, MB)], MB / 2, 0.0),  # one batch
        ([BatchSample(0.0, 1.0, MB), BatchSample(1.5, 3.5, MB)], 2 * MB / 3, 0.5),  # one size
        ([BatchSample(0.0, 2.0, MB), BatchSample(2.5, 3.5, 2 * MB)], MB, 0.5),  # not growing
    ],
)
def test_batches_that_cannot_separate_a_fixed_cost_give_their_throughput(
    own: list[BatchSample], rate: float, gap: float
) -> None:
    # Their bytes over their seconds, the gap between back-to-back ones still paid.
    cost = fit_node_cost(own, worker="w1")
    assert cost.bytes_per_s == pytest.approx(rate)
    assert cost.fixed_s == pytest.approx(gap)
    assert cost.worker == "w1"


def test_a_placed_node_without_batches_is_not_fitted() -> None:
    with pytest.raises(ValueError, match="0 batches"):
        fit_node_cost([])


@pytest.mark.parametrize(
    ("fixed_s", "bytes_per_s"), [(-0.1, MB), (0.5, 0.0), (math.nan, MB), (0.5, math.nan)]
)
def test_a_placed_cost_that_cannot_be_is_refused(fixed_s: float, bytes_per_s: float) -> None:
    with pytest.raises(ValueError, match="placed batch"):
        NodeCost(fixed_s, bytes_per_s)


def test_a_runtime_reads_back_its_placed_costs_and_one_written_without_them_places_none() -> None:
    runtime = RuntimeModel(batch_fixed_s=0.2, placed={"op0": FAST, "op1": SLOW})
    pooled = RuntimeModel(batch_fixed_s=0.2).to_json()
    del pooled["placed"]

    assert RuntimeModel.from_json(json.loads(json.dumps(runtime.to_json()))) == runtime
    assert RuntimeModel.from_json(pooled) == RuntimeModel(batch_fixed_s=0.2)


def test_a_placed_node_the_pipeline_does_not_run_is_refused() -> None:
    runtime = RuntimeModel(placed={"op0": FAST, "nowhere": SLOW})
    written = replay().to_json() | {"runtime": RuntimeModel(placed={"nowhere": SLOW}).to_json()}

    with pytest.raises(ValueError, match="nowhere"):
        Simulator(chain(), at_start(1), QUIET, (), runtime)
    with pytest.raises(ValueError, match="nowhere"):
        Replay.from_json(written)


def test_two_placed_workers_at_4_to_1_finish_a_static_split_when_the_slow_one_does() -> None:
    # Five 1 MB packets for each branch, all there at the start: each worker takes its
    # five in one batch, op0 0.5 + 5/4 s, done at 1.75 s; op1 0.5 + 5 s, at 5.5 s.
    workload = at_start(10, tags=[0, 1] * 5, branches=2)
    placed = RuntimeModel(placed={"op0": FAST, "op1": SLOW})
    simulator = Simulator(chain(branches=2), workload, QUIET, (), placed)

    result = simulator.run(max_time_s=100)

    assert result.completion_s == pytest.approx(5.5)
    assert result.done_times[0::2].max() == pytest.approx(1.75)


def test_a_placed_worker_takes_its_pool_in_batches_of_at_most_half_of_it() -> None:
    # Four 1 MB packets for op1 in a 4 MB pool. Placed, its worker claims 2 MB, then the
    # other 2 (0.5 + 2 s each: done at 5 s), so that a source still sending had room
    # while the first ran (balancer/runtime.py, PLACED_BATCH_POOL_SHARE); the shared
    # workers at the same cost take the whole pool in one batch (0.5 + 4 s).
    two = two_branches(pool_bytes=4 * MB)
    workload = at_start(4, tags=[1] * 4, branches=2)

    placed = completion(two, workload, RuntimeModel(placed={"op0": FAST, "op1": SLOW}))
    pooled = completion(two, workload, RuntimeModel(batch_fixed_s=0.5, batch_bytes_per_s=MB))

    assert placed == pytest.approx(5.0)
    assert pooled == pytest.approx(4.5)


def test_operators_placed_on_one_worker_take_turns_and_never_share_a_batch() -> None:
    # op0 takes its first packet alone (1 s); op1's and op2's packets and op0's second
    # come meanwhile. On the shared pool the next batch takes all three (done at 2 s);
    # placed on one worker, op1, op2 and op0 each run a batch of their own, in the
    # order they asked: done at 4 s.
    three = chain(branches=3)
    workload = staged([0.0, 0.5, 0.5, 0.5], tags=[0, 0, 1, 2], branches=3)
    one_worker = NodeCost(fixed_s=1.0, bytes_per_s=math.inf, worker="w1")

    pooled = completion(three, workload, RuntimeModel(batch_fixed_s=1.0))
    placed = completion(
        three, workload, RuntimeModel(placed=dict.fromkeys(("op0", "op1", "op2"), one_worker))
    )

    assert pooled == pytest.approx(2.0)
    assert placed == pytest.approx(4.0)


def test_a_placed_node_shows_the_balancer_the_rate_its_batches_showed_and_its_worker() -> None:
    # One 1 MB packet each for op0 (0.5 s + 1 MB at 4 MB/s) and op1 (0.5 s + 1 MB at
    # 1 MB/s); op2, on the shared workers, gets none. As the live driver measures it:
    # bytes over the seconds the batches ran, a batch's fixed cost included.
    three = chain(branches=3)
    runtime = RuntimeModel(batch_bytes_per_s=3 * MB, placed={"op0": FAST, "op1": SLOW})
    simulator = Simulator(three, at_start(2, tags=[0, 1], branches=3), QUIET, (), runtime)
    before = simulator.levels.observe().nodes

    simulator.run(max_time_s=100)
    after = simulator.levels.observe().nodes

    assert {n: before[n].capacity_bps for n in ("op0", "op1", "op2")} == dict.fromkeys(
        ("op0", "op1", "op2"), math.inf
    )
    assert after["op0"].capacity_bps == pytest.approx(MB / 0.75)
    assert after["op1"].capacity_bps == pytest.approx(MB / 1.5)
    assert after["op2"].capacity_bps == math.inf  # nothing measured
    assert {n: after[n].resource for n in ("op0", "op1", "op2")} == {
        "op0": "w1",
        "op1": "w2",
        "op2": SHARED_POOL,
    }


def test_placed_on_unequal_workers_proportional_migration_beats_static_routing() -> None:
    # Half the input is tagged for the slow worker. Static routing waits for it; the
    # balancer sees the two workers' rates and moves what the slow one cannot take.
    two = two_branches(pool_bytes=8 * MB)
    workload = at_start(40, tags=[0, 1] * 20, branches=2)
    runtime = RuntimeModel(placed={"op0": FAST, "op1": SLOW})

    def placed(name: str) -> float:
        policy = BENCHMARK_POLICIES[name].policy()
        simulator = Simulator(two, workload, policy, controllers_for(policy), runtime)
        return simulator.run(max_time_s=1000).completion_s

    assert placed("ours") < 0.8 * placed("credit")


def test_waiting_data_moves_from_the_slow_worker_s_pool_to_the_fast_one() -> None:
    # Forty 1 MB packets split evenly, all in the pools at the start: left alone, the
    # 1 MB/s worker works through its twenty for ~20 s while the 4 MB/s one idles after
    # ~5 s. Moving what waits in the slow pool, the stage ends near 40 MB / 5 MB/s.
    two = chain(branches=2)
    workload = at_start(40, tags=[0, 1] * 20, branches=2)
    placed = RuntimeModel(placed={"op0": FAST, "op1": SLOW})
    moving = Policy.from_mapping(
        {"throttling": "none", "routing": "static", "migration": "proportional"}
    )

    alone = Simulator(two, workload, QUIET, (), placed).run(max_time_s=1000)
    moved = Simulator(two, workload, moving, controllers_for(moving), placed).run(max_time_s=1000)

    assert alone.completion_s > 20.0
    assert moved.actions.get("move_queued", 0) >= 1
    assert moved.migrated_bytes >= 5 * MB
    assert moved.completion_s < 0.7 * alone.completion_s


def test_with_large_pools_a_late_worker_takes_its_share_and_the_rest_of_its_pool_moves() -> None:
    # The same forty packets with 32 MB pools: each pool holds all of its branch's
    # twenty. A slow worker claiming its whole pool would run 20 s alone (a batch holds
    # what it claimed: nothing of it can move); bounded to its share of the stage's
    # common drain time, it leaves the rest waiting, and the fast worker takes it.
    two = two_branches(pool_bytes=32 * MB)
    workload = at_start(40, tags=[0, 1] * 20, branches=2)
    placed = RuntimeModel(placed={"op0": FAST, "op1": SLOW})
    moving = Policy.from_mapping(
        {"throttling": "none", "routing": "static", "migration": "proportional"}
    )

    run = Simulator(two, workload, moving, controllers_for(moving), placed).run(max_time_s=1000)

    assert run.actions.get("bound_batches", 0) >= 1
    fluid_s = 40 * MB / (FAST.bytes_per_s + SLOW.bytes_per_s) + FAST.fixed_s
    assert run.completion_s <= 1.25 * fluid_s


def test_a_node_on_modelled_workers_whose_batches_cost_nothing_shows_no_limit() -> None:
    costless = RuntimeModel(placed={"op0": NodeCost(fixed_s=0.0, bytes_per_s=math.inf)})
    simulator = Simulator(chain(branches=2), at_start(1), QUIET, (), costless)

    nodes = simulator.levels.observe().nodes

    assert nodes["op0"].capacity_bps == math.inf
    assert nodes["op1"].capacity_bps == math.inf  # the shared pool's batches, free too


def test_a_full_pool_shows_the_demand_it_refused_and_published_migration_acts_on_it() -> None:
    # The live source reports a chunk a full pool refused as part of that node's input
    # (orchestrator/run/observer.py), so a full pool reads as "input faster than
    # output" even while nothing gets in. Chunks a little over 1 MB leave an 8 MB pool
    # at seven (level 0.875, never full enough for stop/resume), and a full pool's only
    # output is a whole batch at once: without the refused demand the published
    # detector (Q > 0.8 and input above output) seldom fires, and the slow branch works
    # through the hot data alone.
    three = Topology.build(
        [
            NodeSpec("src", "source", capacity_bytes=1000 * MB),
            *(NodeSpec(f"op{i}", stage="agg", capacity_bytes=8 * MB) for i in range(3)),
            NodeSpec("sink", "sink", capacity_bytes=1000 * MB),
        ],
        [LinkSpec("src", f"op{i}") for i in range(3)]
        + [LinkSpec(f"op{i}", "sink") for i in range(3)],
    )
    hot = [1, 1, 0, 1, 2, 1, 0, 1, 2] * 12  # 56% to op1, the slowest worker's
    workload = Workload(
        ("op0", "op1", "op2"), 1.001 * MB, np.zeros(len(hot)), np.array(hot, np.int64)
    )
    runtime = RuntimeModel(
        placed={
            "op0": NodeCost(fixed_s=0.6, bytes_per_s=12 * MB, worker="w2"),
            "op1": NodeCost(fixed_s=1.3, bytes_per_s=5 * MB, worker="w3"),
            "op2": NodeCost(fixed_s=0.7, bytes_per_s=30 * MB, worker="w1"),
        },
        max_batch_bytes=32 * MB,
    )
    pressure = BENCHMARK_POLICIES["pressure"].policy()

    run = Simulator(three, workload, pressure, controllers_for(pressure), runtime).run(1000)
    alone = Simulator(three, workload, QUIET, (), runtime).run(1000)

    hot_bytes = hot.count(1) * 1.001 * MB
    assert run.migrated_bytes > 0.8 * hot_bytes  # 0.77 of it without the refused demand
    assert run.completion_s < 0.5 * alone.completion_s  # 0.56 without
