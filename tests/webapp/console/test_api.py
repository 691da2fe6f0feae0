"""The JSON API: roles on every call, refusals recorded, unknown nodes refused, schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.models import Event, Run
from orchestrator.zk.control_plane import ControlPlane
from tests.webapp.console.factories import client_for, make_run, reference
from webapp.console.models import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_anonymous_and_role_less_users_get_nothing() -> None:
    assert Client().get("/api/pipelines/").status_code in {401, 403}
    assert Client().get("/api/schema/").status_code in {401, 403}
    client, _ = client_for("nobody", None)
    assert client.get("/api/pipelines/").status_code == 403
    assert client.get("/api/runs/").status_code == 403
    assert client.get("/api/events/").status_code == 403


def test_a_viewer_lists_pipelines_with_last_run_and_health() -> None:
    pipeline = reference()
    client, _ = client_for("vera", "viewer")
    assert client.get("/api/pipelines/").json()[0]["health"] == "idle"
    run = make_run(pipeline)
    Run.objects.filter(pk=run.pk).update(status="failed")
    rows = client.get("/api/pipelines/").json()
    assert rows[0]["name"] == "reference"
    assert rows[0]["last_run"]["id"] == run.pk
    assert rows[0]["health"] == "bad"
    detail = client.get("/api/pipelines/reference/").json()
    assert [n["name"] for n in detail["document"]["nodes"]][:2] == ["source", "task1"]
    assert client.get("/api/pipelines/ghost/").status_code == 404


def test_a_viewer_pressing_pause_is_refused_recorded_and_nothing_changes() -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, vera = client_for("vera", "viewer")
    # When a viewer tries an operator's action
    response = client.post(f"/api/runs/{run.pk}/pause/")
    # Then it is refused with 403, the run is unchanged, and the attempt is an event
    assert response.status_code == 403
    assert "operator role" in response.json()["detail"]
    run.refresh_from_db()
    assert run.status == "running"
    refusal = Event.objects.get(run=run, kind="action_refused")
    assert refusal.user == vera
    assert "vera (viewer) tried to pause run" in refusal.reason
    # visible to everyone who reads the run's events and the activity feed
    events = client.get(f"/api/runs/{run.pk}/events/").json()
    assert events[0]["kind"] == "action_refused" and events[0]["actor"] == "vera"
    activity = client.get("/api/events/?actor=user").json()
    assert any(e["id"] == refusal.pk for e in activity)


def test_a_viewer_asking_for_a_migration_is_refused_and_recorded() -> None:
    run = make_run()
    client, _ = client_for("vera", "viewer")
    response = client.post(
        f"/api/runs/{run.pk}/migrate/", {"node": "task1"}, content_type="application/json"
    )
    assert response.status_code == 403
    # recorded on the run with the action its URL names (the body is never read)
    refusal = Event.objects.get(run=run, kind="action_refused")
    assert refusal.node == ""
    assert refusal.data == {"action": "migrate"}


def test_an_operator_pauses_resumes_and_stops_a_run() -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, _ = client_for("otto", "operator")
    assert client.post(f"/api/runs/{run.pk}/pause/").json()["run"]["status"] == "paused"
    assert client.post(f"/api/runs/{run.pk}/resume/").json()["run"]["status"] == "running"
    stopped = client.post(f"/api/runs/{run.pk}/stop/")
    assert stopped.status_code == 200
    assert stopped.json()["run"]["status"] == "cancelled"
    # A stopped run cannot be resumed: 409 with the reason
    again = client.post(f"/api/runs/{run.pk}/resume/")
    assert again.status_code == 409
    assert "cancelled" in again.json()["detail"]
    kinds = list(
        Event.objects.filter(run=run, user__username="otto").values_list("kind", flat=True)
    )
    assert sorted(kinds) == ["run_paused", "run_resumed", "run_stopped"]
    assert client.post("/api/runs/999999/pause/").status_code == 404


def test_an_unknown_node_is_a_400_naming_the_nodes_and_nothing_changes() -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, _ = client_for("otto", "operator")
    before = Event.objects.filter(run=run).count()
    for path in ("migrate", "stop-migrating"):
        response = client.post(
            f"/api/runs/{run.pk}/{path}/", {"node": "ghost"}, content_type="application/json"
        )
        assert response.status_code == 400
        detail = response.json()["detail"]
        assert "no node 'ghost'" in detail
        assert "source, task1, task2, task3, output" in detail
    missing = client.post(f"/api/runs/{run.pk}/migrate/", {}, content_type="application/json")
    assert missing.status_code == 400
    assert missing.json()["detail"] == (
        "the request names no 'node': one of source, task1, task2, task3, output"
    )
    assert Event.objects.filter(run=run).count() == before


def test_an_operator_asks_for_a_migration_and_it_is_recorded_with_the_name() -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, _ = client_for("otto", "operator")
    response = client.post(
        f"/api/runs/{run.pk}/migrate/", {"node": "task1"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    event = Event.objects.get(run=run, kind="operator_migrate")
    assert event.user.username == "otto"
    assert event.node == "task1"
    # On a finished run there is nothing to migrate: 409, nothing recorded
    Run.objects.filter(pk=run.pk).update(status="completed")
    late = client.post(
        f"/api/runs/{run.pk}/stop-migrating/", {"node": "task1"}, content_type="application/json"
    )
    assert late.status_code == 409


def test_an_operator_starts_a_run_and_bad_inputs_are_refused(no_start: list[int]) -> None:
    reference()
    client, _ = client_for("otto", "operator")
    response = client.post(
        "/api/runs/",
        {"pipeline": "reference", "generator": "seed=5,volume_mb=0.2"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending"
    assert body["created_by"] == "otto"
    assert body["input"]["generator"]["seed"] == 5
    assert no_start == [body["id"]]
    for payload, words in [
        ({"pipeline": "reference", "generator": "seed=x"}, "not a number"),
        ({"pipeline": "reference"}, "exactly one"),
        ({"pipeline": "reference", "input_path": "/etc/passwd"}, "must lie under"),
        ({"pipeline": "reference", "generator": "seed=1", "policy": "nope"}, "unknown policy"),
    ]:
        refused = client.post("/api/runs/", payload, content_type="application/json")
        assert refused.status_code == 400, payload
        assert words in refused.json()["detail"]
    ghost = {"pipeline": "ghost", "generator": "seed=1"}
    assert client.post("/api/runs/", ghost, content_type="application/json").status_code == 404
    assert Run.objects.count() == 1


def test_a_viewer_cannot_start_a_run(no_start: list[int]) -> None:
    reference()
    client, vera = client_for("vera", "viewer")
    response = client.post(
        "/api/runs/",
        {"pipeline": "reference", "generator": "seed=1"},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert Run.objects.count() == 0
    refusal = Event.objects.get(kind="action_refused")
    assert refusal.user == vera and refusal.run is None
    assert refusal.data == {"action": "start_run"}  # the body, naming the pipeline, is unread


def test_pipelines_are_saved_only_when_valid(no_start: list[int]) -> None:
    pipeline = reference()
    client, _ = client_for("otto", "operator")
    doc = client.get("/api/pipelines/reference/").json()["document"]
    doc["nodes"][1]["buffer_mb"] = -1
    doc["edges"].append({"from": "task1", "to": "ghost"})
    response = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert response.status_code == 400
    locations = {p["location"] for p in response.json()["problems"]}
    assert {"nodes[1] (task1).buffer_mb", "edges[6].to"} <= locations
    assert pipeline.nodes.get(name="task1").buffer_mb == 64
    check = client.post("/api/pipelines/validate/", doc, content_type="application/json").json()
    assert check["valid"] is False
    doc["nodes"][1]["buffer_mb"] = 32
    doc["edges"].pop()
    saved = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert saved.status_code == 200, saved.content
    assert pipeline.nodes.get(name="task1").buffer_mb == 32
    # A document naming another pipeline does not overwrite it by accident
    doc["name"] = "other"
    renamed = client.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert renamed.status_code == 400
    assert not Pipeline.objects.filter(name="other").exists()


def test_only_admins_change_a_pipelines_policy() -> None:
    reference()
    operator, _ = client_for("otto", "operator")
    doc = operator.get("/api/pipelines/reference/").json()["document"]
    doc["policy_overrides"] = {"high_water": 0.8}
    refused = operator.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert refused.status_code == 403
    assert Event.objects.filter(kind="action_refused", user__username="otto").exists()
    admin, _ = client_for("ada", "admin")
    allowed = admin.put("/api/pipelines/reference/", doc, content_type="application/json")
    assert allowed.status_code == 200, allowed.content
    assert Pipeline.objects.get(name="reference").policy_overrides == {"high_water": 0.8}


def test_yaml_export_and_import_round_trip() -> None:
    reference()
    client, _ = client_for("otto", "operator")
    text = client.get("/api/pipelines/reference/yaml/").content.decode()
    assert text.startswith("name: reference")
    copy = text.replace("name: reference", "name: reference-copy", 1)
    created = client.post("/api/pipelines/import/", {"yaml": copy}, content_type="application/json")
    assert created.status_code == 201
    broken = client.post(
        "/api/pipelines/import/", {"yaml": "name: x\nnodes: [\n"}, content_type="application/json"
    )
    assert broken.status_code == 400
    assert "not valid YAML" in broken.json()["problems"][0]["message"]


def test_the_openapi_schema_lists_every_endpoint() -> None:
    client, _ = client_for("vera", "viewer")
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    paths = set(schema["paths"])
    for path in (
        "/api/pipelines/",
        "/api/pipelines/{name}/",
        "/api/pipelines/validate/",
        "/api/runs/",
        "/api/runs/{run_id}/",
        "/api/runs/{run_id}/snapshot/",
        "/api/runs/{run_id}/results/",
        "/api/runs/{run_id}/events/",
        "/api/runs/{run_id}/pause/",
        "/api/runs/{run_id}/resume/",
        "/api/runs/{run_id}/stop/",
        "/api/runs/{run_id}/cancel/",
        "/api/runs/{run_id}/migrate/",
        "/api/runs/{run_id}/stop-migrating/",
        "/api/runs/{run_id}/adjust/",
        "/api/events/",
        "/api/workers/",
    ):
        assert path in paths, path


def test_a_snapshot_and_the_completion_curve_of_a_run() -> None:
    run = make_run()
    client, _ = client_for("vera", "viewer")
    snap = client.get(f"/api/runs/{run.pk}/snapshot/").json()
    assert snap["type"] == "snapshot"
    assert snap["run"]["id"] == run.pk
    assert [n["name"] for n in snap["nodes"]] == ["source", "task1", "task2", "task3", "output"]
    assert len(snap["links"]) == 6
    assert client.get(f"/api/runs/{run.pk}/completion/").json() == {"run": run.pk, "points": []}
    assert client.get("/api/runs/424242/snapshot/").status_code == 404


def test_the_result_so_far_is_stamped_with_where_it_is_exact_up_to() -> None:
    from orchestrator.ledger.groups import digest
    from orchestrator.models import MergedChunk, ResultGroup

    run = make_run()
    run.input_spec = {**run.input_spec, "paths": ["/data/in.jsonl"]}
    run.source_position = {"chunk": 2, "file": 0, "offset": 200}
    run.save()
    for chunk in range(2):
        MergedChunk.objects.create(
            run=run,
            chunk=chunk,
            origin_file=0,
            origin_offset=100 * chunk,
            origin_length=100,
            segment=f"s{chunk}",
            sink="output",
        )
    for key, count in (("a", 3), ("b", 7), ("c", 5)):
        states = {
            "count": count,
            "sum": str(count),
            "min": "1",
            "max": "1",
            "avg": {"sum": str(count), "count": count},
            "distinct_users": ["u1"] if key == "b" else [],
        }
        ResultGroup.objects.create(
            run=run, digest=digest([key]), group=[key], states=states, records=count
        )
    client, _ = client_for("vera", "viewer")
    body = client.get(f"/api/runs/{run.pk}/results/?limit=2").json()
    assert body["exact_up_to"] == "in.jsonl byte 200"
    assert body["keys"] == 3 and not body["final"]
    assert [(r["key"], r["count"], r["distinct_users"]) for r in body["rows"]] == [
        ("b", 7, 1),
        ("c", 5, 0),
    ]
    for bad in ("0", "1001", "ten", "-1", "\u00b2", "9" * 5000):
        answer = client.get(f"/api/runs/{run.pk}/results/?limit={bad}")
        assert answer.status_code == 400, bad
        assert "limit must be a whole number from 1 to 1000" in answer.json()["detail"]
    assert client.get("/api/runs/424242/results/").status_code == 404
    assert Client().get(f"/api/runs/{run.pk}/results/").status_code in (401, 403)


def test_the_whole_result_downloads_as_csv_its_columns_by_name_no_cell_a_formula() -> None:
    import csv
    import io

    from orchestrator.ledger.groups import digest
    from orchestrator.models import ResultGroup
    from tests.orchestrator.run.scenarios import FLIGHT_MEASURES, joined_flights

    # Given a run of the flights query whose groups hold text a spreadsheet would run
    run = make_run()
    Run.objects.filter(pk=run.pk).update(topology=joined_flights(grouped=True))
    states = {
        "flights": 2,
        "delayed": 1,
        "mean_delay": {"sum": "-7.5", "count": 1},
        "total_delay": "-7.5",
        "least_delay": "-7.5",
        "most_delay": "-7.5",
        "tails": ["N1"],
    }
    groups = [
        ('=HYPERLINK("http://evil")', "JFK"),
        ('United, "the" airline\nInc.', None),
        ("-5", "@LGA"),
        ("-cmd|' /C calc'!A0", "+1.5e3"),
    ]
    for group in groups:
        ResultGroup.objects.create(
            run=run, digest=digest(group), group=list(group), states=states, records=2
        )
    # When a viewer downloads it
    client, _ = client_for("vera", "viewer")
    answer = client.get(f"/api/runs/{run.pk}/results.csv")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert f"run-{run.pk}-results.csv" in answer["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(answer.streaming_content).decode())))
    # Then its header is the query's columns, and every group is a row of its values
    assert rows[0] == ["name", "origin", *(m["name"] for m in FLIGHT_MEASURES["measures"])]
    assert sorted(r[:2] for r in rows[1:]) == sorted(
        [
            ['\'=HYPERLINK("http://evil")', "JFK"],
            ['United, "the" airline\nInc.', ""],
            ["-5", "'@LGA"],  # a number's text stays as it is
            ["'-cmd|' /C calc'!A0", "+1.5e3"],
        ]
    )
    assert all(r[2:5] == ["2", "1", "-7.5"] for r in rows[1:])
    assert client.get("/api/runs/424242/results.csv").status_code == 404
    assert Client().get(f"/api/runs/{run.pk}/results.csv").status_code in (401, 403)


# -- hot migration and rescale ----------------------------------------------------------

SPARE_WORKER = "spark7-apitest"


@pytest.fixture
def spare_worker() -> Iterator[str]:
    """A live Spark worker as the orchestrator sees one: an ephemeral znode in ZooKeeper
    (no Celery worker runs in these tests); it goes when the fixture's session closes."""
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        info = {"host": "apitest-host", "pid": 4242, "name": "spark7@apitest", "queues": ["spark"]}
        control.register_worker(SPARE_WORKER, info)
        yield SPARE_WORKER


def _adjust(client: Client, run_id: int, **body: Any) -> Any:
    return client.post(f"/api/runs/{run_id}/adjust/", body, content_type="application/json")


def test_a_viewer_lists_live_workers_but_an_adjustment_is_refused_and_recorded(
    spare_worker: str,
) -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, vera = client_for("vera", "viewer")
    workers = client.get("/api/workers/")
    assert workers.status_code == 200
    assert {"name": spare_worker, "host": "apitest-host", "pid": 4242} in workers.json()
    # When the viewer asks to hot-migrate task2
    response = _adjust(client, run.pk, action="hot_migrate", node="task2", worker=spare_worker)
    # Then it is refused (403) and recorded, and nothing was asked of the run
    assert response.status_code == 403
    assert "operator role" in response.json()["detail"]
    refusal = Event.objects.get(run=run, kind="action_refused")
    assert refusal.user == vera and refusal.node == ""
    assert refusal.data == {"action": "adjust"}  # what the unread body asked is not known
    assert not Event.objects.filter(run=run, kind__startswith="operator_").exists()
    assert Client().get("/api/workers/").status_code in {401, 403}


def test_an_unknown_adjustment_node_stage_or_worker_is_a_400_changing_nothing() -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, _ = client_for("otto", "operator")
    before = Event.objects.filter(run=run).count()
    for body, words in [
        ({"action": "explode", "node": "task2"}, "unknown action 'explode'"),
        ({"node": "task2"}, "unknown action None"),
        ({"action": "hot_migrate"}, "hot_migrate needs 'node'"),
        ({"action": "add_instance", "node": "task2"}, "add_instance needs 'stage'"),
        ({"action": "hot_migrate", "node": "ghost"}, "no operator instance 'ghost'"),
        ({"action": "remove_instance", "node": "source"}, "instances: task1, task2, task3"),
        ({"action": "add_instance", "stage": "ghost"}, "no operator stage 'ghost'"),
        (
            {"action": "hot_migrate", "node": "task2", "worker": "spark9-gone"},
            "'spark9-gone' is not a live Spark worker",
        ),
        ({"action": "hot_migrate", "node": ["task2"]}, "node must be a string"),
    ]:
        response = _adjust(client, run.pk, **body)
        assert response.status_code == 400, body
        assert words in response.json()["detail"], response.json()
    assert Event.objects.filter(run=run).count() == before
    assert _adjust(client, 999999, action="add_instance", stage="agg").status_code == 404


def test_an_operator_hot_migrates_adds_and_removes_instances_recorded_with_the_name(
    spare_worker: str,
) -> None:
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status="running")
    client, otto = client_for("otto", "operator")
    for body, asked in [
        (
            {"action": "hot_migrate", "node": "task2", "worker": spare_worker},
            f"hot-migrate task2 to {spare_worker}",
        ),
        ({"action": "add_instance", "stage": "agg"}, "add an instance to stage agg on any worker"),
        ({"action": "remove_instance", "node": "task3"}, "remove instance task3"),
    ]:
        response = _adjust(client, run.pk, **body)
        assert response.status_code == 200, response.content
        assert asked in response.json()["detail"]
    events = Event.objects.filter(run=run, kind__startswith="operator_").order_by("id")
    assert [(e.kind, e.node, e.user) for e in events] == [
        ("operator_hot_migrate", "task2", otto),
        ("operator_add_instance", "agg", otto),
        ("operator_remove_instance", "task3", otto),
    ]
    assert events[0].data["worker"] == spare_worker
    # ...and each is queued for the run's driver
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        commands = control.take_commands(str(run.pk))
    assert [(c["command"], c["user"]) for c in commands] == [
        ("hot_migrate", "otto"),
        ("add_instance", "otto"),
        ("remove_instance", "otto"),
    ]
    # On a finished run there is nothing to adjust: 409, nothing recorded
    Run.objects.filter(pk=run.pk).update(status="completed")
    late = _adjust(client, run.pk, action="remove_instance", node="task1")
    assert late.status_code == 409
    assert "completed" in late.json()["detail"]
    assert events.count() == 3
