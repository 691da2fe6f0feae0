"""One operator's run cannot reach the platform's own state or another operator's data,
tried through the API as an operator: a stream named as the broker's queue, the data
folder as an input, another run's consumer group or landing folder, another pipeline's
sink table or folder, and more runs or labs than an operator's quota."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client

from orchestrator import service
from orchestrator.models import Event, MergedChunk, OperatorQuota, PolicyLab, Run
from orchestrator.pipeline.layout import segments_dir
from orchestrator.pipeline.producer import StreamTarget, produce
from orchestrator.pipeline.streams import STREAM_PREFIX
from orchestrator.services.launcher import Endpoints
from tests.orchestrator.run.scenarios import wait_until_done
from tests.webapp.console.factories import client_for, make_run, reference
from webapp.console.topology_io import export_document

pytestmark = [pytest.mark.integration]

WINDOW = {"window_s": 10, "event_time": "ts", "lateness_s": 2}


def start(client: Client, source: object, pipeline: str = "reference") -> Any:
    body = {"pipeline": pipeline, "source": source}
    return client.post("/api/runs/", body, content_type="application/json")


@pytest.fixture
def broker(services: Endpoints) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(services.redis_url)
    yield client
    client.delete(STREAM_PREFIX + "spark")
    client.close()


@pytest.mark.spark
@pytest.mark.django_db(transaction=True)
def test_a_stream_named_as_the_broker_s_queue_is_the_console_s_and_celery_goes_on(
    workers: Any, services: Endpoints, broker: redis.Redis
) -> None:
    # Given an operator, and the console's Redis, which is Celery's broker (its queue
    # for batches is the key "spark": a list while a batch waits, absent otherwise)
    reference()
    client, _ = client_for("otto", "operator")
    # When they start a run over a stream named "spark"
    response = start(client, {"kind": "stream", "stream": "spark", "linger_s": 0.1})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    # Then the run reads the console's stream of that name...
    deadline = time.monotonic() + 60
    while not broker.exists(STREAM_PREFIX + "spark"):
        assert time.monotonic() < deadline, f"run {run.pk} never opened its stream"
        time.sleep(0.1)
    groups = [g["name"] for g in broker.xinfo_groups(STREAM_PREFIX + "spark")]
    assert groups == [f"bpconsole.run.{run.pk}".encode()]
    # ...records produced to it go through Celery's "spark" queue as batches that complete
    produce(
        StreamTarget(services.redis_url, "spark"),
        rate_bps=1024 * 1024,
        pattern="steady",
        duration_s=5,
        seed=3,
        max_bytes=20_000,
    )
    deadline = time.monotonic() + 120
    while not MergedChunk.objects.filter(run=run).exists():
        assert broker.type("spark") != b"stream", "the broker's queue became a stream"
        assert time.monotonic() < deadline, f"no batch of run {run.pk} completed in 120 s"
        time.sleep(0.2)
    # ...and the queue key never became a stream
    assert broker.type("spark") in {b"list", b"none"}
    stopped = client.post(f"/api/runs/{run.pk}/stop/", content_type="application/json")
    assert stopped.status_code == 200, stopped.content
    assert wait_until_done(run).status == "completed"
    assert broker.type("spark") in {b"list", b"none"}


@pytest.mark.spark
@pytest.mark.django_db(transaction=True)
def test_a_run_stored_over_the_broker_s_queue_resumes_under_the_prefix(
    workers: Any, services: Endpoints, broker: redis.Redis
) -> None:
    # Given a run stored before the streams' prefix, over the stream "spark" of the
    # console's Redis (Celery's queue key), taken up by a driver as after a restart
    reference()
    _, otto = client_for("otto", "operator")
    run = make_run(user=otto)
    run.input_spec = {"kind": "stream", "stream": "spark", "url": "", "group": ""}
    run.save()
    service.start_run(run)
    # When records are produced to the console's stream of that name
    deadline = time.monotonic() + 60
    while not broker.exists(STREAM_PREFIX + "spark"):
        assert time.monotonic() < deadline, f"run {run.pk} never opened its stream"
        assert broker.type("spark") != b"stream", "the broker's queue became a stream"
        time.sleep(0.1)
    produce(
        StreamTarget(services.redis_url, "spark"),
        rate_bps=1024 * 1024,
        pattern="steady",
        duration_s=5,
        seed=4,
        max_bytes=20_000,
    )
    # Then the run reads it, its batches complete through the "spark" queue, and the
    # queue key never becomes a stream
    deadline = time.monotonic() + 120
    while not MergedChunk.objects.filter(run=run).exists():
        assert broker.type("spark") != b"stream", "the broker's queue became a stream"
        assert time.monotonic() < deadline, f"no batch of run {run.pk} completed in 120 s"
        time.sleep(0.2)
    service.set_status(run.pk, "stopping", reason="test: stop the resumed run")
    assert wait_until_done(run).status == "completed"
    assert broker.type("spark") in {b"list", b"none"}


@pytest.fixture
def own_folders(settings: Any, tmp_path: Path) -> dict[str, Path]:
    """An administrator listed a root that holds the console's data folder and sink
    root, and another operator's run has segments and a Parquet sink's files there."""
    var = tmp_path / "var"
    settings.DATA_DIR = var / "data"
    settings.BPCONSOLE_SINK_ROOT = var / "sinks"
    settings.INPUT_ROOTS = [str(var)]
    (var / "inputs" / "landing").mkdir(parents=True)
    _, bob = client_for("bob", "operator")
    theirs = make_run(user=bob)
    segments = segments_dir(theirs.pk)
    segments.mkdir(parents=True)
    (segments / "s1.jsonl").write_text('{"key": "k", "value": 1, "user": "u"}\n')
    parquet = settings.BPCONSOLE_SINK_ROOT / "bob-windows"
    parquet.mkdir(parents=True)
    (parquet / "part-0.jsonl").write_text('{"key": "k"}\n')
    return {"segments": segments, "parquet": parquet, "landing": var / "inputs" / "landing"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("what", "words"),
    [
        ("segments", "the console's data folder (BPCONSOLE_DATA_DIR)"),
        ("parquet", "the console's sink folder (BPCONSOLE_SINK_ROOT)"),
    ],
)
def test_no_input_lies_in_the_data_folder_or_the_sink_root_even_under_a_listed_root(
    no_start: list[int], own_folders: dict[str, Path], what: str, words: str
) -> None:
    # Given an operator, and another operator's files in the console's own folders
    reference()
    client, _ = client_for("otto", "operator")
    folder = own_folders[what]
    before = Run.objects.count()
    # When they start a landing run over that folder that deletes what it merged, a
    # landing run archiving into it, or a run over one of its files
    attempts = [
        start(client, {"kind": "folder", "folder": str(folder), "clean": "delete"}),
        start(
            client,
            {
                "kind": "folder",
                "folder": str(own_folders["landing"]),
                "clean": "archive",
                "archive": str(folder / "archived"),
            },
        ),
        client.post(
            "/api/runs/",
            {"pipeline": "reference", "input_path": str(next(folder.iterdir()))},
            content_type="application/json",
        ),
        client.post(
            "/api/runs/",
            {"pipeline": "reference", "input_path": f"{folder}/*"},
            content_type="application/json",
        ),
    ]
    # Then each is refused, saying it is the console's own folder, and nothing exists
    for response in attempts:
        assert response.status_code == 400, response.content
        assert words in response.json()["detail"]
    assert Run.objects.count() == before and no_start == []
    assert [p.name for p in folder.iterdir()] == [next(folder.iterdir()).name]


def sinking_pipeline(name: str, **sink: str) -> dict[str, Any]:
    """The reference pipeline as ``name``, windowed on ``ts``, its sink writing ``sink``."""
    doc: dict[str, Any] = copy.deepcopy(export_document(reference()))
    doc["name"] = name
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"]["schema"] += ", ts timestamp"
        if node["kind"] == "operator":
            node["params"] = {**(node.get("params") or {}), **WINDOW}
        if node["kind"] == "sink":
            node["params"] = dict(sink)
    return doc


@pytest.fixture
def sink_root(settings: Any, tmp_path: Path) -> Path:
    settings.BPCONSOLE_SINK_ROOT = tmp_path / "sinks"
    return settings.BPCONSOLE_SINK_ROOT


def save(client: Client, doc: dict[str, Any]) -> Any:
    return client.post("/api/pipelines/", doc, content_type="application/json")


def run_of(client: Client, pipeline: str) -> Any:
    body = {"pipeline": pipeline, "generator": "seed=3,volume_mb=0.2"}
    return client.post("/api/runs/", body, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mine", "theirs", "words"),
    [
        (
            {"sink": "postgres", "table": "windows_otto"},
            {"sink": "postgres", "table": "windows_otto"},
            "table 'windows_otto' in database 'console' belongs to pipeline 'otto-windows'",
        ),
        (
            {"sink": "parquet", "path": "otto/windows"},
            {"sink": "parquet", "path": "otto/windows/"},
            "Parquet path 'otto/windows' belongs to pipeline 'otto-windows'",
        ),
        (
            {"sink": "parquet", "path": "otto/windows"},
            {"sink": "parquet", "path": "otto/windows/inside"},
            "(overlapping 'otto/windows') belongs to pipeline 'otto-windows'",
        ),
        (
            {"sink": "parquet", "path": "otto/windows"},
            {"sink": "parquet", "path": "otto"},
            "(overlapping 'otto/windows') belongs to pipeline 'otto-windows'",
        ),
    ],
)
def test_a_sink_s_table_or_folder_is_the_pipeline_s_that_first_wrote_it(
    no_start: list[int], sink_root: Path, mine: dict[str, str], theirs: dict[str, str], words: str
) -> None:
    # Given two operators, each with a pipeline; the second saved before the first ran
    otto, _ = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    assert save(otto, sinking_pipeline("otto-windows", **mine)).status_code == 201
    assert save(bob, sinking_pipeline("bob-windows", **theirs)).status_code == 201
    # When the first starts a run, its sink's target becomes its pipeline's
    first = run_of(otto, "otto-windows")
    assert first.status_code == 201, first.content
    # Then the other operator's pipeline naming it (or a folder in or around it) may
    # neither run nor be saved again, and the answer says whose it is
    refused = run_of(bob, "bob-windows")
    assert refused.status_code == 400, refused.content
    assert words in refused.json()["detail"]
    resaved = save(bob, sinking_pipeline("bob-windows", **theirs))
    assert resaved.status_code == 400, resaved.content
    assert any(words in str(p) for p in resaved.json()["problems"]), resaved.json()
    assert Run.objects.filter(pipeline_name="bob-windows").count() == 0
    assert no_start == [first.json()["id"]]
    # ...while its own pipeline runs again, and another target is free to take
    assert run_of(otto, "otto-windows").status_code == 201
    other = {"sink": "postgres", "table": "windows_bob"}
    assert save(bob, sinking_pipeline("bob-windows", **other)).status_code == 200
    assert run_of(bob, "bob-windows").status_code == 201


@pytest.mark.django_db
def test_no_run_joins_a_consumer_group_another_run_reads(no_start: list[int]) -> None:
    # Given one operator's runs over a stream: one in its own group, one in a named one
    reference()
    otto, _ = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    own = start(otto, {"kind": "stream", "stream": stream})
    named = start(otto, {"kind": "stream", "stream": stream, "group": "billing"})
    assert own.status_code == named.status_code == 201
    own_id, named_id = own.json()["id"], named.json()["id"]
    # When another operator starts a run in either group
    joins_own = start(bob, {"kind": "stream", "stream": stream, "group": f"bpconsole.run.{own_id}"})
    joins_named = start(bob, {"kind": "stream", "stream": stream, "group": "billing"})
    # Then both are refused, saying which run holds the group, and nothing is created
    assert joins_own.status_code == 400, joins_own.content
    assert f"run {own_id}'s own consumer group" in joins_own.json()["detail"]
    assert joins_named.status_code == 400, joins_named.content
    assert (
        f"run {named_id} of pipeline 'reference' is reading stream {stream!r} as consumer "
        "group 'billing'" in joins_named.json()["detail"]
    )
    assert no_start == [own_id, named_id]
    # ...while a group of their own on the same stream is theirs to read
    assert start(bob, {"kind": "stream", "stream": stream, "group": "audit"}).status_code == 201


@pytest.mark.django_db
def test_one_reader_per_landing_folder_without_a_checkpoint(
    no_start: list[int], settings: Any, tmp_path: Path
) -> None:
    root = tmp_path / "inputs"
    for folder in ("landing", "archive", "other"):
        (root / folder).mkdir(parents=True)
    settings.INPUT_ROOTS = [str(root)]
    # Given one operator's run over a landing folder, archiving what it merged
    reference()
    otto, _ = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    mine = {"kind": "folder", "folder": "landing", "clean": "archive", "archive": "archive"}
    first = start(otto, mine)
    assert first.status_code == 201, first.content
    run_id = first.json()["id"]
    # When another operator starts a run over the same folder, without a checkpoint or
    # with one, or one whose landing folder is the first run's archive
    attempts = [
        start(bob, {"kind": "folder", "folder": "landing", "clean": "delete"}),
        start(bob, {"kind": "folder", "folder": "landing", "checkpoint": "bob-1"}),
        start(bob, {"kind": "folder", "folder": "archive", "clean": "delete"}),
    ]
    # Then each is refused, naming the run that reads it, and nothing is created
    for response in attempts:
        assert response.status_code == 400, response.content
        detail = response.json()["detail"]
        assert f"run {run_id} of pipeline 'reference' is reading the landing folder" in detail
    assert no_start == [run_id]
    # ...another folder is free, and the folder is once the first run has ended
    assert start(bob, {"kind": "folder", "folder": "other"}).status_code == 201
    stopped = otto.post(f"/api/runs/{run_id}/stop/", content_type="application/json")
    assert stopped.status_code == 200, stopped.content
    assert start(bob, {"kind": "folder", "folder": "landing"}).status_code == 201


@pytest.mark.django_db
def test_two_runs_read_one_folder_when_each_keeps_its_files_with_its_own_checkpoint(
    no_start: list[int], settings: Any, tmp_path: Path
) -> None:
    (tmp_path / "inputs" / "landing").mkdir(parents=True)
    settings.INPUT_ROOTS = [str(tmp_path / "inputs")]
    reference()
    otto, _ = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    kept = {"kind": "folder", "folder": "landing", "clean": "keep"}
    assert start(otto, {**kept, "checkpoint": "otto-1"}).status_code == 201
    assert start(bob, {**kept, "checkpoint": "bob-1"}).status_code == 201
    assert start(bob, {**kept, "checkpoint": "otto-1"}).status_code == 400
    assert len(no_start) == 2


@pytest.fixture
def no_lab_worker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Labs are created for real but not handed to a worker."""
    handed: list[int] = []
    monkeypatch.setattr(service, "start_lab", lambda lab: handed.append(lab.pk))
    return handed


@pytest.mark.django_db
def test_an_operator_holds_at_most_the_quota_of_active_runs(no_start: list[int]) -> None:
    # Given two operators and the default quota (4 runs not over yet per operator)
    reference()
    otto, otto_user = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    started = [run_of(otto, "reference") for _ in range(4)]
    assert [r.status_code for r in started] == [201] * 4
    # When the first starts a fifth
    refused = run_of(otto, "reference")
    # Then it is a 429 saying the quota, recorded as refusals are, and nothing is created
    assert refused.status_code == 429, refused.content
    assert "you have 4 runs not over yet" in refused.json()["detail"]
    event = Event.objects.get(kind="action_refused", user=otto_user)
    assert event.data["action"] == "start_run" and event.data["limit"] == "4"
    assert Run.objects.filter(created_by=otto_user).count() == 4
    # ...while the other operator's quota is their own, and a run that ends frees one
    assert run_of(bob, "reference").status_code == 201
    cancel = otto.post(
        f"/api/runs/{started[0].json()['id']}/cancel/", content_type="application/json"
    )
    assert cancel.status_code == 200, cancel.content
    assert run_of(otto, "reference").status_code == 201


@pytest.mark.django_db
def test_the_quota_is_an_admin_setting_and_admins_are_exempt_unless_it_says(
    no_start: list[int],
) -> None:
    reference()
    quota = OperatorQuota.current()
    quota.active_runs = 1
    quota.save()
    otto, _ = client_for("otto", "operator")
    ada, _ = client_for("ada", "admin")
    assert run_of(otto, "reference").status_code == 201
    refused = run_of(otto, "reference")
    assert refused.status_code == 429
    assert "you have 1 runs not over yet" in refused.json()["detail"]
    # An admin is exempt by default...
    assert [run_of(ada, "reference").status_code for _ in range(3)] == [201] * 3
    # ...and held to it when the setting says so
    quota.admins_exempt = False
    quota.save()
    assert run_of(ada, "reference").status_code == 429


@pytest.mark.django_db
def test_an_operator_holds_at_most_the_quota_of_labs(no_lab_worker: list[int]) -> None:
    # Given two operators and the default quota (2 labs waiting or running per operator)
    reference()
    otto, otto_user = client_for("otto", "operator")
    bob, _ = client_for("bob", "operator")
    url = "/api/pipelines/reference/labs/"
    body = {"generator": "seed=2,volume_mb=16"}
    labs = [otto.post(url, body, content_type="application/json") for _ in range(2)]
    assert [lab.status_code for lab in labs] == [201, 201]
    # When the first asks for a third
    refused = otto.post(url, body, content_type="application/json")
    # Then it is a 429 saying the quota, recorded, and no lab is created
    assert refused.status_code == 429, refused.content
    assert "you have 2 labs waiting or running" in refused.json()["detail"]
    event = Event.objects.get(kind="action_refused", user=otto_user)
    assert event.data["action"] == "run_policy_lab" and event.data["limit"] == "2"
    assert PolicyLab.objects.filter(created_by=otto_user).count() == 2
    # ...while the other operator may still ask for one
    assert bob.post(url, body, content_type="application/json").status_code == 201


@pytest.mark.django_db
def test_a_run_is_steered_only_by_the_operator_who_started_it_or_an_admin() -> None:
    # Given a run olga started, and a run started from the server's shell (no one's)
    reference()
    olga_client, olga = client_for("olga", "operator")
    otto_client, _ = client_for("otto", "operator")
    admin_client, _ = client_for("ada", "admin")
    hers = make_run(user=olga)
    nobodys = make_run()
    # When another operator pauses, stops, cancels, migrates or adjusts hers
    attempts = [
        ("post", f"/api/runs/{hers.pk}/pause/", None),
        ("post", f"/api/runs/{hers.pk}/stop/", None),
        ("post", f"/api/runs/{hers.pk}/cancel/", None),
        ("post", f"/api/runs/{hers.pk}/migrate/", {"node": "task1"}),
        ("post", f"/api/runs/{hers.pk}/stop-migrating/", {"node": "task1"}),
        ("post", f"/api/runs/{hers.pk}/adjust/", {"action": "add_instance", "stage": "agg"}),
    ]
    for _, url, body in attempts:
        response = otto_client.post(url, body or {}, content_type="application/json")
        # Then each is refused, saying whose run it is, recorded, and nothing changed
        assert response.status_code == 403, (url, response.content)
        assert "started by olga" in response.json()["detail"], url
    hers.refresh_from_db()
    assert hers.status == Run.Status.PENDING
    refused = Event.objects.filter(run=hers, kind="action_refused")
    assert refused.count() >= 1
    assert all("otto" in e.reason for e in refused)
    # ...while she and an admin may steer it, and any operator the shell's run
    assert olga_client.post(f"/api/runs/{hers.pk}/pause/").status_code == 200
    assert admin_client.post(f"/api/runs/{hers.pk}/resume/").status_code == 200
    assert otto_client.post(f"/api/runs/{nobodys.pk}/pause/").status_code == 200
