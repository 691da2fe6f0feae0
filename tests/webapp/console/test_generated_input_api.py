"""Bounded generation through the console: a generator spec is refused (400, naming the
field) before anything is created or written, and an admitted one is recorded at once:
the request never writes the input, whatever its volume (the run's driver does)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.models import Event, Run
from orchestrator.run.generation import input_path
from orchestrator.worker.batch import run_dir
from tests.webapp.console.factories import client_for, make_run, reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MB = 1024 * 1024


def data_files() -> dict[str, int]:
    """Every file under the data folder, with its size."""
    root = Path(settings.DATA_DIR)
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def start(client: Client, generator: str) -> tuple[float, object]:
    began = time.perf_counter()
    response = client.post(
        "/api/runs/",
        {"pipeline": "reference", "generator": generator},
        content_type="application/json",
    )
    return time.perf_counter() - began, response


def test_a_volume_over_the_limit_is_a_400_and_nothing_is_created_or_written(
    no_start: list[int],
) -> None:
    # Given an operator and the default limit of 4096 MB
    reference()
    client, _ = client_for("otto", "operator")
    before = data_files()
    # When they start a run asking for 100000 MB
    _, response = start(client, "seed=7,volume_mb=100000")
    # Then it is refused with the field, the value and the limit, and nothing exists
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert "volume_mb" in detail and "100000" in detail and "4096" in detail
    assert Run.objects.count() == 0
    assert not Event.objects.filter(kind="run_created").exists()
    assert no_start == []
    assert data_files() == before


@pytest.mark.parametrize(
    ("generator", "words"),
    [
        ("seed=7,colour=blue", ["unknown generator field", "colour"]),
        ("seed=seven", ["seed", "not a number"]),
        ("seed=7,volume_mb=lots", ["volume_mb", "not a number"]),
        ("seed=-3", ["seed", "out of range"]),
        ("keys_per_branch=1000000", ["keys_per_branch", "out of range"]),
        ("users=0", ["users", "out of range"]),
        ("malformed_every=-2", ["malformed_every", "out of range"]),
        ("skew_mean_s=0", ["skew_mean_s", "out of range"]),
        ("dominance=nan", ["dominance", "not a finite number"]),
        ("volume_mb=inf", ["volume_mb", "not a finite number"]),
        ("seed=1," * 100, ["characters long"]),
    ],
)
def test_a_bad_generator_spec_is_a_400_naming_the_field_and_nothing_is_created(
    no_start: list[int], generator: str, words: list[str]
) -> None:
    # Given an operator
    reference()
    client, _ = client_for("otto", "operator")
    before = data_files()
    # When the spec has an unknown field, a non-number or a value out of range
    _, response = start(client, generator)
    # Then it is a 400 whose message names the field, and nothing was created
    assert response.status_code == 400, response.content
    for word in words:
        assert word in response.json()["detail"], response.json()
    assert Run.objects.count() == 0
    assert data_files() == before


def test_the_request_records_the_run_at_once_and_writes_no_input(no_start: list[int]) -> None:
    # Given an operator and no worker running
    reference()
    client, _ = client_for("otto", "operator")
    start(client, "seed=1,volume_mb=0.1")  # warm: the first request loads the URL map, ...
    # When they start runs of 64 MB and of the largest volume admitted
    for volume in (64, settings.BPCONSOLE_GENERATOR_MAX_MB):
        seconds, response = start(client, f"seed=7,volume_mb={volume}")
        # Then each answers well under a second, pending, its spec recorded...
        assert response.status_code == 201, response.content
        assert seconds < 1.0, f"{volume} MB: the request took {seconds:.2f} s"
        body = response.json()
        assert body["status"] == "pending"
        assert body["input"]["generator"]["volume_mb"] == volume
        assert body["input"]["paths"] == [] and body["input"]["bytes"] == 0
        # ...and no input file exists yet: the run's driver will write it
        assert not input_path(body["id"]).exists()
        assert not any(p.is_file() for p in run_dir(body["id"]).rglob("*"))
        run = Run.objects.get(pk=body["id"])
        assert "paths" not in run.input_spec and "extent_total" not in run.input_spec
    assert len(no_start) == 3


def test_the_start_form_refuses_a_volume_over_the_limit(settings) -> None:
    # Given a limit of 8 MB and an operator on the pipeline's page
    settings.BPCONSOLE_GENERATOR_MAX_MB = 8
    reference()
    operator, _ = client_for("otto", "operator")
    # When they start a run of 9 MB from the form
    response = operator.post(
        "/pipelines/reference/start/", {"input": "generator", "generator": "seed=1,volume_mb=9"}
    )
    # Then they are back on the pipeline's page with the reason, and no run exists
    assert response.status_code == 302
    page = operator.get(response["Location"]).content.decode()
    assert "The run was not started" in page
    assert "volume_mb: 9 MB is over the limit of 8 MB" in page
    assert Run.objects.count() == 0


def test_the_run_page_shows_how_far_the_input_is_prepared() -> None:
    # Given a run whose driver has written 40 of its input's 100 MB
    run = make_run()
    spec = {**run.input_spec, "generating": {"written": 40 * MB, "total": 100 * MB}}
    Run.objects.filter(pk=run.pk).update(input_spec=spec)
    viewer, _ = client_for("vera", "viewer")
    # When a viewer opens its page, its snapshot and its API view
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    snapshot = viewer.get(f"/api/runs/{run.pk}/snapshot/").json()
    detail = viewer.get(f"/api/runs/{run.pk}/").json()
    # Then each says how far the input is
    shown = re.search(r'<p id="run-preparing"[^>]*>([^<]*)</p>', page)
    assert shown is not None and "hidden" not in shown.group(0)
    assert shown.group(1) == "preparing input: 40%"
    assert snapshot["run"]["preparing"] == {"written": 40 * MB, "total": 100 * MB, "fraction": 0.4}
    assert detail["input"]["preparing"]["fraction"] == 0.4
    # And once the input exists, nothing is being prepared any more
    done = {
        **spec,
        "paths": ["/x/input.jsonl"],
        "extent_total": 100 * MB,
        "generating": {"written": 100 * MB, "total": 100 * MB},
    }
    Run.objects.filter(pk=run.pk).update(input_spec=done)
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    assert re.search(r'<p id="run-preparing"[^>]* hidden>', page)
    snapshot = viewer.get(f"/api/runs/{run.pk}/snapshot/").json()
    assert snapshot["run"]["preparing"] is None
    assert snapshot["run"]["input_total"] == 100 * MB
