"""Which file a record came from: the segment column of every reader, named back to its
segment in Python and in Spark alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from sparkjobs.records import SEGMENT_COL, file_name, read_records, read_rows, segment_of
from sparkjobs.session import in_one_task

pytestmark = pytest.mark.spark


def test_a_segment_is_its_file_name_without_the_extension_from_a_name_or_a_url() -> None:
    assert segment_of("seg-000123.jsonl") == "seg-000123"
    assert segment_of("file:///var/runs/7/segments/agg1/seg-000123.csv") == "seg-000123"
    assert segment_of("file:/var/runs/7/seg-9.parquet") == "seg-9"
    assert segment_of("seg-9") == "seg-9"


def _segments(tmp_path: Path) -> dict[str, Path]:
    jsonl = tmp_path / "seg-1.jsonl"
    jsonl.write_text('{"key": "a", "value": 1, "user": "u"}\nnot json\n')
    csv = tmp_path / "seg-2.csv"
    csv.write_text("key,value,user\nb,2,u\nc,x,u\n")
    parquet = tmp_path / "seg-3.parquet"
    table = pa.table({"key": ["d", None], "value": ["3", "4"], "user": ["u", "u"]})
    pq.write_table(table, parquet)
    return {"seg-1": jsonl, "seg-2": csv, "seg-3": parquet}


@pytest.mark.parametrize("one_task", [False, True], ids=["in parallel", "in one task"])
def test_every_record_good_or_malformed_names_the_segment_it_came_from(
    spark: Any, tmp_path: Path, one_task: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch read in one task (coalesced) reads its files one after the other in that
    # task: each record still names its own.
    monkeypatch.setenv("BPCONSOLE_SPARK_ONE_TASK_MB", "1024" if one_task else "0")
    segments = _segments(tmp_path)
    files = [str(p) for p in segments.values()]
    frame = in_one_task(
        read_records(spark, files, strings=["key", "user"], numbers=["value"], keys=["key"]),
        segments.values(),
    )
    rows = frame.select(SEGMENT_COL, "key", "_malformed", file_name(F.col(SEGMENT_COL))).collect()
    named = {(segment_of(r[0]), r["key"], r["_malformed"]) for r in rows}
    assert named == {
        ("seg-1", None, True),
        ("seg-1", "a", False),
        ("seg-2", "b", False),
        ("seg-2", "c", True),
        ("seg-3", None, True),
        ("seg-3", "d", False),
    }
    assert len(rows) == len(named)
    # In Spark, the column's file name is the segment's file name, to look it up by.
    assert {r[3] for r in rows} == {p.name for p in segments.values()}


def test_a_record_operators_rows_name_their_segment_too(spark: Any, tmp_path: Path) -> None:
    segments = _segments(tmp_path)
    rows = read_rows(spark, [str(p) for p in segments.values()]).select(SEGMENT_COL).collect()
    assert sorted(segment_of(r[0]) for r in rows) == [
        "seg-1",
        "seg-1",
        "seg-2",
        "seg-2",
        "seg-3",
        "seg-3",
    ]
