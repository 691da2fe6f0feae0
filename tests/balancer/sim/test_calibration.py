"""The simulator's model of the live runtime: batch cost fitted from a run, operators
that run as batches on shared workers, and data that shrinks as it is processed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from balancer.policy import Policy
from balancer.sim.calibration import RuntimeModel, fit_batch_cost
from balancer.sim.engine import Simulator
from balancer.sim.workload import Workload
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import MB

QUIET = Policy.from_mapping({"throttling": "none", "routing": "static", "migration": "off"})


def at_start(packets: int, tags: list[int] | None = None, branches: int = 1) -> Workload:
    names = tuple(f"op{i}" for i in range(branches))
    index = np.array(tags if tags is not None else [0] * packets, dtype=np.int64)
    return Workload(names, MB, np.zeros(packets), index)


def staged(at_s: list[float], tags: list[int] | None = None, branches: int = 1) -> Workload:
    """1 MB packets arriving at these times (seconds), for op0 unless ``tags`` say."""
    names = tuple(f"op{i}" for i in range(branches))
    index = np.array(tags if tags is not None else [0] * len(at_s), dtype=np.int64)
    return Workload(names, MB, np.array(at_s, dtype=float), index)


def chain(*, out_bandwidth: float = 0.0, branches: int = 1) -> Topology:
    """source -> op0 .. op{n-1} -> sink, every buffer large, links unlimited unless said."""
    ops = [f"op{i}" for i in range(branches)]
    nodes = [
        NodeSpec("src", "source", capacity_bytes=1000 * MB),
        *(NodeSpec(op, stage="agg", capacity_bytes=1000 * MB) for op in ops),
        NodeSpec("sink", "sink", capacity_bytes=1000 * MB),
    ]
    links = [LinkSpec("src", op) for op in ops]
    links += [LinkSpec(op, "sink", out_bandwidth) for op in ops]
    return Topology.build(nodes, links)


def completion(topology: Topology, workload: Workload, model: RuntimeModel | None) -> float:
    return Simulator(topology, workload, QUIET, (), model).run(max_time_s=1000).completion_s


def test_the_batch_cost_of_exact_samples_is_found_again() -> None:
    samples = [(size, 0.5 + size / (20 * MB)) for size in (MB, 4 * MB, 9 * MB, 30 * MB)]

    fixed, rate = fit_batch_cost(samples)

    assert fixed == pytest.approx(0.5)
    assert rate == pytest.approx(20 * MB)


def test_a_fit_that_would_need_a_negative_fixed_cost_goes_through_the_origin() -> None:
    fixed, rate = fit_batch_cost([(MB, 0.05), (2 * MB, 0.2), (3 * MB, 0.3)])

    assert fixed == 0.0
    # Least squares through the origin: (1 * 0.05 + 2 * 0.2 + 3 * 0.3) / (1 + 4 + 9) s/MB.
    assert rate == pytest.approx(MB * 14 / 1.35)


def test_batches_of_one_size_give_their_mean_time_and_no_rate() -> None:
    fixed, rate = fit_batch_cost([(MB, 0.4), (MB, 0.6)])

    assert fixed == pytest.approx(0.5)
    assert rate == math.inf


def test_no_batches_cannot_be_fitted() -> None:
    with pytest.raises(ValueError, match="no batches"):
        fit_batch_cost([])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"workers": 0}, "worker"),
        ({"batch_fixed_s": -1.0}, "fixed cost"),
        ({"batch_bytes_per_s": 0.0}, "rate"),
        ({"max_batch_bytes": 0.0}, "hold"),
        ({"reductions": {"op0": -0.5}}, "reductions"),
        ({"reductions": {"op0": math.nan}}, "reductions"),
    ],
)
def test_a_runtime_model_that_cannot_be_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RuntimeModel(**fields)  # type: ignore[arg-type]


def test_a_batch_takes_what_has_arrived_when_its_worker_starts_it() -> None:
    # The first packet starts a batch alone (1 s); the other nine arrive meanwhile and
    # make the second batch (1 s): done at 2 s, where one batch per packet took 10.
    model = RuntimeModel(batch_fixed_s=1.0)

    assert completion(chain(), staged([0.0] + [0.5] * 9), model) == pytest.approx(2.0)


def test_packets_that_arrive_at_one_instant_start_one_batch() -> None:
    # As a live batch task claims everything the source's send slice delivered, not
    # only its first chunk: ten packets at once are one batch.
    model = RuntimeModel(batch_fixed_s=1.0)

    assert completion(chain(), at_start(10), model) == pytest.approx(1.0)


def test_a_batch_costs_its_fixed_time_plus_its_bytes_at_the_worker_rate() -> None:
    model = RuntimeModel(batch_fixed_s=1.0, batch_bytes_per_s=MB)

    # 1 + 1 s for the first packet, then 1 + 9 s for the nine that came meanwhile.
    assert completion(chain(), staged([0.0] + [0.5] * 9), model) == pytest.approx(12.0)


def test_operators_share_the_workers_one_batch_at_a_time() -> None:
    # Two instances of a keyed stage (their batches are never fused), one packet each.
    two_branches = keyed(chain(branches=2))
    workload = at_start(2, tags=[0, 1], branches=2)

    one = completion(two_branches, workload, RuntimeModel(workers=1, batch_fixed_s=1.0))
    two = completion(two_branches, workload, RuntimeModel(workers=2, batch_fixed_s=1.0))

    assert one == pytest.approx(2.0)
    assert two == pytest.approx(1.0)


def keyed(topology: Topology) -> Topology:
    """``topology`` with its operators unable to merge partial results (a keyed stage)."""
    return Topology.build(
        [
            node if node.kind != "operator" else dataclasses.replace(node, mergeable=False)
            for node in topology.nodes
        ],
        topology.links,
    )


def test_a_batch_takes_what_has_arrived_at_its_stage_siblings_too() -> None:
    # The first packet starts op0's batch alone (1 s); one more for each branch arrives
    # meanwhile, and the next batch takes all three, as the live worker does: 2 s, where
    # a batch per branch took 4. A keyed stage's instances keep their own batches.
    three = chain(branches=3)
    workload = staged([0.0, 0.5, 0.5, 0.5], tags=[0, 0, 1, 2], branches=3)
    model = RuntimeModel(batch_fixed_s=1.0)

    assert completion(three, workload, model) == pytest.approx(2.0)
    assert completion(keyed(three), workload, model) == pytest.approx(4.0)


def test_a_batch_holds_at_most_the_largest_batch() -> None:
    # Three packets wait; batches of at most one packet: three batches after the first.
    model = RuntimeModel(batch_fixed_s=1.0, max_batch_bytes=MB)

    assert completion(chain(), at_start(4), model) == pytest.approx(4.0)


def test_a_batch_takes_the_packet_that_crosses_its_bound_as_the_ledger_s_claim_does() -> None:
    # Five packets at once: the first batch takes three (two fit in 2.5 MB and the third
    # crosses it), the next the other two. Bounded at 2 MB, the fifth waits for a third.
    assert completion(
        chain(), at_start(5), RuntimeModel(batch_fixed_s=1.0, max_batch_bytes=2.5 * MB)
    ) == pytest.approx(2.0)
    assert completion(
        chain(), at_start(5), RuntimeModel(batch_fixed_s=1.0, max_batch_bytes=2 * MB)
    ) == pytest.approx(3.0)


def test_data_an_operator_shrinks_crosses_its_output_link_faster() -> None:
    # Ten 1 MB packets through a 1 MB/s output link: 10 s as published; a tenth of the
    # bytes leave the operator, so 1 s.
    narrow = chain(out_bandwidth=MB)
    shrinking = narrow.with_reductions({"op0": 0.1})

    assert completion(narrow, at_start(10), None) == pytest.approx(10.0)
    assert completion(shrinking, at_start(10), None) == pytest.approx(1.0)
