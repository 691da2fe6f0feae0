"""The console's pages: roles, the editor (inline problems, nothing saved when invalid),
YAML import/export, starting runs, the run view and the activity page."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from orchestrator import service
from orchestrator.models import Event, Run
from tests.webapp.console.factories import client_for, make_run, reference
from webapp.console.models import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def editor_config(html: bytes) -> dict:
    match = re.search(rb'<script id="editor-config" type="application/json">(.*?)</script>', html)
    assert match, "the editor's configuration is in the page"
    return json.loads(match.group(1))


def test_every_page_needs_a_role() -> None:
    run = make_run()
    for url in ("/", "/pipelines/reference/", f"/runs/{run.pk}/", "/activity/"):
        assert Client().get(url).status_code == 302, url
    client, _ = client_for("nobody", None)
    for url in ("/", "/pipelines/reference/", f"/runs/{run.pk}/", "/activity/"):
        assert client.get(url).status_code == 403, url


def test_the_pipelines_page_shows_status_last_run_and_health_dot() -> None:
    run = make_run()
    client, _ = client_for("vera", "viewer")
    page = client.get("/").content.decode()
    assert 'data-pipeline="reference"' in page
    assert "dot-warn" in page  # a pending run
    assert f'href="/runs/{run.pk}/"' in page
    assert "status-pending" in page
    assert "New pipeline" not in page  # a viewer does not edit


def test_the_admin_link_is_for_admins_only() -> None:
    viewer, _ = client_for("vera", "viewer")
    assert b'href="/admin/"' not in viewer.get("/").content
    admin, _ = client_for("ada", "admin")
    assert b'href="/admin/"' in admin.get("/").content


def test_the_pipeline_page_offers_runs_to_operators_only() -> None:
    reference()
    viewer, _ = client_for("vera", "viewer")
    page = viewer.get("/pipelines/reference/").content.decode()
    assert 'id="pipeline-topology"' in page
    assert 'id="start-form"' not in page
    operator, _ = client_for("otto", "operator")
    page = operator.get("/pipelines/reference/").content.decode()
    assert 'id="start-form"' in page
    assert 'href="/pipelines/reference/edit/"' in page


def test_starting_a_run_from_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "start_run", lambda run: None)
    reference()
    operator, _ = client_for("otto", "operator")
    response = operator.post(
        "/pipelines/reference/start/", {"input": "generator", "generator": "seed=9,volume_mb=0.2"}
    )
    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/"
    bad = operator.post("/pipelines/reference/start/", {"input": "generator", "generator": "x"})
    assert bad.status_code == 302  # back to the pipeline, with the reason
    page = operator.get(bad["Location"]).content.decode()
    assert "The run was not started" in page
    viewer, vera = client_for("vera", "viewer")
    refused = viewer.post("/pipelines/reference/start/", {"generator": "seed=1"})
    assert refused.status_code == 403
    assert b"needs the operator role" in refused.content
    assert Event.objects.filter(kind="action_refused", user=vera).exists()
    assert Run.objects.count() == 1


def test_the_run_view_carries_its_live_configuration() -> None:
    run = make_run()
    viewer, _ = client_for("vera", "viewer")
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    config = json.loads(
        re.search(r'<script id="run-config" type="application/json">(.*?)</script>', page)[1]
    )
    assert config["ws_path"] == f"/ws/runs/{run.pk}/"
    assert config["can_operate"] is False
    assert config["topology"]["nodes"][0]["name"] == "source"
    assert 'class="buttons locked"' in page
    assert "csrftoken" in viewer.cookies
    assert viewer.get("/runs/999999/").status_code == 404


def test_the_editor_is_for_operators() -> None:
    reference()
    viewer, _ = client_for("vera", "viewer")
    assert viewer.get("/pipelines/reference/edit/").status_code == 403
    assert viewer.get("/pipelines/new/").status_code == 403
    operator, _ = client_for("otto", "operator")
    config = editor_config(operator.get("/pipelines/reference/edit/").content)
    assert config["document"]["name"] == "reference"
    assert "aggregate" in config["operators"]
    assert config["can_change_policy"] is False


def test_an_invalid_pipeline_comes_back_with_located_problems_and_nothing_is_saved() -> None:
    pipeline = reference()
    operator, _ = client_for("otto", "operator")
    doc = editor_config(operator.get("/pipelines/reference/edit/").content)["document"]
    doc["nodes"][2]["buffer_mb"] = 0
    doc["nodes"][1]["params"]["aggregates"] = ["median"]
    doc["edges"].append({"from": "output", "to": "task1"})
    response = operator.post("/pipelines/reference/edit/", {"document": json.dumps(doc)})
    assert response.status_code == 400
    problems = {p["location"]: p["message"] for p in editor_config(response.content)["problems"]}
    assert "nodes[2] (task2).buffer_mb" in problems
    assert "unknown aggregate(s) median" in problems["nodes[1] (task1).params"]
    assert any(loc.startswith("edges") for loc in problems)
    assert pipeline.nodes.get(name="task2").buffer_mb == 64
    assert pipeline.edges.count() == 6


def test_a_valid_new_pipeline_is_saved_from_the_editor() -> None:
    operator, _ = client_for("otto", "operator")
    doc = {
        "name": "tiny",
        "nodes": [
            {"name": "in", "kind": "source", "operator": "read", "params": {}},
            {
                "name": "keep",
                "kind": "operator",
                "operator": "filter",
                "params": {"condition": "value > 0"},
                "buffer_mb": 8,
            },
            {"name": "out", "kind": "sink", "operator": "merge"},
        ],
        "edges": [
            {"from": "in", "to": "keep", "bandwidth_mbps": 10},
            {"from": "keep", "to": "out"},
        ],
    }
    response = operator.post("/pipelines/new/", {"document": json.dumps(doc)})
    assert response.status_code == 302
    assert response["Location"] == "/pipelines/tiny/"
    saved = Pipeline.objects.get(name="tiny")
    assert saved.nodes.get(name="keep").params == {"condition": "value > 0"}
    assert saved.edges.get(source__name="in").bandwidth_mbps == 10


def test_yaml_import_with_problems_opens_the_editor_and_saves_nothing() -> None:
    operator, _ = client_for("otto", "operator")
    text = (
        "name: broken\nnodes:\n  - {name: a, kind: source}\n  - {name: b, kind: sink}\n"
        "edges:\n  - {from: a, to: ghost}\n"
    )
    response = operator.post("/pipelines/import/", {"yaml": text})
    assert response.status_code == 400
    config = editor_config(response.content)
    assert config["document"]["name"] == "broken"
    assert {"location": "edges[0].to", "message": "unknown node 'ghost'"} in config["problems"]
    assert not Pipeline.objects.filter(name="broken").exists()
    fixed = text.replace("ghost", "b")
    assert operator.post("/pipelines/import/", {"yaml": fixed}).status_code == 302
    assert Pipeline.objects.filter(name="broken").exists()


def test_export_gives_the_topology_file() -> None:
    reference()
    viewer, _ = client_for("vera", "viewer")
    response = viewer.get("/pipelines/reference/export.yaml")
    assert response["Content-Type"] == "application/yaml"
    assert response.content.decode().startswith("name: reference")


def test_the_activity_page_shows_refused_attempts() -> None:
    run = make_run()
    viewer, _ = client_for("vera", "viewer")
    viewer.post(f"/api/runs/{run.pk}/stop/")
    page = viewer.get("/activity/").content.decode()
    assert "action_refused" in page
    assert "vera (viewer) tried to stop run" in page


def test_console_admins_edit_policies_in_the_django_admin_without_the_staff_flag() -> None:
    from webapp.console.models import Policy

    admin, ada = client_for("ada", "admin")
    assert not ada.is_staff
    policy = Policy.default()
    page = admin.get(f"/admin/console/policy/{policy.pk}/change/")
    assert page.status_code == 200
    data = {**policy.values(), "name": policy.name, "description": "", "is_default": "on"}
    data["high_water"] = "0.8"
    saved = admin.post(f"/admin/console/policy/{policy.pk}/change/", data)
    assert saved.status_code == 302
    policy.refresh_from_db()
    assert policy.high_water == 0.8
    assert admin.get(f"/admin/console/pipeline/{reference().pk}/change/").status_code == 200
    # an operator is sent to the admin's login page, and cannot see a policy
    operator, _ = client_for("otto", "operator")
    assert operator.get("/admin/").status_code == 302
    assert operator.get(f"/admin/console/policy/{policy.pk}/change/").status_code == 302
