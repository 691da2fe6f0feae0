"""The source reads CSV and Parquet as well as JSON lines, with the same exact result, and
a folder of whole files in place, leaving them as they were."""

from __future__ import annotations

import csv
import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.ledger import retention
from orchestrator.ledger.results import summary
from orchestrator.models import ResultGroup
from orchestrator.run.lifecycle import create_run
from orchestrator.tasks import start_run
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import (
    policy,
    skewed_reference,
    start,
    wait_started,
    wait_until_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def records(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "key": f"k{rng.randrange(12)}",
            "value": rng.randrange(100_000) / 100,
            "user": f"u{rng.randrange(50)}",
        }
        for _ in range(count)
    ]


def with_format(fmt: str) -> dict:
    doc = skewed_reference()
    doc["nodes"][0]["params"]["format"] = fmt
    return doc


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_inputs_give_the_batch_result(workers, tmp_path: Path, fmt: str) -> None:
    rows = records(30_000, seed=4)
    if fmt == "csv":
        path = tmp_path / "input.csv"
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["key", "value", "user"])
            writer.writeheader()
            writer.writerows(rows)
            handle.write("broken,line\n")  # one malformed row
    else:
        path = tmp_path / "input.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5_000)
    doc = with_format(fmt)
    run = wait_until_done(start(doc, policy(), input_path=str(path)))
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=str(path), generator=None)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["segments"] > 1
    assert result["malformed_records"] == expected["malformed_records"]
    assert result["rows"] == expected["rows"]
    assert sum(r["count"] for r in result["rows"]) == 30_000


def test_a_folder_of_whole_files_read_in_place_gives_the_batch_result_and_is_left_as_it_was(
    workers, tmp_path: Path
) -> None:
    # Given twelve files, each smaller than a segment (read in place), one of them with a
    # malformed line, and one larger file (cut and copied)
    rows = records(24_000, seed=9)
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(12):
        lines = [json.dumps(r) + "\n" for r in rows[n * 1_000 : (n + 1) * 1_000]]
        if n == 5:
            lines.insert(500, '{"key": "k1", "value": "not a number"}\n')
        (folder / f"part-{n:02d}.jsonl").write_text("".join(lines))
    (folder / "large.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[12_000:]))
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    doc = skewed_reference()
    doc["nodes"][0]["params"]["segment_mb"] = 0.25
    # When a run reads them and its files are cleaned after it ended
    run = wait_until_done(start(doc, policy(), input_path=str(folder / "*.jsonl")))
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=str(folder / "*.jsonl"), generator=None)
    retention.clean_finished(run.pk)
    # Then it is exact, equal to the plain job, and every input file is as it was
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["rows"] == expected["rows"]
    assert result["malformed_records"] == expected["malformed_records"] == 1
    assert sum(r["count"] for r in result["rows"]) == 24_000
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()} == before
    assert all(p.stat().st_nlink == 1 for p in folder.iterdir())


@pytest.mark.parametrize("change", ["deleted", "swapped for a link"])
def test_a_run_whose_input_file_changed_before_it_started_fails_saying_which(
    workers, tmp_path: Path, change: str
) -> None:
    # Given a run over two files, the second deleted, or replaced by a link to a file
    # the run was not given, after the run was created
    for n in range(2):
        rows = records(500, seed=n)
        (tmp_path / f"part-{n}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = create_run(
        topology=skewed_reference(), policy=policy(), input_path=str(tmp_path / "*.jsonl")
    )
    (tmp_path / "part-1.jsonl").unlink()
    if change == "swapped for a link":
        (tmp_path / "secret.txt").write_text('{"key": "secret", "value": 1, "user": "x"}\n')
        (tmp_path / "part-1.jsonl").symlink_to(tmp_path / "secret.txt")
    # When it runs, then it fails with the file and why, instead of retrying forever,
    # and nothing of the other file was read
    start_run(run)
    run = wait_until_done(run, timeout_s=60)
    assert run.status == "failed"
    assert "part-1.jsonl changed since it was measured" in run.error
    assert run.error.startswith("the input could not be read")
    assert not ResultGroup.objects.filter(run=run, group=["secret"]).exists()


def test_a_file_deleted_while_the_run_reads_it_fails_the_run_saying_which(
    workers, tmp_path: Path
) -> None:
    # Given a run over three files of 2.4 MB whose branches take 1 MB/s each into pools
    # of 0.5 MB: the source cannot be more than 1.5 MB ahead of what they took, so the
    # third file, from 4.8 MB on, is not read for at least a second
    for n in range(3):
        rows = records(40_000, seed=n)
        (tmp_path / f"part-{n}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = skewed_reference(slow_mbps=1.0)
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["max_rate_mbps"] = 1.0
    run = start(doc, policy(), input_path=str(tmp_path / "*.jsonl"))
    # When it goes once the run has finished its first batch
    wait_started(run)
    (tmp_path / "part-2.jsonl").unlink()
    # Then the run fails, naming the file
    run = wait_until_done(run, timeout_s=120)
    assert run.status == "failed"
    assert "part-2.jsonl changed since it was measured" in run.error
