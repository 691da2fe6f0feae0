"""Sink targets: a Parquet sink stays below its root and writes each window once,
however often a step is repeated after a crash; the databases a sink may name are the
admin's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from orchestrator.sink.layout import CellError, grouped_layout
from orchestrator.sink.targets import ClosedRow, ParquetFolder, SinkError, sink_of
from sparkjobs.catalog import validate_params
from sparkjobs.measures import Grouping
from tests.orchestrator.key_form import KEY_FORM
from webapp.settings.env import sink_databases

US = 1_000_000
# The key form's columns: key, count, sum, min, max, avg, distinct_users.
KEY_COLUMNS = grouped_layout(KEY_FORM, {})


def rows(start_s: int, keys: int) -> list[ClosedRow]:
    """Closed rows of the key form: key, count, sum, min, max, avg, distinct count."""
    return [
        ClosedRow(
            start_s * US,
            (start_s + 10) * US,
            KEY_COLUMNS.cells(
                [
                    f"k{i}",
                    i + 1,
                    Decimal("10.5") * (i + 1),
                    Decimal("0.25"),
                    Decimal("9.75"),
                    Decimal("10.5"),
                    i,
                ]
            ),
        )
        for i in range(keys)
    ]


def test_a_repeated_step_rewrites_the_same_window_and_lists_it_once(tmp_path: Path) -> None:
    with override_settings(BPCONSOLE_SINK_ROOT=tmp_path):
        sink = ParquetFolder("out/minutes", KEY_COLUMNS)
        sink.check()
        sink.write(7, rows(0, 3) + rows(10, 2))
        first = (tmp_path / "out/minutes/window-0.parquet").read_bytes()
        # A crash after the files but before the ledger's commit: the step again.
        sink.write(7, rows(10, 2) + rows(20, 1))
    folder = tmp_path / "out/minutes"
    manifest = json.loads((folder / "_manifest.json").read_text())["windows"]
    assert [(w["start_us"], w["rows"]) for w in manifest] == [(0, 3), (10 * US, 2), (20 * US, 1)]
    assert sorted(p.name for p in folder.iterdir()) == [
        "_manifest.json",
        "window-0.parquet",
        "window-10000000.parquet",
        "window-20000000.parquet",
    ]
    assert (folder / "window-0.parquet").read_bytes() == first
    table = pq.read_table(folder / "window-0.parquet")
    assert str(table.schema.field("sum").type) == "decimal128(38, 10)"
    assert str(table.schema.field("window_start").type) == "timestamp[us, tz=UTC]"
    assert table.column("avg").to_pylist() == [Decimal("10.5000000000")] * 3


def test_a_parquet_path_leaving_the_sink_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with override_settings(BPCONSOLE_SINK_ROOT=root):
        with pytest.raises(SinkError, match="leaves the sink root"):
            ParquetFolder("link/windows", KEY_COLUMNS).check()
        with pytest.raises(SinkError, match="leaves the sink root"):
            ParquetFolder("link", KEY_COLUMNS).write(1, rows(0, 1))
    assert list(outside.iterdir()) == []


def test_a_folder_swapped_for_a_link_inside_the_root_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    # Given a sink written once, then a folder of its path (not the last) replaced by a
    # link to another pipeline's folder inside the same root
    with override_settings(BPCONSOLE_SINK_ROOT=tmp_path):
        sink = ParquetFolder("team/minutes", KEY_COLUMNS)
        sink.check()
        sink.write(7, rows(0, 1))
        ParquetFolder("theirs/minutes", KEY_COLUMNS).write(8, rows(0, 2))
        theirs = {p.name: p.read_bytes() for p in (tmp_path / "theirs/minutes").iterdir()}
        (tmp_path / "team").rename(tmp_path / "team.old")
        (tmp_path / "team").symlink_to(tmp_path / "theirs", target_is_directory=True)
        # Then the next write and the next check are refused, naming the path and the link
        for step in (lambda: sink.write(7, rows(10, 1)), sink.check):
            with pytest.raises(SinkError) as refused:
                step()
            assert str(refused.value) == (
                "path 'team/minutes' leaves the sink root: team/minutes: 'team' is a symbolic "
                "link, which is never followed"
            )
    # And nothing of the other pipeline's folder changed
    assert {p.name: p.read_bytes() for p in (tmp_path / "theirs/minutes").iterdir()} == theirs


def test_a_folder_that_cannot_be_written_is_refused_with_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with (
        override_settings(BPCONSOLE_SINK_ROOT=tmp_path),
        pytest.raises(SinkError, match="cannot be written"),
    ):
        ParquetFolder("file/below", KEY_COLUMNS).check()


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"sink": "parquet", "path": "/etc"}, "below the sink root"),
        ({"sink": "parquet", "path": "a/../../b"}, "below the sink root"),
        ({"sink": "parquet", "path": "a\nb"}, "below the sink root"),
        ({"sink": "parquet"}, "path is required for sink parquet"),
        ({"sink": "postgres", "table": "Robert'); DROP TABLE x;--"}, "must be a table name"),
        ({"sink": "postgres", "table": "t" * 64}, "must be a table name"),
        ({"sink": "postgres"}, "table is required for sink postgres"),
        ({"sink": "postgres", "table": "t", "database": "postgresql://evil:5432/x"}, "field name"),
        ({"sink": "results", "table": "t"}, "table is not used by sink results"),
        ({"sink": "kafka"}, "must be one of results, postgres, parquet"),
    ],
)
def test_a_sink_node_names_only_what_it_may(params: dict[str, object], problem: str) -> None:
    found = validate_params("merge", "sink", params)
    assert any(problem in p for p in found), found


def test_only_the_admins_databases_and_the_console_s_own_may_be_named() -> None:
    named = sink_databases(
        ["reports=postgresql://u@db.internal/reports"], console="postgresql://c/x"
    )
    assert named == {"console": "postgresql://c/x", "reports": "postgresql://u@db.internal/reports"}
    with pytest.raises(ImproperlyConfigured, match="a name other than console"):
        sink_databases(["console=postgresql://elsewhere/x"], console="postgresql://c/x")
    with pytest.raises(ImproperlyConfigured):
        sink_databases(["reports=mysql://db/x"], console="postgresql://c/x")
    with (
        override_settings(BPCONSOLE_SINK_DATABASES={"console": "postgresql://c/x"}),
        pytest.raises(SinkError, match="database 'reports' is not configured"),
    ):
        sink_of({"sink": "postgres", "table": "t", "database": "reports"}, KEY_COLUMNS).check()


@pytest.fixture
def other_database(services: Any) -> Iterator[str]:
    """A second database on the test server, as an admin would name one."""
    server, _, _ = services.database_url.rpartition("/")
    name = f"sink_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(services.database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_a_table_in_another_database_is_created_typed_and_written_idempotently(
    other_database: str,
) -> None:
    named = {"console": "postgresql://unused/x", "reports": other_database}
    with override_settings(BPCONSOLE_SINK_DATABASES=named):
        sink = sink_of(
            {"sink": "postgres", "table": "per_minute", "database": "reports"}, KEY_COLUMNS
        )
        assert not sink.in_ledger_transaction  # committed before the ledger's
        sink.check()
        sink.write(5, rows(0, 3))
        # The ledger's commit was lost: the same step again writes the same rows.
        sink.write(5, rows(0, 3) + rows(10, 1))
    with psycopg.connect(other_database) as conn:
        table = conn.execute(
            "SELECT extract(epoch FROM window_start)::bigint, key, count, sum, avg,"
            " distinct_users, run_id FROM per_minute ORDER BY 1, 2"
        ).fetchall()
        log = conn.execute(
            "SELECT extract(epoch FROM window_start)::bigint, rows FROM per_minute_commits"
            " ORDER BY 1"
        ).fetchall()
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'per_minute'"
            ).fetchall()
        )
    assert table == [
        (0, "k0", 1, Decimal("10.5"), Decimal("10.5"), 0, 5),
        (0, "k1", 2, Decimal("21.0"), Decimal("10.5"), 1, 5),
        (0, "k2", 3, Decimal("31.5"), Decimal("10.5"), 2, 5),
        (10, "k0", 1, Decimal("10.5"), Decimal("10.5"), 0, 5),
    ]
    assert log == [(0, 3), (10, 1)]
    assert types["window_start"] == "timestamp with time zone"
    assert types["sum"] == "numeric"


# Per airline name and hour: flights, mean delay, 95th percentile of the delay.
GROUPED = grouped_layout(
    Grouping.of(
        {
            "group_by": ["name", "hour"],
            "measures": [
                {"name": "flights", "fn": "count"},
                {"name": "mean_delay", "fn": "avg", "field": "delay"},
                {"name": "p95", "fn": "approx_percentile", "field": "delay", "percentile": 0.95},
            ],
        }
    )
    or pytest.fail("a valid grouping"),
    {"hour": "long"},
)


def grouped_rows(start_s: int) -> list[ClosedRow]:
    """A window's groups as the ledger closes them: values as text, measures finished;
    a group with null values (a group of its own) and no delay among them."""
    values = [
        ["United", "5", 3, Decimal("12.3456789012345"), 40.0],
        ["United", "6", 1, Decimal("-2"), -2.0],
        [None, None, 2, None, None],
    ]
    return [ClosedRow(start_s * US, (start_s + 60) * US, GROUPED.cells(v)) for v in values]


def test_a_grouped_table_has_the_query_s_columns_and_types_and_a_rewrite_changes_nothing(
    other_database: str,
) -> None:
    named = {"console": "postgresql://unused/x", "reports": other_database}
    with override_settings(BPCONSOLE_SINK_DATABASES=named):
        sink = sink_of({"sink": "postgres", "table": "by_hour", "database": "reports"}, GROUPED)
        sink.check()
        sink.write(5, grouped_rows(0))
        # The ledger's commit was lost: the same window again, and the next one
        sink.write(5, grouped_rows(0) + grouped_rows(60))
    with psycopg.connect(other_database) as conn:
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'by_hour'"
            ).fetchall()
        )
        table = conn.execute(
            "SELECT extract(epoch FROM window_start)::bigint, name, hour, flights, mean_delay,"
            " p95 FROM by_hour ORDER BY 1, 2, 3"
        ).fetchall()
    assert types == {
        "window_start": "timestamp with time zone",
        "window_end": "timestamp with time zone",
        "name": "text",
        "hour": "bigint",
        "flights": "bigint",
        "mean_delay": "numeric",
        "p95": "double precision",
        "run_id": "bigint",
    }
    # Each (window, group) once, the null group included (its key treats nulls as equal)
    once = [
        ("United", 5, 3, Decimal("12.3456789012"), 40.0),
        ("United", 6, 1, Decimal("-2.0000000000"), -2.0),
        (None, None, 2, None, None),
    ]
    assert table == [(0, *r) for r in once] + [(60, *r) for r in once]


@pytest.mark.parametrize(
    ("existing", "says"),
    [
        (
            "window_start timestamptz, window_end timestamptz, name text, hour text, "
            "flights bigint, run_id bigint",
            "columns do not fit: hour (text; needs bigint), mean_delay (missing; needs numeric), "
            "p95 (missing; needs double precision)",
        ),
        (
            "window_start timestamptz, window_end timestamptz, name text, hour bigint, "
            "flights bigint, mean_delay numeric, p95 float8, run_id bigint, "
            "UNIQUE (window_start, name, hour)",
            "needs a unique key NULLS NOT DISTINCT on (window_start, name, hour)",
        ),
    ],
    ids=["columns", "key"],
)
def test_an_existing_table_that_does_not_fit_the_query_is_refused_and_left_alone(
    other_database: str, existing: str, says: str
) -> None:
    with psycopg.connect(other_database) as conn:
        conn.execute(f"CREATE TABLE by_hour ({existing})")
        before = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'by_hour'"
        ).fetchall()
    named = {"console": "postgresql://unused/x", "reports": other_database}
    with override_settings(BPCONSOLE_SINK_DATABASES=named), pytest.raises(SinkError) as raised:
        sink_of({"sink": "postgres", "table": "by_hour", "database": "reports"}, GROUPED).check()
    assert says in str(raised.value)
    with psycopg.connect(other_database) as conn:
        after = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'by_hour'"
        ).fetchall()
        commits = conn.execute("SELECT to_regclass('by_hour_commits')").fetchone()
    # Nothing was made: the refusal rolled back the commit log's table too
    assert after == before
    assert commits == (None,)


def test_grouped_parquet_files_have_the_query_s_columns(tmp_path: Path) -> None:
    with override_settings(BPCONSOLE_SINK_ROOT=tmp_path):
        sink = sink_of({"sink": "parquet", "path": "by_hour"}, GROUPED)
        sink.check()
        sink.write(3, grouped_rows(0))
    table = pq.read_table(tmp_path / "by_hour/window-0.parquet")
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("window_start", "timestamp[us, tz=UTC]"),
        ("window_end", "timestamp[us, tz=UTC]"),
        ("name", "string"),
        ("hour", "int64"),
        ("flights", "int64"),
        ("mean_delay", "decimal128(38, 10)"),
        ("p95", "double"),
        ("run_id", "int64"),
    ]
    # In key order, a null value first
    assert table.column("hour").to_pylist() == [None, 5, 6]


def test_a_group_value_its_column_s_type_cannot_hold_is_named() -> None:
    with pytest.raises(CellError, match="column hour: 'five' is not a bigint"):
        GROUPED.cells(["United", "five", 1, None, None])
