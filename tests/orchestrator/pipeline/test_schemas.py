"""Each node's fields, walked from the schema its source declares (orchestrator/pipeline/
schemas.py): what reaches which node, and one problem where a field is misspelt."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.pipeline.schemas import SchemaProblem, derive
from tests.orchestrator.run.scenarios import REFERENCE

DECLARED = "key string, value double, user string"


def _reference(schema: Any = DECLARED) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    params = doc["nodes"][0]["params"]
    if schema is None:
        params.pop("schema", None)
    else:
        params["schema"] = schema
    return doc


def test_the_declared_fields_reach_every_node_and_the_aggregates_reach_the_sink() -> None:
    doc = _reference()
    found = derive(doc["nodes"], doc["edges"])
    assert found.problems == []
    assert [f.name for f in found.by_node["source"].fields] == ["key", "value", "user"]
    written = [(f.name, f.type) for f in found.by_node["task2"].fields]
    assert written == [
        ("key", "string"),
        ("count", "long"),
        ("sum", "double"),
        ("min", "double"),
        ("max", "double"),
        ("avg", "double"),
        ("distinct_users", "long"),  # each measure named as the result's rows name it
    ]
    assert found.by_node["output"] == found.by_node["task1"]


def test_a_pipeline_whose_source_declares_nothing_is_not_checked() -> None:
    doc = _reference(schema=None)
    for node in doc["nodes"][1:4]:
        node["params"]["value"] = "no_such_field"
    found = derive(doc["nodes"], doc["edges"])
    assert found.problems == [] and found.by_node == {}


def test_a_misspelt_field_is_one_problem_where_it_is_not_one_per_node_downstream() -> None:
    doc = _reference()
    doc["nodes"][2]["params"]["value"] = "valeu"
    found = derive(doc["nodes"], doc["edges"])
    assert found.problems == [
        SchemaProblem(
            2,
            "value",
            "unknown field 'valeu' (did you mean 'value'?); the input has key, value, user",
        )
    ]


def test_a_node_fed_by_branches_with_different_fields_is_checked_against_each() -> None:
    doc = _reference()
    # task2 renames user to who; a filter after task1 and task2 reads user
    doc["nodes"][2].update(
        operator="project", stage="p", params={"columns": ["key", "value", "user AS who"]}
    )
    doc["nodes"][1].update(operator="filter", stage="f", params={"condition": "value > 0"})
    doc["nodes"].insert(
        4,
        {
            "name": "late",
            "kind": "operator",
            "operator": "filter",
            "params": {"condition": "user > 'u5'"},
        },
    )
    doc["edges"] = [e for e in doc["edges"] if e["to"] != "output" or e["from"] == "task3"]
    doc["edges"] += [
        {"from": "task1", "to": "late"},
        {"from": "task2", "to": "late"},
        {"from": "late", "to": "output"},
    ]
    found = derive(doc["nodes"], doc["edges"])
    assert [(p.node, p.param, p.message.split(";")[0]) for p in found.problems] == [
        (4, "condition", "at character 1: unknown field 'user'")
    ]


def test_the_route_field_of_the_source_must_be_declared() -> None:
    doc = _reference("id string, value double, user string")
    found = derive(doc["nodes"], doc["edges"])
    assert [(p.node, p.param) for p in found.problems] == [
        (0, "route_by"),
        (1, "key"),
        (2, "key"),
        (3, "key"),
    ]


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200)
@given(nodes=json_like, edges=json_like)
def test_any_document_is_walked_without_an_error(nodes: Any, edges: Any) -> None:
    found = derive(nodes, edges)
    assert isinstance(found.problems, list)


@given(
    damage=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.sampled_from(["params", "name", "kind", "operator"]),
            st.sampled_from([None, 7, [], {}, "x", {"schema": []}, {"schema": "a long"}]),
        ),
        max_size=4,
    )
)
def test_a_damaged_reference_is_walked_without_an_error(damage: list[tuple[int, str, Any]]) -> None:
    doc = _reference()
    for index, key, value in damage:
        doc["nodes"][index][key] = value
    derive(doc["nodes"], doc["edges"])
