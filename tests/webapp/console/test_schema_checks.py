"""A source's declared fields, checked when a pipeline is saved: a misspelt field is
refused where it is and nothing is saved, and the editor's check returns what each node
writes (sparkjobs/schemas.py, orchestrator/pipeline/schemas.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Event
from tests.orchestrator.run.scenarios import deduplicated_flights
from tests.webapp.console.factories import client_for, reference
from webapp.console.models import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _reading(params: dict[str, Any], was: str, now: str) -> None:
    """A stored stage of grouped measures reading ``now`` wherever it read ``was``."""
    for measure in params["measures"]:
        if measure.get("field") == was:
            measure["field"] = now
    params["required"] = [now if f == was else f for f in params["required"]]


class _Viewer:
    """A viewer checking edits of the reference pipeline's document."""

    def __init__(self) -> None:
        reference()
        self.client, _ = client_for("vera", "viewer")
        self.doc = self.client.get("/api/pipelines/reference/").json()["document"]

    def checks(self) -> Any:
        return self.client.post(
            "/api/pipelines/validate/", self.doc, content_type="application/json"
        ).json()


def test_a_viewer_s_check_returns_each_node_s_fields_and_a_misspelt_one_where_it_is() -> None:
    viewer = _Viewer()
    for node in viewer.doc["nodes"][1:4]:
        _reading(node["params"], "user", "usr")
    check = viewer.checks()
    assert check["valid"] is False
    problems = [(p["location"], p["message"]) for p in check["problems"]]
    assert problems == [
        (
            f"nodes[{i}] (task{i}).params.measures",
            "measures[5]: unknown field 'usr' (did you mean 'user'?); the input has key, "
            "value, user",
        )
        for i in (1, 2, 3)
    ]
    assert check["schemas"]["source"] == [
        {"name": "key", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "user", "type": "string"},
    ]
    assert [f["name"] for f in check["schemas"]["output"]][:2] == ["key", "count"]


def test_a_stage_of_the_key_form_is_checked_at_the_parameters_it_was_given_by() -> None:
    viewer = _Viewer()
    for node in viewer.doc["nodes"][1:4]:
        node["params"] = {"key": "key", "value": "value", "distinct": "usr"}
    check = viewer.checks()
    problems = [(p["location"], p["message"]) for p in check["problems"]]
    assert problems == [
        (
            f"nodes[{i}] (task{i}).params.distinct",
            "unknown field 'usr' (did you mean 'user'?); the input has key, value, user",
        )
        for i in (1, 2, 3)
    ]
    # ...and what it writes is the key and its measures by their names
    assert [f["name"] for f in check["schemas"]["output"]] == [
        "key",
        "count",
        "sum",
        "min",
        "max",
        "avg",
        "distinct_users",
    ]


def test_a_save_with_a_field_the_source_does_not_declare_is_refused_and_changes_nothing() -> None:
    pipeline = reference()
    client, _ = client_for("otto", "operator")
    doc = client.get("/api/pipelines/reference/").json()["document"]
    for node in doc["nodes"][1:4]:
        _reading(node["params"], "value", "amount")
    refused = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert refused.status_code == 400
    problems = refused.json()["problems"]
    assert {p["location"] for p in problems} == {
        f"nodes[{i}] (task{i}).params.measures" for i in (1, 2, 3)
    }
    assert all("unknown field 'amount'" in p["message"] for p in problems)
    assert pipeline.nodes.get(name="task1").params["measures"][1]["field"] == "value"
    # Declared, the same field is accepted
    doc["nodes"][0]["params"]["schema"] += ", amount long"
    saved = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert saved.status_code == 200, saved.content
    task1 = Pipeline.objects.get(name="reference").nodes.get(name="task1")
    assert task1.params["measures"][1] == {"name": "sum", "fn": "sum", "field": "amount"}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("key varchar", "type 'varchar'; use one of string, long, double"),
        ({"key": "string"}, "must list the fields and their types"),
        ("key string, Key long", "Key: declared twice"),
        ("a" * 500 + " string", "is not a field name"),
    ],
)
def test_a_bad_schema_is_a_400_naming_the_parameter(schema: object, says: str) -> None:
    reference()
    client, _ = client_for("otto", "operator")
    doc = client.get("/api/pipelines/reference/").json()["document"]
    doc["nodes"][0]["params"]["schema"] = schema
    refused = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert refused.status_code == 400
    messages = [p["message"] for p in refused.json()["problems"]]
    assert any(m.startswith("parameter 'schema'") and says in m for m in messages), messages
    stored = Pipeline.objects.get(name="reference").nodes.get(name="source").params["schema"]
    assert stored == "key string, value double, user string"


def test_a_parameter_refused_for_its_form_is_not_also_an_unknown_field() -> None:
    viewer = _Viewer()
    for node in viewer.doc["nodes"][1:4]:
        node["params"] = {"key": "a.b"}
    check = viewer.checks()
    assert [(p["location"], p["message"].split(" (")[0]) for p in check["problems"]] == [
        (f"nodes[{i}] (task{i}).params", "parameter 'key' must be a field name") for i in (1, 2, 3)
    ]


@pytest.fixture
def inputs(settings: Any, tmp_path: Path) -> Path:
    root = tmp_path / "inputs"
    root.mkdir()
    settings.INPUT_ROOTS = [str(root)]
    (root / "events.jsonl").write_text('{"key": "a", "value": 1.5, "user": "u1", "at": {"x": 1}}\n')
    (tmp_path / "secret.jsonl").write_text('{"password": "hunter2"}\n')
    return root


def test_an_operator_gets_a_schema_proposed_from_an_input_file(inputs: Path) -> None:
    client, _ = client_for("otto", "operator")
    body = {"path": "events.jsonl", "format": "jsonl"}
    answer = client.post("/api/pipelines/sample-schema/", body, content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {
        "schema": "key string, value double, user string",
        "nested": ["at"],
        "file": str((inputs / "events.jsonl").resolve()),
        "records": 1,
        "malformed": 0,
    }


def test_a_viewer_may_not_read_input_files_and_the_attempt_is_recorded(inputs: Path) -> None:
    client, _ = client_for("vera", "viewer")
    body = {"path": "events.jsonl"}
    refused = client.post("/api/pipelines/sample-schema/", body, content_type="application/json")
    assert refused.status_code == 403
    assert Event.objects.filter(kind="action_refused", user__username="vera").exists()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"path": "../secret.jsonl"}, "must lie under an input folder"),
        ({"path": "/etc/passwd"}, "must lie under an input folder"),
        ({"path": "events.jsonl", "format": "xml"}, "format must be one of jsonl, csv, parquet"),
        ({"path": ["events.jsonl"]}, "path and format must be text"),
        ({"path": "events.jsonl", "format": "csv"}, "its name says JSON lines"),
        (["events.jsonl"], "the body must be an object"),
    ],
)
def test_a_path_outside_the_input_folders_or_a_bad_body_is_a_400_saying_why(
    inputs: Path, body: object, says: str
) -> None:
    client, _ = client_for("otto", "operator")
    answer = client.post("/api/pipelines/sample-schema/", body, content_type="application/json")
    assert answer.status_code == 400
    assert says in answer.json()["detail"]
    assert "hunter2" not in answer.content.decode()


def test_a_deduplicate_stage_naming_an_unknown_field_or_period_is_refused_where_it_is() -> None:
    client, _ = client_for("otto", "operator")
    doc: Any = deduplicated_flights()
    doc["nodes"][1]["params"] = {"fields": ["id", "flihgt"], "within_s": 0}
    refused = client.post("/api/pipelines/", doc, content_type="application/json")
    assert refused.status_code == 400
    problems = {(p["location"], p["message"]) for p in refused.json()["problems"]}
    assert (
        "nodes[1] (once).params",
        "parameter 'within_s' must be between 1 and 604800, got 0",
    ) in problems
    assert not Pipeline.objects.exists()
    doc["nodes"][1]["params"] = {"fields": ["id", "flihgt"]}
    refused = client.post("/api/pipelines/", doc, content_type="application/json")
    assert [(p["location"], p["message"]) for p in refused.json()["problems"]] == [
        (
            "nodes[1] (once).params.fields",
            "[1] unknown field 'flihgt'; the input has id, carrier, origin, delay",
        )
    ]
    doc["nodes"][1]["params"] = {"fields": ["id"]}
    saved = client.post("/api/pipelines/", doc, content_type="application/json")
    assert saved.status_code == 201, saved.content
