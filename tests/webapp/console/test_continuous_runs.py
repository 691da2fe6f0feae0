"""Continuous runs from the console: starting a landing-folder or a Redis-stream run
through the API and the pipeline page, refusals of bad or hostile input (400 naming the
field, no run created), stop as "finish what was taken in", and the source on the run
page (what it reads, exact up to where, the lag)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from orchestrator.models import Event, Run
from orchestrator.run.publisher import forget_snapshot, keep_snapshot
from tests.webapp.console.factories import client_for, make_run, reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def roots(settings: Any, tmp_path: Path) -> Path:
    """One input folder holding a landing folder; a folder outside it; a link to each."""
    root = tmp_path / "inputs"
    (root / "landing").mkdir(parents=True)
    (root / "archive").mkdir()
    (tmp_path / "outside").mkdir()
    (root / "to-outside").symlink_to(tmp_path / "outside")
    (root / "to-landing").symlink_to(root / "landing")
    settings.INPUT_ROOTS = [str(root)]
    return root


def start(client: Client, source: Any, **more: Any) -> Any:
    body = {"pipeline": "reference", "source": source, **more}
    return client.post("/api/runs/", body, content_type="application/json")


def test_an_operator_starts_a_landing_folder_run_through_the_api(
    no_start: list[int], roots: Path
) -> None:
    # Given an operator and a landing folder under the input folder
    reference()
    client, _ = client_for("otto", "operator")
    # When they start a run over it, archiving what is merged
    source = {
        "kind": "folder",
        "folder": "landing",
        "pattern": "day-*.jsonl",
        "stable_s": 2.5,
        "clean": "archive",
        "archive": str(roots / "archive"),
        "checkpoint": "day-1",
    }
    response = start(client, source)
    # Then the run is created (pending), handed to a worker, with the checked spec
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending"
    assert no_start == [body["id"]]
    expected = {
        "kind": "folder",
        "folder": str(roots / "landing"),
        "pattern": "day-*.jsonl",
        "format": "jsonl",
        "stable_s": 2.5,
        "clean": "archive",
        "archive": str(roots / "archive"),
        "checkpoint": "day-1",
    }
    assert Run.objects.get(pk=body["id"]).input_spec == expected
    assert body["source"] == {**expected, "unbounded": True}


def test_an_operator_starts_a_stream_run_and_no_url_or_password_is_shown(
    no_start: list[int], settings: Any
) -> None:
    # Given an operator, and another Redis the administrator listed (with a password)
    settings.BPCONSOLE_STREAM_URLS = ["redis://reader:s3cret@streams.example:6379/2"]
    reference()
    client, _ = client_for("otto", "operator")
    # When they start a run over a stream of the console's Redis, naming its URL
    source = {
        "kind": "stream",
        "stream": "orders-eu",
        "start": "latest",
        "linger_s": 0.1,
        "partitions": 4,
        "idle_s": 5,
        "url": settings.REDIS_URL,
    }
    response = start(client, source)
    # Then the run reads it as the console's own Redis: no address is stored
    assert response.status_code == 201, response.content
    body = response.json()
    spec = Run.objects.get(pk=body["id"]).input_spec
    assert spec["kind"] == "stream" and spec["stream"] == "orders-eu"
    assert spec["url"] == "" and spec["group"] == "" and spec["start"] == "latest"
    assert spec["linger_s"] == 0.1
    assert spec["partitions"] == 4 and spec["idle_s"] == 5.0
    assert body["source"]["kind"] == "stream" and body["source"]["unbounded"] is True
    # And a run over the listed Redis never shows its password. (That Redis does not
    # exist, and a run is only created over a Redis that answers: the row is made here.)
    listed = Run.objects.create(
        pipeline_name="reference",
        topology=Run.objects.get(pk=body["id"]).topology,
        policy={},
        input_spec={
            "kind": "stream",
            "stream": "orders",
            "group": "billing",
            "url": settings.BPCONSOLE_STREAM_URLS[0],
        },
    )
    shown = client.get(f"/api/runs/{listed.pk}/").json()["source"]
    assert shown["url"] == "redis://***@streams.example:6379/2"
    assert "s3cret" not in client.get("/api/runs/").content.decode()
    assert len(no_start) == 1


def test_a_stream_on_a_listed_redis_that_does_not_answer_is_refused(
    no_start: list[int], settings: Any
) -> None:
    settings.BPCONSOLE_STREAM_URLS = ["redis://reader:s3cret@127.0.0.1:9/2"]
    reference()
    client, _ = client_for("otto", "operator")
    source = {"kind": "stream", "stream": "orders", "url": settings.BPCONSOLE_STREAM_URLS[0]}
    response = start(client, source)
    assert response.status_code == 400
    assert "the stream's Redis does not answer" in response.json()["detail"]
    assert "s3cret" not in response.content.decode()
    assert not Run.objects.exists()


LONG = "x" * 2000


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ({"kind": "folder", "folder": "/etc"}, ["folder '/etc' must lie under"]),
        ({"kind": "folder", "folder": "landing/../../outside"}, ["must lie under"]),
        ({"kind": "folder", "folder": "to-outside"}, ["must lie under"]),
        ({"kind": "folder", "folder": "to-landing"}, ["symbolic link"]),
        ({"kind": "folder", "folder": "nowhere"}, ["folder 'nowhere' does not exist"]),
        (
            {"kind": "folder", "folder": "landing", "clean": "archive", "archive": "/var/a"},
            ["archive folder", "must lie under"],
        ),
        (
            {"kind": "folder", "folder": "landing", "clean": "archive", "archive": "landing/old"},
            ["archive folder must not be the landing folder or inside it"],
        ),
        (
            {"kind": "folder", "folder": "landing", "archive": "archive"},
            ["only with clean: archive"],
        ),
        ({"kind": "folder", "folder": "landing", "stable_s": -1}, ["stable_s", "not -1"]),
        ({"kind": "folder", "folder": "landing", "stable_s": 10000}, ["stable_s", "600"]),
        ({"kind": "folder", "folder": "landing", "stable_s": "soon"}, ["source.stable_s"]),
        ({"kind": "folder", "folder": "landing", "pattern": "a/*.jsonl"}, ["no '/'"]),
        ({"kind": "folder", "folder": "landing", "clean": "shred"}, ["source.clean"]),
        ({"kind": "folder", "folder": LONG}, ["source.folder", "no more than 1000"]),
        ({"kind": "folder"}, ["the folder is a path"]),
        ({"kind": "stream", "stream": "my stream"}, ["a stream name is"]),
        ({"kind": "stream", "stream": "_kombu.binding.spark"}, ["starting with a letter"]),
        ({"kind": "stream", "stream": "celery:spark"}, ["a stream name is", "no ':'"]),
        ({"kind": "stream", "stream": "s", "group": "bpconsole.run.1"}, ["run 1's own"]),
        ({"kind": "stream", "stream": "s" * 500}, ["source.stream", "no more than 200"]),
        ({"kind": "folder", "folder": "landing", "checkpoint": "a/b"}, ["checkpoint name"]),
        ({"kind": "folder", "folder": "landing", "checkpoint": LONG}, ["source.checkpoint"]),
        ({"kind": "stream", "stream": "s", "group": "a b"}, ["consumer group name"]),
        ({"kind": "stream", "stream": "s", "linger_s": 60}, ["linger_s must be from 0 to 10"]),
        ({"kind": "stream", "stream": "s", "linger_s": "x" * 40}, ["source.linger_s"]),
        (
            {"kind": "stream", "stream": "s", "partitions": 1000},
            ["partitions must be from 1 to 16"],
        ),
        ({"kind": "stream", "stream": "s", "partitions": "x" * 40}, ["source.partitions"]),
        ({"kind": "stream", "stream": "s", "idle_s": 1e9}, ["idle_s must be from 0 to 3600"]),
        (
            {"kind": "stream", "stream": "s", "url": "redis://attacker.example:6379/0"},
            ["not one the administrator allowed"],
        ),
        ({"kind": "stream", "stream": "s", "url": LONG}, ["source.url", "no more than 500"]),
        ({"kind": "stream", "stream": "s", "folder": "landing"}, ["no field 'folder'"]),
        ({"kind": "ftp", "folder": "landing"}, ["source.kind", "not a valid choice"]),
        ({"folder": "landing"}, ["source.kind", "required"]),
        ("folder", ["source", "dictionary"]),
    ],
)
def test_bad_or_hostile_sources_are_a_400_naming_the_field_and_create_nothing(
    no_start: list[int], roots: Path, source: Any, words: list[str]
) -> None:
    # Given an operator
    reference()
    client, _ = client_for("otto", "operator")
    # When the source escapes the input folder, does not exist, is out of range or bad
    response = start(client, source)
    # Then it is a 400 whose message names the field, and nothing was created
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    for word in words:
        assert word in detail, detail
    assert len(detail) < 1500  # an oversized value is not echoed back whole
    assert Run.objects.count() == 0
    assert no_start == []


def test_a_source_with_files_or_a_generator_too_is_refused(no_start: list[int]) -> None:
    reference()
    client, _ = client_for("otto", "operator")
    response = start(client, {"kind": "stream", "stream": "s"}, generator="seed=1")
    assert response.status_code == 400
    assert "exactly one" in response.json()["detail"]
    assert Run.objects.count() == 0


def test_a_viewer_starting_a_continuous_run_is_refused_and_recorded(
    no_start: list[int], roots: Path
) -> None:
    reference()
    client, vera = client_for("vera", "viewer")
    response = start(client, {"kind": "folder", "folder": "landing"})
    assert response.status_code == 403
    assert "operator role" in response.json()["detail"]
    assert Run.objects.count() == 0
    refusal = Event.objects.get(kind="action_refused")
    assert refusal.user == vera and refusal.run is None
    assert refusal.data == {"action": "start_run"}  # the body, naming the pipeline, is unread


def test_the_pipeline_page_starts_a_continuous_run_and_says_why_not(
    no_start: list[int], roots: Path
) -> None:
    # Given an operator on the pipeline's page, which offers both continuous inputs
    reference()
    operator, _ = client_for("otto", "operator")
    page = operator.get("/pipelines/reference/").content.decode()
    assert 'value="folder"' in page and 'value="stream"' in page
    assert 'name="source_url"' not in page  # no other Redis listed: no URL field
    # When they start a run over the landing folder from the form
    form = {
        "input": "folder",
        "source_folder": "landing",
        "source_pattern": "",
        "source_clean": "keep",
    }
    form |= {"source_stable_s": "1", "source_archive": "", "source_stream": "ignored"}
    response = operator.post("/pipelines/reference/start/", form)
    # Then they are on the new run's page
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.input_spec["kind"] == "folder" and run.input_spec["pattern"] == "*.jsonl"
    # When a stream name is bad, or the input kind unknown, they are told why
    for form, words in [
        ({"input": "stream", "source_stream": "no spaces please"}, "a stream name is"),
        ({"input": "ftp"}, "source.kind must be one of folder, stream, not &#x27;ftp&#x27;"),
    ]:
        response = operator.post("/pipelines/reference/start/", form)
        assert response.status_code == 302
        page = operator.get(response["Location"]).content.decode()
        assert "The run was not started" in page and words in page, page
    assert Run.objects.count() == 1
    assert "landing folder" in operator.get("/pipelines/reference/").content.decode()


def continuous_run(client: Client, status: str = "running") -> Run:
    """A landing-folder run started by ``client`` (an operator), then set to ``status``."""
    response = start(client, {"kind": "folder", "folder": "landing"})
    assert response.status_code == 201, response.content
    Run.objects.filter(pk=response.json()["id"]).update(status=status)
    return Run.objects.get(pk=response.json()["id"])


def test_stop_drains_a_continuous_run_and_cancels_a_bounded_one(
    no_start: list[int], roots: Path
) -> None:
    # Given a running continuous run and a running bounded one
    reference()
    client, _ = client_for("otto", "operator")
    continuous = continuous_run(client)
    bounded = make_run()
    Run.objects.filter(pk=bounded.pk).update(status="running")
    # When the operator stops each
    drained = client.post(f"/api/runs/{continuous.pk}/stop/")
    cancelled = client.post(f"/api/runs/{bounded.pk}/stop/")
    # Then the continuous run is stopping (it finishes what it took in), the bounded
    # one cancelled, as before
    assert drained.status_code == 200, drained.content
    assert drained.json()["run"]["status"] == "stopping"
    assert drained.json()["run"]["active"] is True
    assert cancelled.json()["run"]["status"] == "cancelled"
    assert Event.objects.filter(run=continuous, kind="run_stopping").exists()
    # A second stop is a conflict; cancel abandons the drain
    assert client.post(f"/api/runs/{continuous.pk}/stop/").status_code == 409
    abandoned = client.post(f"/api/runs/{continuous.pk}/cancel/")
    assert abandoned.json()["run"]["status"] == "cancelled"
    # A continuous run not started yet has taken nothing in: stop cancels it
    pending = continuous_run(client, status="pending")
    assert client.post(f"/api/runs/{pending.pk}/stop/").json()["run"]["status"] == "cancelled"


def test_a_viewer_stopping_a_continuous_run_is_refused_and_recorded(
    no_start: list[int], roots: Path
) -> None:
    reference()
    run = continuous_run(client_for("otto", "operator")[0])
    viewer, _ = client_for("vera", "viewer")
    for verb in ("stop", "cancel"):
        assert viewer.post(f"/api/runs/{run.pk}/{verb}/").status_code == 403
    assert Run.objects.get(pk=run.pk).status == "running"
    actions = Event.objects.filter(run=run, kind="action_refused").values_list("data", flat=True)
    assert sorted(a["action"] for a in actions) == ["cancel_run", "stop_run"]


def test_the_run_page_and_its_snapshot_show_the_source(no_start: list[int], roots: Path) -> None:
    # Given a running continuous run
    reference()
    run = continuous_run(client_for("otto", "operator")[0])
    viewer, _ = client_for("vera", "viewer")
    # When a viewer opens its page and its snapshot
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    snapshot = viewer.get(f"/api/runs/{run.pk}/snapshot/").json()
    # Then both say what it reads and how far its results are exact
    what = f"{roots / 'landing'}/*.jsonl"
    assert snapshot["source"] == {
        "kind": "folder",
        "unbounded": True,
        "what": what,
        "lag": None,
        "exact_up_to": "nothing merged yet",
    }
    assert f'<span id="run-source" title="{what}">{what}</span>' in page
    assert "exact up to nothing merged yet" in page
    assert "Stop: finish what was taken in" in page and 'id="btn-cancel"' in page
    assert '"unbounded": true' in page  # the page's config, for run.js
    # And the lag the run's driver measured reaches the snapshot viewers get
    kept = {
        **snapshot,
        "source": {**snapshot["source"], "lag": {"entries": 12, "bytes": 3_250_586, "age_s": 2.4}},
    }
    keep_snapshot(run.pk, kept)
    try:
        live = viewer.get(f"/api/runs/{run.pk}/snapshot/").json()
        assert live["source"]["lag"] == {"entries": 12, "bytes": 3_250_586, "age_s": 2.4}
    finally:
        forget_snapshot(run.pk)


def test_a_bounded_runs_page_keeps_its_plain_stop(no_start: list[int]) -> None:
    run = make_run()
    viewer, _ = client_for("vera", "viewer")
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    assert '<button type="button" id="btn-stop" class="danger">Stop</button>' in page
    assert 'id="btn-cancel"' not in page and 'id="run-exact"' not in page
    assert viewer.get(f"/api/runs/{run.pk}/").json()["source"] == {
        "kind": "generator",
        "unbounded": False,
    }
