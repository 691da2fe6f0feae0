"""A pipeline that joins its records with reference data and computes grouped measures
by a sql stage's statement (the flights query): the run joins the table as it was when
the run started, through a killed Spark worker and a hot migration of the join, and its
result equals the plain Spark job over the same input and table, row for row, each
measure by its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
    write_flights,
)
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
