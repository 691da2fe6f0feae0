"""A join's reference table read from a PostgreSQL database the admin named: copied as
Parquet with its types when a run starts, bounded, never from the console's own database
nor from another pipeline's sink (orchestrator/pipeline/reference.py,
orchestrator/run/lifecycle.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from orchestrator.ledger.sink_owners import claim
from orchestrator.models import Event, Run
from orchestrator.pipeline.inputs import InputError
from orchestrator.pipeline.reference import columns_of, snapshot_table, store
from orchestrator.run.lifecycle import RunError, create_run
from orchestrator.run.references import Refresher
from tests.orchestrator.run.scenarios import joined_flights, policy
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def reports(services: Any, settings: Any, tmp_path: Path) -> Iterator[str]:
    """A database the admin named ``reports``, holding an airlines table."""
    server, _, _ = services.database_url.rpartition("/")
    name = f"ref_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE airlines (carrier text, name text, fleet int, share numeric)")
        conn.execute(
            "INSERT INTO airlines VALUES ('UA', 'United Air Lines Inc.', 900, 0.25),"
            " ('AA', 'American Airlines Inc.', 950, 0.3), ('B6', NULL, NULL, NULL)"
        )
    settings.BPCONSOLE_SINK_DATABASES = {"console": services.database_url, "reports": url}
    settings.DATA_DIR = tmp_path / "data"
    try:
        yield url
    finally:
        with psycopg.connect(services.database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_a_table_is_copied_as_parquet_with_its_types_in_the_order_of_its_rows(
    reports: str,
) -> None:
    name = snapshot_table("airlines", "reports")

    assert name.endswith(".parquet")
    copy = pq.read_table(store() / name)
    assert [str(t) for t in copy.schema.types][:3] == ["string", "string", "int32"]
    assert copy.to_pylist() == [
        {"carrier": "AA", "name": "American Airlines Inc.", "fleet": 950, "share": Decimal("0.3")},
        {"carrier": "B6", "name": None, "fleet": None, "share": None},
        {"carrier": "UA", "name": "United Air Lines Inc.", "fleet": 900, "share": Decimal("0.25")},
    ]
    # The same rows give the same copy; changed rows another
    assert snapshot_table("airlines", "reports") == name
    with psycopg.connect(reports) as conn:
        conn.execute("UPDATE airlines SET fleet = 901 WHERE carrier = 'UA'")
    assert snapshot_table("airlines", "reports") != name


@pytest.mark.parametrize(
    ("table", "database", "says"),
    [
        ("airlines", "console", "database 'console' is not one the admin named for pipelines"),
        ("airlines", "elsewhere", "database 'elsewhere' is not one the admin named"),
        ("nowhere", "reports", "'nowhere' in database 'reports' cannot be read"),
        ("big", "reports", "is over 1 MB (BPCONSOLE_REFERENCE_MAX_MB)"),
    ],
)
def test_a_table_that_cannot_be_taken_is_refused_saying_why(
    reports: str, settings: Any, table: str, database: str, says: str
) -> None:
    settings.BPCONSOLE_REFERENCE_MAX_MB = 1
    with psycopg.connect(reports) as conn:
        conn.execute(
            "CREATE TABLE big AS SELECT repeat('x', 1000) AS t FROM generate_series(1, 1200)"
        )
    with pytest.raises(InputError) as refused:
        snapshot_table(table, database)
    assert says in str(refused.value)
    assert not store().exists() or not any(store().iterdir())


@pytest.mark.parametrize("table", ["per_minute", "per_minute_commits"])
def test_a_run_may_not_read_another_pipeline_s_sink(
    reports: str, settings: Any, tmp_path: Path, table: str
) -> None:
    # Given another pipeline whose sink writes per_minute in reports
    assert claim("other", {"sink": "postgres", "table": "per_minute", "database": "reports"}) == ""
    flights = tmp_path / "flights.jsonl"
    flights.write_text('{"carrier": "UA", "delay": 1.0, "tail": "N1"}\n')
    doc = joined_flights(reference=None, table=table, database="reports")
    # When a run of a pipeline joining with it is created, it is refused
    with pytest.raises(RunError) as refused:
        create_run(topology=doc, policy=policy(), input_path=str(flights))
    assert "node enrich: a join may not read another pipeline's sink" in str(refused.value)
    assert "'other'" in str(refused.value)
    assert not Run.objects.exists()
    # ...while its own table of airlines is read
    doc = joined_flights(reference=None, table="airlines", database="reports")
    run = create_run(topology=doc, policy=policy(), input_path=str(flights))
    (enrich,) = [n for n in run.topology["nodes"] if n["name"] == "enrich"]
    assert (store() / enrich["reference_file"]).exists()


def test_a_table_s_columns_are_read_with_their_types_and_no_row(reports: str) -> None:
    columns = columns_of({"table": "airlines", "database": "reports"})
    assert columns is not None
    assert [(f.name, f.type) for f in columns.fields] == [
        ("carrier", "string"),
        ("name", "string"),
        ("fleet", "long"),
        ("share", "double"),
    ]


def test_a_run_whose_table_lost_a_column_its_join_adds_is_refused(
    reports: str, tmp_path: Path
) -> None:
    flights = tmp_path / "flights.jsonl"
    flights.write_text('{"carrier": "UA", "delay": 1.0, "tail": "N1"}\n')
    doc = joined_flights(reference=None, table="airlines", database="reports", columns=["fleet"])
    # Given the table changed after the pipeline was saved
    with psycopg.connect(reports) as conn:
        conn.execute("ALTER TABLE airlines DROP COLUMN fleet")
    # When a run is created, it is refused before anything exists
    with pytest.raises(RunError) as refused:
        create_run(topology=doc, policy=policy(), input_path=str(flights))
    assert "node enrich: the reference table has no column 'fleet'" in str(refused.value)
    assert "nothing was created" in str(refused.value)
    assert not Run.objects.exists()


def test_a_refreshed_table_is_taken_again_only_if_changed_fit_and_nobody_s_sink(
    reports: str, tmp_path: Path
) -> None:
    # Given a run joining the airlines table, read again every 5 s
    flights = tmp_path / "flights.jsonl"
    flights.write_text('{"carrier": "UA", "delay": 1.0, "tail": "N1"}\n')
    doc = joined_flights(reference=None, table="airlines", database="reports", refresh_s=5)
    run = create_run(topology=doc, policy=policy(), input_path=str(flights))
    refresher = Refresher(run.pk, run.epoch, run.topology, source="folder")
    clock = iter(range(1_000_000, 2_000_000, 1_000))

    def refreshed() -> dict[str, Any]:
        """One read of the table, finished; the run's latest copies then."""
        now = next(clock)
        refresher.poll(now)
        wait_for("the table read", lambda: refresher.poll(now), timeout_s=30)
        return Run.objects.get(pk=run.pk).references

    def refused() -> str:
        failed = Event.objects.filter(run=run, kind="reference_refresh_failed")
        event = failed.order_by("pk").last()
        return event.reason if event is not None else ""

    try:
        # When it is read unchanged, nothing changes; changed, it is the run's latest
        assert refreshed() == {}
        with psycopg.connect(reports) as conn:
            conn.execute("UPDATE airlines SET name = upper(name)")
        latest = refreshed()["enrich"]
        assert latest["version"] == 1 and (store() / latest["file"]).exists()
        assert Event.objects.filter(run=run, kind="reference_refreshed").count() == 1
        # ...but not once it lacks a column the join adds
        with psycopg.connect(reports) as conn:
            conn.execute("ALTER TABLE airlines DROP COLUMN name")
        assert refreshed()["enrich"] == latest
        assert "the reference table has no column 'name'" in refused()
        # ...nor once another pipeline's sink writes it (it is not even read)
        with psycopg.connect(reports) as conn:
            conn.execute("ALTER TABLE airlines ADD COLUMN name text")
        claim("other", {"sink": "postgres", "table": "airlines", "database": "reports"})
        refresher.poll(next(clock))
        assert "a join may not read another pipeline's sink" in refused()
        assert Run.objects.get(pk=run.pk).references["enrich"] == latest
    finally:
        refresher.close()
