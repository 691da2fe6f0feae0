"""An operator's pipeline is data, not a program: what the security issue tried with the
operator role through the documented API, each refused with a located reason and
nothing changed."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Run
from tests.sparkjobs.test_expressions import HUGE_VALUES, LEAK_COLUMN, SUBQUERY
from tests.webapp.console.factories import client_for, make_run, reference
from webapp.console.models import Node, Pipeline
from webapp.console.topology_io import export_document

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def leaking_pipeline() -> dict[str, Any]:
    """The reference pipeline with a project node whose `key` column leaks secrets."""
    doc = copy.deepcopy(export_document(reference()))
    doc["name"] = "leak"
    for node in doc["nodes"]:
        if node["name"] == "task1":
            node["operator"] = "project"
            node["stage"] = "leak"
            node["params"] = {"columns": [LEAK_COLUMN, SUBQUERY, "value", "user"]}
    return doc


def test_a_pipeline_with_java_calls_or_subqueries_is_refused_and_not_saved() -> None:
    client, _ = client_for("otto", "operator")
    # When an operator posts the leaking pipeline
    response = client.post("/api/pipelines/", leaking_pipeline(), content_type="application/json")
    # Then it is a 400 naming each function and the subquery, where they are
    assert response.status_code == 400
    problems = response.json()["problems"]
    located = [p for p in problems if p["location"] == "nodes[1] (task1).params"]
    text = " ".join(p["message"] for p in located)
    assert "[0] at character 16: function 'reflect' is not allowed" in text
    assert "function 'java_method' is not allowed" in text
    assert "[1] at character 2: subqueries and table references are not allowed" in text
    # and nothing was saved
    assert not Pipeline.objects.filter(name="leak").exists()


def filtering_pipeline(name: str, condition: str, columns: list[str] | None = None) -> Any:
    """The reference pipeline with task1 a filter on ``condition`` (and task2 a project)."""
    doc = copy.deepcopy(export_document(reference()))
    doc["name"] = name
    doc["nodes"][1].update(operator="filter", stage="f", params={"condition": condition})
    if columns is not None:
        doc["nodes"][2].update(operator="project", stage="p", params={"columns": columns})
    return doc


@pytest.mark.parametrize(("text", "position", "why"), HUGE_VALUES)
def test_a_filter_that_builds_a_huge_value_is_refused_and_not_saved(
    text: str, position: int, why: str
) -> None:
    client, _ = client_for("otto", "operator")
    # When an operator posts a pipeline whose filter is one of the issue's expressions
    doc = filtering_pipeline("huge", text)
    response = client.post("/api/pipelines/", doc, content_type="application/json")
    # Then it is a 400 saying where the value grows past the budget, and nothing is saved
    assert response.status_code == 400
    messages = [p["message"] for p in response.json()["problems"]]
    assert any(
        m.startswith(f"parameter 'condition' at character {position}: {why}") for m in messages
    )
    assert not Pipeline.objects.filter(name="huge").exists()


def test_padding_and_repeating_within_the_budget_are_saved() -> None:
    client, _ = client_for("otto", "operator")
    doc = filtering_pipeline(
        "padded", "key LIKE '%-1%'", ["lpad(key, 12, '0') AS key", "repeat('-', 3) AS rule"]
    )
    response = client.post("/api/pipelines/", doc, content_type="application/json")
    assert response.status_code == 201, response.json()
    assert Pipeline.objects.filter(name="padded").exists()


def test_validation_of_a_hostile_condition_says_where_the_problem_is() -> None:
    client, _ = client_for("vera", "viewer")
    doc = copy.deepcopy(export_document(reference()))
    doc["nodes"][1].update(
        operator="filter",
        stage="f",
        params={"condition": "value > 0 AND reflect('java.lang.System', 'exit', 3) IS NULL"},
    )
    answer = client.post("/api/pipelines/validate/", doc, content_type="application/json").json()
    assert answer["valid"] is False
    assert {
        "location": "nodes[1] (task1).params",
        "message": "parameter 'condition' at character 15: function 'reflect' is not allowed: "
        "it calls Java methods",
    } in answer["problems"]


def test_a_stored_pipeline_with_a_refused_expression_does_not_start(no_start: list[int]) -> None:
    # Given a pipeline stored before expressions were checked (written straight to the table)
    pipeline = reference()
    Node.objects.filter(pipeline=pipeline, name="task1").update(
        operator="filter",
        stage="old",
        params={"condition": "reflect('java.lang.System', 'getenv') IS NOT NULL"},
    )
    client, _ = client_for("otto", "operator")
    before = Run.objects.count()
    # When an operator starts it
    response = client.post(
        "/api/runs/",
        {"pipeline": "reference", "generator": "seed=1,volume_mb=1"},
        content_type="application/json",
    )
    # Then it does not start, and the answer says why
    assert response.status_code == 400
    assert "cannot run as stored" in response.json()["detail"]
    assert (
        "node task1: parameter 'condition' at character 1: function 'reflect'"
        in response.json()["detail"]
    )
    assert Run.objects.count() == before and no_start == []


# -- inputs stay inside their roots ---------------------------------------------------------


@pytest.fixture
def input_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "inputs"
    (root / "day1").mkdir(parents=True)
    (root / "day1" / "part-0.jsonl").write_text('{"key": "k", "value": 1, "user": "u"}\n')
    settings.INPUT_ROOTS = [str(root)]
    settings.INPUT_FOLLOW_SYMLINKS = False
    return root


def start(client: Any, path: str) -> Any:
    body = {"pipeline": "reference", "input_path": path}
    return client.post("/api/runs/", body, content_type="application/json")


LINKED = ["{root}/etcdi[r]/passwd", "{root}/**/passwd", "{root}/etcdir/passwd", "{root}/*/passwd"]


@pytest.mark.parametrize("pattern", [*LINKED, "etcdir/passwd"])
def test_a_symlink_out_of_the_input_root_is_refused(
    input_root: Path, no_start: list[int], pattern: str
) -> None:
    # Given a link inside the input folder to /etc (as the issue's reflect call made one)
    (input_root / "etcdir").symlink_to("/etc")
    reference()
    client, _ = client_for("otto", "operator")
    # When a run names a file through it, by path or by glob
    response = start(client, pattern.format(root=input_root))
    # Then it is refused: the file lies outside the input folders; no run was created
    assert response.status_code == 400, response.json()
    assert "must lie under an input folder" in response.json()["detail"]
    assert Run.objects.count() == 0 and no_start == []


def test_a_link_that_stays_inside_is_refused_unless_links_are_allowed(
    input_root: Path, no_start: list[int], settings: Any
) -> None:
    (input_root / "latest").symlink_to(input_root / "day1")
    reference()
    client, _ = client_for("otto", "operator")
    refused = start(client, f"{input_root}/latest/part-0.jsonl")
    assert refused.status_code == 400
    assert "symbolic link" in refused.json()["detail"]
    # When an administrator allows links, one whose target stays inside is followed
    settings.INPUT_FOLLOW_SYMLINKS = True
    accepted = start(client, f"{input_root}/latest/part-0.jsonl")
    assert accepted.status_code == 201, accepted.json()
    run = Run.objects.get(pk=accepted.json()["id"])
    assert run.input_spec["paths"] == [str((input_root / "day1" / "part-0.jsonl").resolve())]


def test_a_file_whose_name_says_another_format_is_refused_saying_what_to_change(
    input_root: Path, no_start: list[int]
) -> None:
    # Given a Parquet file beside the JSON lines a jsonl pipeline reads
    (input_root / "day1" / "rows.parquet").write_bytes(b"PAR1" + bytes(64))
    reference()
    client, _ = client_for("otto", "operator")
    # When an operator starts a run over the folder's files
    response = start(client, "day1/*")
    # Then it is refused, naming the file and what to change, and nothing was created
    assert response.status_code == 400, response.json()
    assert (
        "rows.parquet: its name says Parquet, but the source reads JSON lines (format: jsonl); "
        "set the source's format to parquet" in response.json()["detail"]
    )
    assert Run.objects.count() == 0 and no_start == []


OUTSIDE = ["/etc/passwd", "../../../etc/passwd", "{root}/../../etc/passwd", "{root}/day1/../../x"]


@pytest.mark.parametrize("path", [*OUTSIDE, "\x00", "a" * 5000])
def test_paths_leaving_the_root_are_refused(
    input_root: Path, no_start: list[int], path: str
) -> None:
    reference()
    client, _ = client_for("otto", "operator")
    response = start(client, path.format(root=input_root))
    assert response.status_code == 400
    assert json.dumps(response.json())  # a JSON answer, not an error page
    assert Run.objects.count() == 0


@pytest.mark.parametrize("pattern", ["/etc/pass*", "/*/*/*/*/*/*/*/*", "{root}/etcdir/*"])
def test_a_glob_out_of_the_root_is_refused_naming_no_file_found_outside(
    input_root: Path, no_start: list[int], pattern: str
) -> None:
    (input_root / "etcdir").symlink_to("/etc")
    reference()
    client, _ = client_for("otto", "operator")
    # When an operator's glob would match the host's files (outside, or through a link)
    typed = pattern.format(root=input_root)
    started = time.monotonic()
    response = start(client, typed)
    # Then it is refused at once, and the answer lists none of them
    assert time.monotonic() - started < 1.0
    assert response.status_code == 400, response.json()
    detail = response.json()["detail"]
    assert "must lie under an input folder" in detail
    beyond_what_was_typed = detail.replace(typed, "")
    assert "passwd" not in beyond_what_was_typed, detail
    assert "/etc/" not in beyond_what_was_typed, detail
    assert Run.objects.count() == 0 and no_start == []


def test_a_glob_inside_the_root_is_resolved_to_its_files(
    input_root: Path, no_start: list[int]
) -> None:
    (input_root / "day1" / "part-1.jsonl").write_text('{"key": "k", "value": 2, "user": "u"}\n')
    reference()
    client, _ = client_for("otto", "operator")
    response = start(client, "day1/part-*.jsonl")
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert [Path(p).name for p in run.input_spec["paths"]] == ["part-0.jsonl", "part-1.jsonl"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/api/runs/", {"pipeline": "p" * 100_000, "generator": "seed=1,volume_mb=1"}, 404),
        ("/api/runs/{run}/migrate/", {"node": "n" * 100_000}, 400),
        ("/api/runs/{run}/adjust/", {"action": "a" * 100_000}, 400),
        ("/api/runs/{run}/adjust/", {"action": "add_instance", "stage": "s" * 100_000}, 400),
    ],
)
def test_an_oversized_name_is_refused_without_being_echoed_back(
    path: str, body: dict[str, str], status: int
) -> None:
    # Given an active run (a refused request must change nothing about it)
    run = make_run()
    client, _ = client_for("otto", "operator")
    # When an operator sends a name of 100,000 characters where a name belongs
    response = client.post(path.format(run=run.pk), body, content_type="application/json")
    # Then the answer refuses it in a few hundred bytes, not a copy of the input
    assert response.status_code == status
    assert len(response.content) < 1_000, response.content[:200]
    run.refresh_from_db()
    assert run.status == Run.Status.PENDING
