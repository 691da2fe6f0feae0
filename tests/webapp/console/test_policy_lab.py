"""The policy lab through the console: who may start one, what a bad workload gets, and
a live run started from a lab's prediction (pages and JSON API; real PostgreSQL, no
worker: labs are simulated here by calling the task's function)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from balancer.sim.control import BENCHMARK_POLICIES
from orchestrator import service
from orchestrator.lab.simulation import simulate
from orchestrator.models import Event, PolicyLab, Run
from tests.orchestrator.runs import finished_run
from tests.webapp.console.factories import client_for, reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

LABS = "/api/pipelines/reference/labs/"


@pytest.fixture
def no_lab_worker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Labs are created for real but not handed to a worker."""
    handed: list[int] = []
    monkeypatch.setattr(service, "start_lab", lambda lab: handed.append(lab.pk))
    return handed


def post(client: Any, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def done_lab(client: Any) -> int:
    lab_id = post(client, LABS, {"generator": "seed=2,volume_mb=16"}).json()["id"]
    assert simulate(lab_id) == "done"
    return int(lab_id)


def test_an_operator_starts_a_lab_and_a_viewer_reads_it(no_lab_worker: list[int]) -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    viewer, _ = client_for("vera", "viewer")

    created = post(operator, LABS, {"generator": "seed=2,volume_mb=16"})

    assert created.status_code == 201, created.json()
    lab = created.json()
    assert lab["status"] == "pending" and lab["result"] is None
    assert no_lab_worker == [lab["id"]]
    simulate(lab["id"])
    shown = viewer.get(f"/api/labs/{lab['id']}/").json()
    assert shown["status"] == "done"
    assert [a["name"] for a in shown["result"]["arms"]] == ["pipeline", *BENCHMARK_POLICIES]
    assert viewer.get(LABS).json()[0]["id"] == lab["id"]


def test_a_viewer_cannot_start_a_lab_and_the_attempt_is_recorded(no_lab_worker: list[int]) -> None:
    reference()
    viewer, _ = client_for("vera", "viewer")

    refused = post(viewer, LABS, {"generator": "seed=2"})

    assert refused.status_code == 403
    assert "operator role" in refused.json()["detail"]
    assert not PolicyLab.objects.exists() and no_lab_worker == []
    assert Event.objects.filter(kind="action_refused", data__action="run_policy_lab").exists()


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"generator": "seed=1,volume_mb=100000000"}, 400, "volume_mb"),
        ({"generator": "seed=1;rm -rf /"}, 400, "is not a number"),
        ({"generator": "x" * 600}, 400, "generator"),
        ({"run": "abc"}, 400, "run"),
        ({"run": 0}, 400, "run"),
        ({"run": 10**30}, 400, "run"),
        ({"run": 99}, 400, "this pipeline has no run 99"),
        ({}, 400, "exactly one workload"),
        ([1, 2], 400, "invalid request"),
    ],
)
def test_a_workload_that_cannot_be_simulated_is_a_clear_400_and_creates_nothing(
    no_lab_worker: list[int], body: Any, status: int, detail: str
) -> None:
    reference()
    operator, _ = client_for("otto", "operator")

    response = post(operator, LABS, body)

    assert response.status_code == status
    assert detail in json.dumps(response.json())
    assert not PolicyLab.objects.exists() and no_lab_worker == []


def test_unknown_pipelines_and_labs_are_json_404s(no_lab_worker: list[int]) -> None:
    operator, _ = client_for("otto", "operator")

    assert post(operator, "/api/pipelines/nope/labs/", {"generator": "seed=1"}).status_code == 404
    assert operator.get("/api/labs/12345/").status_code == 404
    assert post(operator, "/api/labs/12345/runs/", {"policy": "ours"}).status_code == 404
    assert operator.get("/labs/12345/").status_code == 404


def test_a_live_run_starts_from_a_lab_with_the_policy_it_was_simulated_with(
    no_lab_worker: list[int], no_start: list[int]
) -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    lab_id = done_lab(operator)

    started = post(operator, f"/api/labs/{lab_id}/runs/", {"policy": "ours"})

    assert started.status_code == 201, started.json()
    run = Run.objects.get(pk=started.json()["id"])
    assert no_start == [run.pk]
    assert run.lab_id == lab_id and run.lab_arm == "ours"
    assert run.policy == BENCHMARK_POLICIES["ours"].policy().to_dict()
    assert run.input_spec["generator"]["seed"] == 2
    # The run page draws its curve over the lab's prediction for that policy.
    page = operator.get(f"/runs/{run.pk}/")
    config = json.loads(
        page.content.split(b'id="run-config" type="application/json">')[1].split(b"</script>")[0]
    )
    predicted = next(a for a in PolicyLab.objects.get().result["arms"] if a["name"] == "ours")
    assert config["prediction"]["curve"] == predicted["curve"]
    assert b'id="chart-prediction"' in page.content
    assert operator.get(f"/api/labs/{lab_id}/").json()["runs"] == [
        {"run": run.pk, "arm": "ours", "status": "pending"}
    ]


def test_a_run_cannot_start_from_an_unfinished_lab_or_with_a_policy_it_does_not_have(
    no_lab_worker: list[int], no_start: list[int]
) -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    viewer, _ = client_for("vera", "viewer")
    pending = post(operator, LABS, {"generator": "seed=2,volume_mb=16"}).json()["id"]
    lab_id = done_lab(operator)

    unfinished = post(operator, f"/api/labs/{pending}/runs/", {"policy": "ours"})
    unknown = post(operator, f"/api/labs/{lab_id}/runs/", {"policy": "<script>"})
    too_long = post(operator, f"/api/labs/{lab_id}/runs/", {"policy": "o" * 41})
    refused = post(viewer, f"/api/labs/{lab_id}/runs/", {"policy": "ours"})

    assert unfinished.status_code == 409 and "pending" in unfinished.json()["detail"]
    assert unknown.status_code == 400 and "it has pipeline, stop_resume" in unknown.json()["detail"]
    assert too_long.status_code == 400
    assert refused.status_code == 403
    assert not Run.objects.exists() and no_start == []


def test_a_recorded_run_s_files_are_checked_against_the_input_folders_again(
    no_lab_worker: list[int], no_start: list[int]
) -> None:
    # A run's files were inside the input folders when it ran; a lab replaying it must
    # not start a run over a file that is not (the folders changed, or the row did).
    pipeline = reference()
    run = finished_run(
        pipeline_id=pipeline.pk, input_spec={"format": "jsonl", "paths": ["/etc/passwd"]}
    )
    operator, _ = client_for("otto", "operator")
    lab = post(operator, LABS, {"run": run.pk}).json()
    assert simulate(lab["id"]) == "done"

    started = post(operator, f"/api/labs/{lab['id']}/runs/", {"policy": "ours"})

    assert started.status_code == 400
    assert "input folder" in started.json()["detail"]
    assert Run.objects.count() == 1 and no_start == []


def test_the_pipeline_page_offers_the_lab_to_operators_and_lists_labs_to_everyone(
    no_lab_worker: list[int],
) -> None:
    pipeline = reference()
    run = finished_run(pipeline_id=pipeline.pk, input_spec={"generator": {"seed": 1}})
    operator, _ = client_for("otto", "operator")
    viewer, _ = client_for("vera", "viewer")

    form = operator.get("/pipelines/reference/")
    created = operator.post(
        "/pipelines/reference/lab/", {"workload": "run", "lab_run": str(run.pk)}
    )
    hostile = operator.post("/pipelines/reference/lab/", {"workload": "run", "lab_run": "1 OR 1"})
    # "²" is a digit to isdigit(), not to int()
    superscript = operator.post(
        "/pipelines/reference/lab/", {"workload": "run", "lab_run": "\u00b2"}
    )
    shown = viewer.get("/pipelines/reference/")
    page = viewer.get(created["Location"])

    assert b'id="lab-form"' in form.content and f'value="{run.pk}"'.encode() in form.content
    lab = PolicyLab.objects.get()
    assert created.status_code == 302 and created["Location"] == f"/labs/{lab.pk}/"
    assert hostile.status_code == 302 and PolicyLab.objects.count() == 1
    assert superscript.status_code == 302
    assert b'id="lab-form"' not in shown.content and f"lab {lab.pk}".encode() in shown.content
    assert page.status_code == 200 and b'id="lab-view"' in page.content
    assert b'id="lab-start-form"' not in page.content  # a viewer cannot start runs
    assert viewer.post(f"/labs/{lab.pk}/start/", {"policy": "ours"}).status_code == 403
