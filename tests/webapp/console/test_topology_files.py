"""load_topology / export_topology against the real database."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from webapp.console.models import Edge, Node, Pipeline, Policy
from webapp.console.topology_io import dump_yaml, export_document

REFERENCE = Path(__file__).resolve().parents[3] / "webapp/console/topologies/reference.yaml"

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def load(path: Path) -> str:
    out = io.StringIO()
    call_command("load_topology", str(path), stdout=out)
    return out.getvalue()


def export(name: str) -> str:
    out = io.StringIO()
    call_command("export_topology", name, stdout=out)
    return out.getvalue()


def test_load_reference_creates_the_five_node_pipeline() -> None:
    assert "Created pipeline 'reference': 5 nodes, 6 edges" in load(REFERENCE)
    pipeline = Pipeline.objects.get(name="reference")
    bandwidths = {(e.source.name, e.target.name): e.bandwidth_mbps for e in pipeline.edges.all()}
    assert bandwidths == {
        ("source", "task1"): 50,
        ("source", "task2"): 50,
        ("source", "task3"): 100,
        ("task1", "output"): 25,
        ("task2", "output"): 25,
        ("task3", "output"): 75,
    }
    assert {n.stage_name for n in pipeline.nodes.filter(kind="operator")} == {"agg"}


def test_a_stage_in_the_key_form_is_saved_as_the_grouped_measures_it_means(
    tmp_path: Path,
) -> None:
    # Given the reference pipeline, whose stages are in the key form
    assert yaml.safe_load(REFERENCE.read_text())["nodes"][1]["params"] == {
        "key": "key",
        "value": "value",
        "distinct": "user",
        "aggregates": ["count", "sum", "min", "max", "avg", "count_distinct"],
    }
    # When it is loaded
    load(REFERENCE)
    # Then each stage is kept as its grouping: the key grouped by, the measures named as
    # the form's results are, the three fields required
    task1 = Node.objects.get(pipeline__name="reference", name="task1")
    assert task1.params == {
        "group_by": ["key"],
        "measures": [
            {"name": "count", "fn": "count"},
            {"name": "sum", "fn": "sum", "field": "value"},
            {"name": "min", "fn": "min", "field": "value"},
            {"name": "max", "fn": "max", "field": "value"},
            {"name": "avg", "fn": "avg", "field": "value"},
            {"name": "distinct_users", "fn": "count_distinct", "field": "user"},
        ],
        "required": ["key", "value", "user"],
    }
    # ...what is exported loads again as it is
    first = export("reference")
    (tmp_path / "again.yaml").write_text(first)
    load(tmp_path / "again.yaml")
    assert export("reference") == first
    # ...and a subset of the form's aggregates is that subset of its measures
    doc = yaml.safe_load(REFERENCE.read_text())
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {"aggregates": ["count", "sum", "count_distinct"]}
    (tmp_path / "subset.yaml").write_text(yaml.safe_dump(doc))
    load(tmp_path / "subset.yaml")
    task2 = Node.objects.get(pipeline__name="reference", name="task2")
    assert [m["name"] for m in task2.params["measures"]] == ["count", "sum", "distinct_users"]


def test_export_then_load_gives_the_same_pipeline(tmp_path: Path) -> None:
    load(REFERENCE)
    first = export("reference")
    (tmp_path / "again.yaml").write_text(first)
    assert "Updated pipeline 'reference'" in load(tmp_path / "again.yaml")
    assert export("reference") == first
    assert yaml.safe_load(first)["name"] == "reference"


def test_update_keeps_nodes_by_name_and_applies_changes(tmp_path: Path) -> None:
    load(REFERENCE)
    task1_id = Node.objects.get(pipeline__name="reference", name="task1").id
    doc = export_document(Pipeline.objects.get(name="reference"))
    doc["nodes"][1]["buffer_mb"] = 32
    doc["policy_overrides"] = {"high_water": 0.8, "low_water": 0.3}
    (tmp_path / "changed.yaml").write_text(dump_yaml(doc))
    load(tmp_path / "changed.yaml")
    node = Node.objects.get(pipeline__name="reference", name="task1")
    assert node.id == task1_id
    assert node.buffer_mb == 32
    assert Pipeline.objects.get(name="reference").effective_policy_values()["high_water"] == 0.8


def test_invalid_file_saves_nothing_and_names_every_problem(tmp_path: Path) -> None:
    load(REFERENCE)
    before = export("reference")
    doc = yaml.safe_load(before)
    doc["nodes"][1]["buffer_mb"] = 1  # a valid change that must not be applied either
    doc["edges"].append({"from": "task3", "to": "ghost"})
    doc["policy_overrides"] = {"duty_ratio": 2}
    (tmp_path / "bad.yaml").write_text(dump_yaml(doc))
    with pytest.raises(CommandError) as err:
        load(tmp_path / "bad.yaml")
    text = str(err.value)
    assert "2 problem(s), nothing saved" in text
    assert "edges[6].to: unknown node 'ghost'" in text
    assert "policy_overrides.duty_ratio" in text
    assert export("reference") == before


def test_unknown_named_policy_is_an_error(tmp_path: Path) -> None:
    doc = yaml.safe_load(REFERENCE.read_text())
    doc["policy"] = "nonexistent"
    (tmp_path / "p.yaml").write_text(dump_yaml(doc))
    with pytest.raises(CommandError, match="unknown policy 'nonexistent'"):
        load(tmp_path / "p.yaml")
    assert not Pipeline.objects.filter(name="reference").exists()


def test_named_policy_is_the_base_of_the_overrides(tmp_path: Path) -> None:
    Policy.objects.create(name="eager", high_water=0.6, low_water=0.1)
    doc = yaml.safe_load(REFERENCE.read_text())
    doc["policy"] = "eager"
    doc["policy_overrides"] = {"alpha": 0.5}
    (tmp_path / "p.yaml").write_text(dump_yaml(doc))
    load(tmp_path / "p.yaml")
    values = Pipeline.objects.get(name="reference").effective_policy_values()
    assert (values["high_water"], values["low_water"], values["alpha"]) == (0.6, 0.1, 0.5)


def test_yaml_syntax_error_points_at_the_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: x\nnodes: [\n  - a\n")
    with pytest.raises(CommandError, match=r"line \d+, column \d+: not valid YAML"):
        load(tmp_path / "broken.yaml")
    assert Edge.objects.count() == 0


def test_missing_file_and_unknown_pipeline() -> None:
    with pytest.raises(CommandError, match="cannot read"):
        load(Path("/nonexistent/topology.yaml"))
    with pytest.raises(CommandError, match="no pipeline named 'nope'"):
        export("nope")
