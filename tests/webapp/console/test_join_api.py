"""A join with reference data through the API, as an operator (the lowest role that
saves pipelines and starts runs): saved with its fields checked, and a run whose table
is not below the input folders is refused before anything is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Run
from tests.orchestrator.run.scenarios import input_folder, joined_flights
from tests.webapp.console.factories import client_for
from webapp.console.models import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _summing_the_name() -> Any:
    """The flights pipeline aggregating the airline's name as its value."""
    doc = joined_flights()
    for node in doc["nodes"]:
        if node["name"] in ("agg1", "agg2"):
            node["params"] = {"key": "carrier", "value": "name", "distinct": "tail"}
    return doc


@pytest.fixture
def inputs(settings: Any, tmp_path: Path) -> Path:
    root = input_folder(settings, tmp_path)
    (root / "flights.jsonl").write_text('{"carrier": "UA", "delay": 3.5, "tail": "N1"}\n')
    (root / "airlines.csv").write_text("carrier,name\nUA,United Air Lines Inc.\n")
    (tmp_path / "secret.csv").write_text("carrier,name\nUA,hunter2\n")
    return root


def test_an_operator_saves_a_join_and_sees_the_table_s_columns_reach_the_aggregate(
    inputs: Path,
) -> None:
    client, _ = client_for("otto", "operator")
    saved = client.post("/api/pipelines/", joined_flights(), content_type="application/json")
    assert saved.status_code == 201, saved.content
    assert Pipeline.objects.get(name="flights-by-airline").nodes.get(name="enrich").params[
        "columns"
    ] == ["name"]
    check = client.post(
        "/api/pipelines/validate/", joined_flights(), content_type="application/json"
    ).json()
    assert check["valid"] is True, check
    # The table's columns reach the editor with the types its job reads them with
    assert check["schemas"]["enrich"] == [
        {"name": "carrier", "type": "string"},
        {"name": "origin", "type": "string"},
        {"name": "delay", "type": "double"},
        {"name": "tail", "type": "string"},
        {"name": "name", "type": "string"},
    ]
    assert check["schemas"]["agg1"][0] == {"name": "name", "type": "string"}


def test_a_viewer_checking_a_join_reads_no_table(inputs: Path) -> None:
    client, _ = client_for("vera", "viewer")
    check = client.post(
        "/api/pipelines/validate/", joined_flights(), content_type="application/json"
    ).json()
    assert check["valid"] is True, check
    assert check["schemas"]["enrich"][-1] == {"name": "name", "type": "unknown"}
    # ...nor learns whether it exists
    missing = client.post(
        "/api/pipelines/validate/",
        joined_flights(reference="missing.csv"),
        content_type="application/json",
    ).json()
    assert missing["valid"] is True, missing


@pytest.mark.parametrize(
    ("doc", "where", "says"),
    [
        (
            joined_flights(columns=["name", "fleet"]),
            "nodes[1] (enrich).params.columns",
            "the reference table has no column 'fleet' (carrier, name)",
        ),
        (
            joined_flights(reference="numbered.jsonl"),
            "nodes[1] (enrich).params.on",
            "'carrier' is string in the records but long in the table",
        ),
        (
            joined_flights(reference="missing.csv"),
            "nodes[1] (enrich).params.reference",
            "the reference table 'missing.csv'",
        ),
        (
            _summing_the_name(),
            "nodes[2] (agg1).params.value",
            "string",
        ),
        (
            joined_flights(refresh_s=1),
            "nodes[1] (enrich).params",
            "parameter 'refresh_s' must be between 5 and 86400, got 1",
        ),
    ],
    ids=[
        "missing-column",
        "key-of-another-type",
        "missing-file",
        "joined-column-of-another-type",
        "refreshed-too-often",
    ],
)
def test_a_join_that_does_not_fit_its_table_is_refused_where_it_is_and_nothing_is_saved(
    inputs: Path, doc: Any, where: str, says: str
) -> None:
    (inputs / "numbered.jsonl").write_text('{"carrier": 19, "name": "United Air Lines Inc."}\n')
    client, _ = client_for("otto", "operator")
    refused = client.post("/api/pipelines/", doc, content_type="application/json")
    assert refused.status_code == 400, refused.content
    problems = refused.json()["problems"]
    assert any(p["location"] == where and says in p["message"] for p in problems), problems
    assert not Pipeline.objects.exists()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("missing.csv", "node enrich: the reference table 'missing.csv'"),
        ("link.csv", "node enrich: the reference table 'link.csv'"),
    ],
)
def test_a_run_whose_table_went_missing_or_leads_out_of_the_input_folders_is_refused(
    inputs: Path, no_start: list[int], table: str, says: str
) -> None:
    client, _ = client_for("otto", "operator")
    doc = joined_flights(reference=table)
    # Saved while the table was a file below the input folders, which it is no more
    (inputs / table).write_text("carrier,name\nUA,United Air Lines Inc.\n")
    assert client.post("/api/pipelines/", doc, content_type="application/json").status_code == 201
    (inputs / table).unlink()
    (inputs / "link.csv").symlink_to(inputs.parent / "secret.csv")
    refused = client.post(
        "/api/runs/",
        {"pipeline": "flights-by-airline", "input_path": "flights.jsonl"},
        content_type="application/json",
    )
    assert refused.status_code == 400, refused.content
    detail = refused.json()["detail"]
    assert says in detail and "nothing was created" in detail
    assert "hunter2" not in detail
    assert not Run.objects.exists() and no_start == []
