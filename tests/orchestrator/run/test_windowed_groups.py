"""The flights query per event-time window, into a PostgreSQL table and Parquet files
whose columns are the query's: through a killed Spark worker and a hot migration of the
join, every (window, group) row is written once, and equals the plain Spark job's
``window()`` over the same input, measure by measure."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.db import connection

from sparkjobs.event_time import US, iso
from tests.orchestrator.run.scenarios import (
    AIRLINES,
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

# Minute windows; a record is at most 5 s out of order, well within the lateness.
WINDOWS = {"window_s": 60, "event_time": "t", "lateness_s": 15}
# The query's own columns, after the window's bounds
COLUMNS = [
    "name",
    "origin",
    "flights",
    "delayed",
    "mean_delay",
    "total_delay",
    "least_delay",
    "most_delay",
    "tails",
]


def _pipeline(root: Path, sink: dict[str, str]) -> dict[str, Any]:
    airlines_table(root / "airlines.csv", AIRLINES)
    doc: dict[str, Any] = joined_flights(sql=FLIGHTS_SQL)
    doc["nodes"][0]["params"]["schema"] += ", t long"
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], **WINDOWS}
    doc["nodes"][-1]["params"] = sink
    return doc


def _same(written: list[dict[str, Any]], shown: list[dict[str, Any]]) -> None:
    """The sink's rows are the run's, each (window, group) once: counts and the sums,
    minima and maxima exactly, averages at the sink's ten decimal places."""
    assert len(written) == len(shown) > 0
    for row, want in zip(written, shown, strict=True):
        assert {k: row[k] for k in ("window_start", "window_end", "name", "origin")} == {
            k: want[k] for k in ("window_start", "window_end", "name", "origin")
        }
        for name in ("flights", "delayed", "tails"):
            assert row[name] == want[name], (name, want)
        for name in ("total_delay", "least_delay", "most_delay"):
            assert row[name] == Decimal(str(want[name])), (name, want)
        assert abs(float(row["mean_delay"]) - float(want["mean_delay"])) < 1e-9, want


def test_windows_go_to_a_table_of_the_query_s_columns_once_through_a_kill_and_a_migration(
    workers: Any, settings: Any, tmp_path: Path
) -> None:
    # Given four minutes of flights, and the flights query per minute into a table
    root = input_folder(settings, tmp_path, data=False)
    write_flights(root / "flights.jsonl", 24_000, seed=11, per_second=100)
    table = f"flights_{uuid.uuid4().hex[:8]}"
    doc = _pipeline(root, {"sink": "postgres", "table": table})
    doc["nodes"][1]["max_rate_mbps"] = 1.5  # long enough a run for what follows
    run = start(doc, policy(), input_path=str(root / "flights.jsonl"))
    # When a Spark worker is killed holding a batch, and the join is hot-migrated
    kill_a_batch_and_hot_migrate(run, workers, node="enrich")
    # Then the run equals the plain job's window() over the same input
    result = completes_like_the_batch_job(run)
    # (four minutes, and the one before that the first records out of order fall in)
    assert len({r["window_start"] for r in result["rows"]}) == 5
    # ...and the table holds each of its rows once, in the query's columns and types
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = %s ORDER BY ordinal_position",
            [table],
        )
        types = cursor.fetchall()
        cursor.execute(
            f"SELECT (extract(epoch FROM window_start) * 1000000)::bigint,"  # noqa: S608 - a name made here
            f" (extract(epoch FROM window_end) * 1000000)::bigint, {', '.join(COLUMNS)}"
            f" FROM {table} ORDER BY 1, name, origin"
        )
        found = cursor.fetchall()
        cursor.execute(f"SELECT count(*), sum(rows) FROM {table}_commits")  # noqa: S608
        commits = cursor.fetchone()
        cursor.execute(f"DROP TABLE {table}, {table}_commits")
    assert [name for name, _ in types] == ["window_start", "window_end", *COLUMNS, "run_id"]
    assert dict(types)["mean_delay"] == "numeric" and dict(types)["tails"] == "bigint"
    written = [
        {
            "window_start": iso(r[0]),
            "window_end": iso(r[1]),
            **dict(zip(COLUMNS, r[2:], strict=True)),
        }
        for r in found
    ]
    _same(written, result["rows"])
    assert commits == (5, len(found))
    # ...and the results API shows each row with its window, to the lowest role
    client, _ = client_for("vic", "viewer")
    shown = client.get(f"/api/runs/{run.pk}/results/").json()
    assert shown["columns"] == ["window_start", "window_end", *COLUMNS]


def test_windows_go_to_parquet_files_of_the_query_s_columns_once_each(
    workers: Any, settings: Any, tmp_path: Path
) -> None:
    root = input_folder(settings, tmp_path, data=False)
    write_flights(root / "flights.jsonl", 9_000, seed=11, per_second=50)
    # Below the sink root the workers write under, as configured for the whole session
    path = f"test-{uuid.uuid4().hex[:8]}/by-minute"
    doc = _pipeline(root, {"sink": "parquet", "path": path})
    run = start(doc, policy(), input_path=str(root / "flights.jsonl"))
    result = completes_like_the_batch_job(run)
    folder = Path(settings.BPCONSOLE_SINK_ROOT) / path
    manifest = json.loads((folder / "_manifest.json").read_text())["windows"]
    # Each window listed once, in order: the run's windows
    starts = [iso(w["start_us"]) for w in manifest]
    assert starts == sorted({r["window_start"] for r in result["rows"]}) and len(starts) >= 3
    written = []
    for entry in manifest:
        table = pq.read_table(folder / entry["file"])
        assert table.schema.names == ["window_start", "window_end", *COLUMNS, "run_id"]
        for row in table.to_pylist():
            start_us = int(row["window_start"].timestamp() * US)
            end_us = int(row["window_end"].timestamp() * US)
            written.append({**row, "window_start": iso(start_us), "window_end": iso(end_us)})
        assert entry["rows"] == table.num_rows
    _same(written, result["rows"])
