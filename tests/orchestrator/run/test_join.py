"""A pipeline that joins its records with reference data and computes grouped measures
by a sql stage's statement (the flights query): the run joins the table as it was when
the run started, through a killed Spark worker and a hot migration of the join, and its
result equals the plain Spark job over the same input and table, row for row, each
measure by its name."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run, SourceFile
from orchestrator.run.lifecycle import set_status, snapshot
from orchestrator.source.replay import Replay, ReplayError, replay_inputs, write_ingested
from orchestrator.source.spec import LandingSpec, StreamSpec
from orchestrator.worker.plain_job import batch_summary
from tests.conftest import TEST_VAR_DIR
from tests.orchestrator.run.scenarios import (
    AIRLINES,
    FLIGHT_MEASURES,
    FLIGHTS_SQL,
    airlines_table,
    completes_like_the_batch_job,
    input_folder,
    joined_flights,
    kill_a_batch_and_hot_migrate,
    policy,
    start,
    wait_until_done,
    write_flights,
)
from tests.waiting import wait_for
from tests.webapp.console.factories import client_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_joined_run_equals_the_plain_job_over_the_table_it_started_with(
    workers: Any, settings: Any, tmp_path: Path
) -> None:
    # Given flights, an airlines table below the input folder, and a pipeline that
    # names each flight's airline and aggregates per airline
    # The run's copy of the table goes to the data folder its Spark workers read.
    root = input_folder(settings, tmp_path, data=False)
    airlines_table(root / "airlines.csv", AIRLINES)
    write_flights(root / "flights.jsonl", 60_000, seed=7)
    doc = joined_flights(sql=FLIGHTS_SQL)
    doc["nodes"][1]["max_rate_mbps"] = 2.0  # long enough a run for what follows
    run = start(doc, policy(), input_path=str(root / "flights.jsonl"))
    # When the table changes once the run has started
    airlines_table(root / "airlines.csv", {c: n.upper() for c, n in AIRLINES.items()})
    # ...a Spark worker is killed holding a batch, and the join is hot-migrated
    kill_a_batch_and_hot_migrate(run, workers, node="enrich")
    # Then the run equals the plain job over the table it started with, whose names
    # it joined, not the changed table's, per name and origin, its measures by name
    result = completes_like_the_batch_job(run)
    assert {r["name"] for r in result["rows"]} == set(AIRLINES.values())
    assert len(result["rows"]) == 9
    assert all(r["delayed"] < r["flights"] and r["tails"] <= 400 for r in result["rows"])
    assert all(r["least_delay"] >= 0 for r in result["rows"])  # the statement's WHERE
    assert result["malformed_records"] > 0
    # ...and the results API shows them by their names, to the lowest role that reads it
    client, _ = client_for("vic", "viewer")
    shown = client.get(f"/api/runs/{run.pk}/results/").json()
    assert shown["columns"] == [
        "name",
        "origin",
        *(m["name"] for m in FLIGHT_MEASURES["measures"]),
    ]
    assert sorted(shown["rows"], key=lambda r: (r["name"], r["origin"])) == result["rows"]


def _land(folder: Path, name: str, records: int, *, seed: int) -> None:
    """A file of flights landed whole: written aside, then renamed into the folder."""
    aside = folder.parent / f".{name}"
    write_flights(aside, records, seed=seed)
    aside.rename(folder / name)


@pytest.fixture
def workers_inputs(settings: Any) -> Iterator[Path]:
    """A folder of its own below the input folder the Spark workers read (a refresh
    reads the table there), which the test's process reads too; removed after."""
    root = TEST_VAR_DIR / "inputs" / f"refresh-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    settings.INPUT_ROOTS = [str(root.parent)]
    yield root
    shutil.rmtree(root)


def test_files_landing_after_a_refresh_join_the_new_table_through_a_kill_and_a_migration(
    workers: Any, workers_inputs: Path, tmp_path: Path
) -> None:
    # Given a landing folder and an airlines table where the Spark workers read inputs,
    # and the flights query joining the table again every 5 s
    root = workers_inputs
    landing = root / "landing"
    landing.mkdir()
    airlines_table(root / "airlines.csv", AIRLINES)
    doc = joined_flights(reference=f"{root.name}/airlines.csv", sql=FLIGHTS_SQL, refresh_s=5)
    doc["nodes"][1]["max_rate_mbps"] = 2.0  # long enough a run for what follows
    _land(landing, "early.jsonl", 6_000, seed=3)
    run = start(doc, policy(), source=LandingSpec(str(landing), "*.jsonl", stable_s=0))
    wait_for("the early file taken in", SourceFile.objects.filter(run=run).exists, timeout_s=60)
    # When the table changes, is read again, and a file lands after that
    airlines_table(root / "airlines.csv", {c: n.upper() for c, n in AIRLINES.items()})
    refreshed = Event.objects.filter(run=run, kind="reference_refreshed")
    wait_for("the table read again", refreshed.exists, timeout_s=60)
    _land(landing, "late.jsonl", 20_000, seed=4)
    # ...and a Spark worker is killed holding a batch, and the join is hot-migrated
    kill_a_batch_and_hot_migrate(run, workers, node="enrich")
    wait_for(
        "the late file taken in and every record merged",
        lambda: (
            SourceFile.objects.filter(run=run).count() == 2
            and (snapshot(run.pk)["source"]["lag"] or {}).get("entries") == 0
        ),
        timeout_s=180,
    )
    set_status(run.pk, "stopping", reason="test: both files are in")
    run = wait_until_done(run)
    # Then the early file joined the table as the run started, the late one the new
    # table, both bound in the ledger...
    bound = dict(SourceFile.objects.filter(run=run).values_list("path", "references"))
    assert bound[str(landing / "early.jsonl")] == {}
    assert bound[str(landing / "late.jsonl")] == {"enrich": refreshed.get().data["file"]}
    # ...the run joined both tables, and equals the plain job over what it took in, each
    # file joining the copy it was bound to (one input per copy)
    _joined_both_and_equals_the_plain_job_per_copy(run, tmp_path)


def test_stream_entries_after_a_refresh_join_the_new_table_through_a_kill_and_a_migration(
    workers: Any, services: Any, workers_inputs: Path, tmp_path: Path
) -> None:
    # Given a Redis stream of flights, an airlines table where the Spark workers read
    # inputs, and the flights query joining the table again every 5 s
    root = workers_inputs
    airlines_table(root / "airlines.csv", AIRLINES)
    doc = joined_flights(reference=f"{root.name}/airlines.csv", sql=FLIGHTS_SQL, refresh_s=5)
    doc["nodes"][1]["max_rate_mbps"] = 2.0  # long enough a run for what follows
    stream = f"test-flights-{uuid.uuid4().hex[:8]}"
    (key,) = StreamSpec(stream).streams
    client = redis.Redis.from_url(services.redis_url)
    _add_entries(client, key, tmp_path / "early.jsonl", 6_000, seed=3)
    run = start(doc, policy(), source=StreamSpec(stream, linger_s=0.2))
    wait_for("the early entries taken in", lambda: _taken(run.pk) == 6_000, timeout_s=60)
    # When the table changes, is read again, and more entries arrive after that
    airlines_table(root / "airlines.csv", {c: n.upper() for c, n in AIRLINES.items()})
    refreshed = Event.objects.filter(run=run, kind="reference_refreshed")
    wait_for("the table read again", refreshed.exists, timeout_s=60)
    _add_entries(client, key, tmp_path / "late.jsonl", 20_000, seed=4)
    # ...and a Spark worker is killed holding a batch, and the join is hot-migrated
    kill_a_batch_and_hot_migrate(run, workers, node="enrich")
    wait_for(
        "every entry taken in and merged",
        lambda: (
            _taken(run.pk) == 26_000
            and (snapshot(run.pk)["source"]["lag"] or {}).get("entries") == 0
        ),
        timeout_s=180,
    )
    set_status(run.pk, "stopping", reason="test: every entry is in")
    run = wait_until_done(run)
    # Then the copy took effect after the early entries, in the ledger...
    (since,) = run.references["enrich"]["since"]
    assert since["entries"] == {key: 6_000}
    assert since["file"] == refreshed.get().data["file"]
    # ...the run joined both tables, and equals the plain job over what it took in, split
    # where the copy took effect (one input per copy): the late entries alone joined it
    replay = _joined_both_and_equals_the_plain_job_per_copy(run, tmp_path)
    assert Path(replay.paths[1]).read_bytes() == (tmp_path / "late.jsonl").read_bytes()


def _add_entries(client: redis.Redis, key: str, written: Path, records: int, *, seed: int) -> None:
    """Flights added to the stream, one entry each, as ``written`` holds them."""
    write_flights(written, records, seed=seed)
    with client.pipeline(transaction=False) as batch:
        for line in written.read_bytes().splitlines():
            batch.xadd(key, {"record": line})
        batch.execute()


def _taken(run_id: int) -> int:
    """The entries the run took in so far."""
    return int((Run.objects.get(pk=run_id).source_position or {}).get("offset", 0))


def _joined_both_and_equals_the_plain_job_per_copy(run: Run, tmp_path: Path) -> Replay:
    """The run completed exactly, its records joined the table's first names and its
    refreshed ones, and it equals the plain job over its replay, one part per copy of
    the table; as one input, it cannot be replayed. Returns the replay."""
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    names = {r["name"] for r in result["rows"]}
    assert names == {*AIRLINES.values(), *(n.upper() for n in AIRLINES.values())}
    replay = replay_inputs(run, tmp_path / "replay.jsonl")
    assert len(replay.paths) == 2
    expected = batch_summary(
        topology=run.topology, input_path=replay.paths, generator=None, copies=replay.copies
    )
    assert result["rows"] == expected["rows"]
    with pytest.raises(ReplayError, match="refreshed copies"):
        write_ingested(run, tmp_path / "whole.jsonl")
    return replay
