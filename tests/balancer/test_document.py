"""A pipeline document as the balancer sees it: one reading, one set of defaults, and the
units it is read in (balancer/document.py, balancer/units.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from balancer import policy, units
from balancer.document import NodeDocument, PipelineDocument
from balancer.sim import reference
from balancer.topology import LinkSpec, NodeSpec, Topology

# Every optional field left out: what each reader gets is the defaults.
BARE: PipelineDocument = {
    "name": "bare",
    "nodes": [
        {"name": "in", "kind": "source"},
        {"name": "work", "kind": "operator"},
        {"name": "out", "kind": "sink"},
    ],
    "edges": [{"from": "in", "to": "work"}, {"from": "work", "to": "out"}],
}

FULL: PipelineDocument = {
    "name": "full",
    "nodes": [
        {"name": "in", "kind": "source", "buffer_mb": 8, "max_rate_mbps": 80},
        {"name": "a1", "kind": "operator", "stage": "a", "operator": "running"},
        {"name": "a2", "kind": "operator", "stage": "a", "operator": "running"},
        {"name": "out", "kind": "sink", "buffer_mb": 0.5},
    ],
    "edges": [
        {"from": "in", "to": "a1", "bandwidth_mbps": 50, "latency_ms": 4},
        {"from": "in", "to": "a2", "bandwidth_mbps": 50},
        {"from": "a1", "to": "out"},
        {"from": "a2", "to": "out"},
    ],
}


def test_the_units_are_defined_once_and_shared() -> None:
    assert (units.KB, units.MB, units.GB) == (1024, 1024**2, 1024**3)
    # A live run's Mb/s is 10^6 bits; the published experiment's is 2^20 bits.
    assert units.MEGABIT == 125_000
    assert units.SPEC_MEGABIT == units.MB / 8
    # The spec's worked figure: 5 GB at 125 Mb/s is "about 328 s".
    seconds = 5 * units.GB / (125 * units.SPEC_MEGABIT)
    assert seconds == pytest.approx(327.68)
    # The policy, the simulator and the topology read the same constants.
    assert policy.MB is units.MB
    assert reference.MBIT == units.SPEC_MEGABIT
    assert NodeSpec("n").capacity_bytes == 128 * units.MB


def test_a_bare_document_takes_every_default() -> None:
    topology = Topology.from_document(BARE)

    assert topology.order == ("in", "work", "out")
    for name, kind in (("in", "source"), ("work", "operator"), ("out", "sink")):
        assert topology.node(name) == NodeSpec(
            name, kind=kind, capacity_bytes=128 * units.MB, mergeable=True, max_rate_bps=0.0
        )
        assert topology.node(name).stage_name == name
    assert topology.links == (LinkSpec("in", "work"), LinkSpec("work", "out"))


def test_a_node_without_a_kind_is_an_operator_and_edges_may_be_absent() -> None:
    doc = {"name": "one", "nodes": [{"name": "alone"}]}

    topology = Topology.from_document(doc)  # type: ignore[arg-type]

    assert topology.node("alone").kind == "operator"
    assert topology.links == ()


def test_every_given_field_is_read_with_the_runtime_megabit() -> None:
    topology = Topology.from_document(FULL)

    source = topology.node("in")
    assert source.capacity_bytes == 8 * units.MB
    assert source.max_rate_bps == 80 * units.MEGABIT == 10_000_000
    assert topology.node("out").capacity_bytes == units.MB / 2
    assert topology.stage_members("a") == ("a1", "a2")
    assert topology.link("in", "a1") == LinkSpec("in", "a1", 50 * units.MEGABIT, 0.004)
    assert topology.link("a1", "out") == LinkSpec("a1", "out", 0.0, 0.0)


def test_mergeability_is_the_callers_answer_and_every_node_without_one() -> None:
    def keyed_operators_are_not(node: NodeDocument) -> bool:
        return node.get("operator") != "running"

    assert all(n.mergeable for n in Topology.from_document(FULL).nodes)
    asked = Topology.from_document(FULL, mergeable=keyed_operators_are_not)
    assert [n.id for n in asked.nodes if not n.mergeable] == ["a1", "a2"]


def test_the_simulator_reads_a_document_the_same_way_in_its_own_megabit() -> None:
    simulated = reference.topology_from_document(FULL)
    live = Topology.from_document(FULL)

    assert [n.id for n in simulated.nodes] == [n.id for n in live.nodes]
    assert [n.capacity_bytes for n in simulated.nodes] == [n.capacity_bytes for n in live.nodes]
    assert simulated.link("in", "a1").bandwidth_bps == 50 * units.SPEC_MEGABIT
    assert simulated.link("in", "a1").latency_s == live.link("in", "a1").latency_s == 0.004
    assert simulated.node("in").max_rate_bps == 80 * units.SPEC_MEGABIT


def test_the_reference_file_is_the_reference_topology() -> None:
    path = Path(__file__).resolve().parents[2] / "webapp/console/topologies/reference.yaml"
    loaded = reference.load_topology(path)
    built = reference.reference_topology()

    assert [n.capacity_bytes for n in loaded.nodes] == [n.capacity_bytes for n in built.nodes]
    assert sorted(lk.bandwidth_bps for lk in loaded.links) == sorted(
        lk.bandwidth_bps for lk in built.links
    )


def test_a_cycle_is_refused() -> None:
    doc: PipelineDocument = {
        "name": "loop",
        "nodes": [{"name": "a", "kind": "operator"}, {"name": "b", "kind": "operator"}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}],
    }

    with pytest.raises(ValueError, match="cycle"):
        Topology.from_document(doc)
