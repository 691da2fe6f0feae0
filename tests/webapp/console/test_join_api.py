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
    assert [f["name"] for f in check["schemas"]["enrich"]] == ["carrier", "delay", "tail", "name"]
    assert check["schemas"]["agg1"][0]["name"] == "name"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("missing.csv", "node enrich: the reference table 'missing.csv'"),
        ("link.csv", "node enrich: the reference table 'link.csv'"),
    ],
)
def test_a_run_whose_table_is_missing_or_leads_out_of_the_input_folders_is_refused(
    inputs: Path, no_start: list[int], table: str, says: str
) -> None:
    (inputs / "link.csv").symlink_to(inputs.parent / "secret.csv")
    client, _ = client_for("otto", "operator")
    doc = joined_flights(reference=table)
    assert client.post("/api/pipelines/", doc, content_type="application/json").status_code == 201
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
