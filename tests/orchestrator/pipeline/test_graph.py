"""A run's graph: made once per configuration from its document, then asked per segment;
the operator a node runs when its document names none; batches dispatched by catalog."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import yaml

from balancer.document import PipelineDocument
from balancer.units import MB, MEGABIT
from orchestrator.pipeline.graph import (
    RunGraph,
    balancer_topology,
    bandwidth,
    downstreams_of,
    operator_problems,
)
from orchestrator.pipeline.routes import Routes
from orchestrator.rescale.plan import targets
from sparkjobs.catalog import DEFAULT_OPERATOR, OPERATORS, operator_name, operator_of
from sparkjobs.keygroups import KeyGroup

TOPOLOGIES = Path(__file__).resolve().parents[3] / "webapp/console/topologies"


def demo(name: str) -> PipelineDocument:
    return cast("PipelineDocument", yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text()))


def test_the_graph_answers_what_routing_asks() -> None:
    graph = RunGraph.of(demo("reference"))

    assert graph.source == "source"
    assert graph.downstreams_of("source") == ("task1", "task2", "task3")
    assert graph.downstreams_of("output") == ()
    assert graph.downstreams_of("ghost") == ()
    assert graph.bandwidth("source", "task3") == 100.0
    assert graph.bandwidth("task1", "task3") == 0.0  # not a link
    assert graph.stages["agg"] == ("task1", "task2", "task3")
    assert graph.stage_of["source"] == "source"
    assert graph.keyed == frozenset()
    assert graph.operator("task1") == "aggregate"


def test_a_keyed_stage_splits_by_even_key_groups_in_declaration_order() -> None:
    graph = RunGraph.of(demo("running-totals"))

    members = graph.stage_members("totals")
    assert members == ("totals1", "totals2")
    assert graph.keyed == frozenset(members)
    assert graph.key_groups("totals") == {
        m: KeyGroup.even(i, len(members)) for i, m in enumerate(members)
    }
    assert graph.key_groups("nothing") == {}


def test_the_balancer_view_comes_from_the_one_reading_with_the_catalogs_mergeability() -> None:
    doc = demo("running-totals")
    topology = balancer_topology(doc)

    assert topology is RunGraph.of(doc).topology
    assert {n.id for n in topology.nodes if not n.mergeable} == {"totals1", "totals2"}
    assert topology.node("source").capacity_bytes == 64 * MB
    link = next(iter(topology.links))
    assert link.bandwidth_bps == bandwidth(doc, link.src, link.dst) * MEGABIT


def test_a_running_stage_keyed_local_global_has_no_key_groups_and_its_data_merges() -> None:
    doc = demo("running-totals")
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {**node.get("params", {}), "keying": "local_global"}
    graph = RunGraph.of(doc)

    assert graph.keyed == frozenset()
    assert all(n.mergeable for n in graph.topology.nodes)
    # ...and its instances route like any mergeable stage's: the whole segment to one
    routes = Routes(shares={"totals1": 0.5, "totals2": 0.5})
    copies = targets(doc, "source", "c1", tag="", routes=routes, slots=KeyGroup())
    assert len(copies) == 1 and copies[0][2] == KeyGroup()


def test_a_graph_is_made_once_per_document_and_once_per_configuration() -> None:
    doc = demo("reference")
    assert RunGraph.of(doc) is RunGraph.of(doc)
    assert downstreams_of(doc, "source") == ["task1", "task2", "task3"]

    # The same configuration read again (a new object, the same content): the same graph
    first = RunGraph.at(424242, 3, doc)
    again = RunGraph.at(424242, 3, copy.deepcopy(doc))
    assert again is first
    # A rolled-back adjustment leaves the version and restores another graph: made anew
    rolled_back = copy.deepcopy(doc)
    rolled_back["edges"] = [e for e in rolled_back["edges"] if e["to"] != "task3"]
    restored = RunGraph.at(424242, 3, rolled_back)
    assert restored is not first
    assert restored.downstreams_of("source") == ("task1", "task2")
    # and whoever routes by that document finds the same graph
    assert RunGraph.of(restored.document) is restored


def test_a_node_without_an_operator_runs_its_kinds_default_from_the_catalog() -> None:
    assert DEFAULT_OPERATOR == {"source": "read", "operator": "aggregate", "sink": "merge"}
    for kind, name in DEFAULT_OPERATOR.items():
        assert OPERATORS[name].kind == kind
        assert operator_name({"name": "n", "kind": kind}) == name
    assert operator_name({"name": "n", "kind": "operator", "operator": "filter"}) == "filter"
    assert operator_name({"name": "n", "kind": "unknown"}) == ""

    doc = demo("reference")
    for node in doc["nodes"]:
        node.pop("operator", None)
    assert operator_problems(doc) == []
    assert RunGraph.of(doc).operator("task2") == "aggregate"


def test_every_operator_a_worker_runs_names_a_batch_job_the_catalog_can_find() -> None:
    for spec in OPERATORS.values():
        if spec.kind == "operator":
            module, _, function = (spec.batch_job or "").partition(":")
            assert module.startswith("sparkjobs.") and function, spec.name
            assert callable(spec.job()), spec.name  # imported, not run: no Spark starts
        else:
            assert spec.batch_job is None, spec.name  # the driver reads, the sink merges
    # The partial aggregates the sink merges come from exactly the aggregating operators.
    assert {n for n, s in OPERATORS.items() if s.partials} == {"aggregate", "running", "sql"}
    node: dict[str, Any] = {"name": "n", "kind": "operator", "operator": "running"}
    assert operator_of(node).stateful
