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
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

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
