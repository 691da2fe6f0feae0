"""Reading records (sparkjobs/records.py): which file a record came from, the segment
column of every reader named back to its segment in Python and in Spark alike; and a
field missing or null, null as in SQL but for the fields a stage requires."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from sparkjobs.records import (
    MALFORMED_COL,
    RAW_COL,
    SEGMENT_COL,
    file_name,
    parse_fields,
    read_records,
    read_rows,
    segment_of,
)
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
        read_records(
            spark,
            files,
            strings=["key", "user"],
            numbers=["value"],
            keys=["key"],
            required=["key", "value", "user"],
        ),
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


LINES = [
    '{"key": "a", "value": 1, "user": "u"}',
    '{"key": "b", "user": null}',
    '{"value": 2}',
    "not json",
]


@pytest.mark.parametrize(
    ("required", "malformed"),
    [
        pytest.param((), [False, False, False, True], id="none"),
        pytest.param(("key",), [False, False, True, True], id="key"),
        pytest.param(("key", "value", "user"), [False, True, True, True], id="all"),
    ],
)
def test_a_field_missing_or_null_is_null_but_a_required_one_makes_its_record_malformed(
    spark: Any, tmp_path: Path, required: tuple[str, ...], malformed: list[bool]
) -> None:
    # Given records missing a field or holding a null, and a line that is no record
    path = tmp_path / "seg-1.jsonl"
    path.write_text("".join(line + "\n" for line in LINES))
    fields: dict[str, Any] = {"strings": ["key", "user"], "numbers": ["value"], "keys": ["key"]}
    # When the reader reads them, requiring some fields
    read = read_records(spark, [str(path)], **fields, required=required).collect()
    # ...or a record operator's lines of them are parsed
    lines = spark.createDataFrame([(line,) for line in LINES], f"{RAW_COL} STRING")
    parsed = {r[RAW_COL]: r for r in parse_fields(lines, **fields, required=required).collect()}
    # Then the reader keeps the line it could not read, and none of a record it read
    (unread,) = [r for r in read if r[RAW_COL] is not None]
    assert unread[RAW_COL] == "not json"
    place = {"a": 0, "b": 1, None: 2}
    records = sorted((r for r in read if r[RAW_COL] is None), key=lambda r: place[r["key"]])
    # ...and, both ways, a field missing or null is null, and only a required one, or a
    # line that is no record, makes its record malformed
    for rows in ([*records, unread], [parsed[line] for line in LINES]):
        assert [(r["key"], r["value"], r["user"]) for r in rows] == [
            ("a", Decimal(1), "u"),
            ("b", None, None),
            (None, Decimal(2), None),
            (None, None, None),
        ]
        assert [r[MALFORMED_COL] for r in rows] == malformed
