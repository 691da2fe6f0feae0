"""A schema proposed from the first records of an input file below the input roots
(orchestrator/pipeline/sample.py): read as a run reads its input, bounded whatever the
file holds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline.inputs import InputError
from orchestrator.pipeline.sample import MAX_SAMPLE_BYTES, MAX_SAMPLE_RECORDS, sample_schema


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    folder.mkdir()
    return folder


def _sample(root: Path, path: str, fmt: str = "jsonl"):  # type: ignore[no-untyped-def]
    return sample_schema(path, fmt, [root], follow_symlinks=False)


def test_json_lines_propose_their_fields_and_count_what_is_not_a_record(root: Path) -> None:
    (root / "events.jsonl").write_text(
        '{"key": "a", "value": 1.5, "user": "u1", "ts": "2026-12-05T08:00:00Z"}\n'
        "not json\n"
        "[1, 2]\n"
        '{"key": "b", "value": 2, "user": "u2", "ts": "2026-12-05T08:00:01Z"}\n'
    )
    sample = _sample(root, "events.jsonl")
    assert sample.proposal.ddl == "key string, value double, user string, ts timestamp"
    assert (sample.records, sample.malformed) == (2, 2)
    assert sample.file == str((root / "events.jsonl").resolve())


def test_a_glob_reads_its_first_file(root: Path) -> None:
    (root / "b.jsonl").write_text('{"b": 1}\n')
    (root / "a.jsonl").write_text('{"a": 1}\n')
    assert _sample(root, "*.jsonl").proposal.ddl == "a long"


def test_csv_proposes_types_from_the_text(root: Path) -> None:
    (root / "flights.csv").write_text("carrier,dep_delay,time_hour\nUA,2,2013-01-01 05:00:00\n")
    sample = _sample(root, "flights.csv", "csv")
    assert sample.proposal.ddl == "carrier string, dep_delay long, time_hour timestamp"


def test_parquet_proposes_what_its_footer_declares(root: Path) -> None:
    table = pa.table({"key": ["a"], "n": pa.array([1], pa.int32()), "tags": [[1, 2]], "v": [0.5]})
    pq.write_table(table, root / "t.parquet")
    sample = _sample(root, "t.parquet", "parquet")
    assert sample.proposal.ddl == "key string, n long, v double"
    assert sample.proposal.nested == ["tags"]


def test_a_file_larger_than_the_sample_is_read_only_to_its_bounds(root: Path) -> None:
    line = '{"key": "k", "value": 1}\n'
    with (root / "big.jsonl").open("w") as out:
        out.write(line * (MAX_SAMPLE_RECORDS * 3))
        out.write('{"late": "x"}\n')
    sample = _sample(root, "big.jsonl")
    assert sample.records == MAX_SAMPLE_RECORDS
    assert sample.proposal.ddl == "key string, value long"
    # One line longer than the sample is no record, not an unbounded read
    (root / "one.jsonl").write_text('{"key": "' + "x" * MAX_SAMPLE_BYTES + '"}\n')
    with pytest.raises(InputError) as refused:
        _sample(root, "one.jsonl")
    assert "no field to propose in its first 1024 KB" in str(refused.value)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/etc/passwd", "must lie under an input folder"),
        ("../outside.jsonl", "must lie under an input folder"),
        ("nothing-here.jsonl", "does not exist or is not a file"),
        ("*.ndjson", "no input file matches"),
        ("data.csv", "its name says CSV"),
    ],
)
def test_a_path_that_is_not_an_input_file_is_refused_saying_why(
    root: Path, path: str, says: str
) -> None:
    (root.parent / "outside.jsonl").write_text('{"secret": 1}\n')
    (root / "data.csv").write_text("a\n1\n")
    with pytest.raises(InputError) as refused:
        _sample(root, path)
    assert says in str(refused.value)
    assert "secret" not in str(refused.value)


def test_a_link_to_a_file_outside_the_roots_is_not_read(root: Path) -> None:
    (root.parent / "outside.jsonl").write_text('{"secret": 1}\n')
    (root / "link.jsonl").symlink_to(root.parent / "outside.jsonl")
    with pytest.raises(InputError):
        _sample(root, "link.jsonl")


def test_a_parquet_file_whose_footer_is_not_one_is_refused(root: Path) -> None:
    (root / "fake.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"\xff\xff\xff\x7fPAR1")
    with pytest.raises(InputError) as refused:
        _sample(root, "fake.parquet", "parquet")
    assert "footer is over" in str(refused.value)
