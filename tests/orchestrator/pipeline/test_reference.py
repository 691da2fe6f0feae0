"""A join's reference table is copied when a run starts, from below the input folders
only, bounded, content-addressed and its owner's only (orchestrator/pipeline/reference.py)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline.inputs import InputError
from orchestrator.pipeline.reference import (
    columns_of,
    job_params,
    snapshot,
    snapshot_tables,
    store,
)
from sparkjobs.reference import REFERENCE_PATH
from tests.orchestrator.run.scenarios import input_folder, joined_flights

AIRLINES = b"carrier,name\nUA,United Air Lines Inc.\nAA,American Airlines Inc.\n"


@pytest.fixture
def roots(settings: Any, tmp_path: Path) -> Path:
    root = input_folder(settings, tmp_path)
    (root / "airlines.csv").write_bytes(AIRLINES)
    return root


def test_a_table_below_an_input_folder_is_copied_by_its_digest_its_owner_s_only(
    roots: Path,
) -> None:
    name = snapshot("airlines.csv")

    assert name == hashlib.sha256(AIRLINES).hexdigest() + ".csv"
    copy = store() / name
    assert copy.read_bytes() == AIRLINES
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert stat.S_IMODE(store().stat().st_mode) == 0o700
    # The same table again: the same copy, nothing left aside
    assert snapshot("airlines.csv") == name
    assert [p.name for p in store().iterdir()] == [name]


def test_a_run_s_graph_names_its_snapshot_and_a_changed_table_is_another(roots: Path) -> None:
    graph = snapshot_tables(joined_flights())
    (joined,) = [n for n in graph["nodes"] if n["name"] == "enrich"]
    first = joined["reference_file"]
    assert job_params(joined)[REFERENCE_PATH] == str(store() / first)

    (roots / "airlines.csv").write_bytes(AIRLINES + b"DL,Delta Air Lines Inc.\n")
    # The run's graph keeps its copy; a pipeline that never ran reads the table as it is
    assert job_params(joined)[REFERENCE_PATH] == str(store() / first)
    now = job_params(joined_flights()["nodes"][1])[REFERENCE_PATH]
    assert now != str(store() / first)
    assert (store() / first).read_bytes() == AIRLINES


@pytest.mark.parametrize(
    ("make", "reference", "says"),
    [
        (None, "missing.csv", "does not exist or is not a file"),
        ("outside", "{tmp}/secret.csv", "must lie under an input folder"),
        ("link", "link.csv", "link"),
        ("big", "big.csv", "is over 1 MB (BPCONSOLE_REFERENCE_MAX_MB)"),
        ("folder", "tables.csv", "not a file"),
    ],
)
def test_a_table_that_cannot_be_taken_is_refused_saying_why_and_nothing_is_kept(
    roots: Path, settings: Any, make: str | None, reference: str, says: str
) -> None:
    settings.BPCONSOLE_REFERENCE_MAX_MB = 1
    secret = roots.parent / "secret.csv"
    secret.write_text("carrier,name\nXX,secret\n")
    if make == "link":
        (roots / "link.csv").symlink_to(secret)
    elif make == "big":
        (roots / "big.csv").write_bytes(b"carrier,name\n" + b"UA,x\n" * 300_000)
    elif make == "folder":
        (roots / "tables.csv").mkdir()

    with pytest.raises(InputError) as refused:
        snapshot(reference.format(tmp=roots.parent))

    assert says in str(refused.value)
    assert "XX" not in str(refused.value)
    assert not store().exists() or not any(store().iterdir())


def test_a_run_whose_table_cannot_be_taken_names_the_join_node(roots: Path) -> None:
    with pytest.raises(InputError, match=r"^node enrich: .*'missing\.csv'"):
        snapshot_tables(joined_flights(reference="missing.csv"))


def test_another_local_user_cannot_read_a_snapshot(roots: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("reading as a second Unix user needs root to switch to it")
    copy = store() / snapshot("airlines.csv")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat"]
    tried = subprocess.run([*as_nobody, str(copy)], capture_output=True, timeout=30, check=False)
    assert tried.returncode != 0
    assert b"United" not in tried.stdout


@pytest.mark.parametrize(
    ("name", "body", "columns"),
    [
        # CSV: every column text, as the job reads it
        ("t.csv", b"carrier,fleet\nUA,900\n", [("carrier", "string"), ("fleet", "string")]),
        # JSON lines: JSON's types; a date in a string stays a string
        (
            "t.jsonl",
            b'{"carrier": 19, "since": "1931-04-06", "share": 0.25}\n',
            [("carrier", "long"), ("since", "string"), ("share", "double")],
        ),
    ],
)
def test_a_file_s_columns_are_read_as_its_job_reads_them(
    roots: Path, name: str, body: bytes, columns: list[tuple[str, str]]
) -> None:
    (roots / name).write_bytes(body)
    found = columns_of({"reference": name})
    assert found is not None
    assert [(f.name, f.type) for f in found.fields] == columns


def test_a_parquet_file_s_columns_are_its_own(roots: Path) -> None:
    pq.write_table(
        pa.table({"carrier": ["UA"], "fleet": pa.array([900], pa.int32())}), roots / "t.parquet"
    )
    found = columns_of({"reference": "t.parquet"})
    assert found is not None
    assert [(f.name, f.type) for f in found.fields] == [("carrier", "string"), ("fleet", "long")]


def test_a_file_with_no_row_tells_no_columns(roots: Path) -> None:
    (roots / "empty.csv").write_bytes(b"carrier,name\n")
    assert columns_of({"reference": "empty.csv"}) is None
