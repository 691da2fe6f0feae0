"""The join operator on Spark (sparkjobs/reference.py): the table's columns after the
record's fields, inner or left, a clear error for a column the table lacks, and a
refreshed table's copies each joined by the records of the files bound to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkjobs.expression_guard import apply_record_step
from sparkjobs.records import SEGMENT_COL
from sparkjobs.reference import REFERENCE_BY_FILE, REFERENCE_PATH, ReferenceError

pytestmark = pytest.mark.spark


@pytest.fixture
def flights(spark: Any) -> Any:
    rows = [("UA", 1.0, "N1"), ("ZZ", 2.0, "N2"), ("AA", 3.0, "N3"), ("UA", 4.0, "N4")]
    return spark.createDataFrame(rows, "carrier string, delay double, tail string")


@pytest.fixture
def airlines(tmp_path: Path) -> dict[str, Any]:
    table = tmp_path / "airlines.parquet"
    columns = {
        "carrier": ["UA", "AA"],
        "name": ["United", "American"],
        "fleet": pa.array([900, 950], pa.int32()),
        "tail": ["T1", "T2"],
    }
    pq.write_table(pa.table(columns), table)
    return {"reference": "airlines.parquet", "on": ["carrier"], REFERENCE_PATH: str(table)}


def test_a_join_adds_the_table_s_columns_and_an_inner_one_drops_records_without_a_row(
    flights: Any, airlines: dict[str, Any]
) -> None:
    params = {**airlines, "columns": ["name", "fleet"]}
    inner = apply_record_step(flights, "join", params)
    assert inner.columns == ["carrier", "delay", "tail", "name", "fleet"]
    assert sorted(tuple(r) for r in inner.collect()) == [
        ("AA", 3.0, "N3", "American", 950),
        ("UA", 1.0, "N1", "United", 900),
        ("UA", 4.0, "N4", "United", 900),
    ]
    left = apply_record_step(flights, "join", {**params, "how": "left"})
    assert ("ZZ", 2.0, "N2", None, None) in [tuple(r) for r in left.collect()]
    assert left.count() == 4


@pytest.mark.parametrize(
    ("columns", "says"),
    [
        (["country"], "the reference table airlines.parquet has no column 'country'"),
        (["name", "tail"], "the records already have a field 'tail'"),
    ],
)
def test_a_join_the_table_cannot_give_says_why(
    flights: Any, airlines: dict[str, Any], columns: list[str], says: str
) -> None:
    with pytest.raises(ReferenceError, match=says):
        apply_record_step(flights, "join", {**airlines, "columns": columns})


def test_each_file_s_records_join_the_copy_of_the_table_it_is_bound_to(
    spark: Any, tmp_path: Path
) -> None:
    # Given the records of three files, and a table read three times: at the start,
    # then twice refreshed (the last copy with its column in another type)
    rows = [
        ("file:///in/a.jsonl", "UA", 1.0),
        ("file:///in/b.jsonl", "UA", 2.0),
        ("file:///in/c.jsonl", "UA", 3.0),
        ("file:///in/c.jsonl", "AA", 4.0),
    ]
    frame = spark.createDataFrame(rows, f"{SEGMENT_COL} string, carrier string, delay double")
    copies = {}
    for version, (names, fleet) in enumerate(
        [
            ({"UA": "United"}, pa.int32()),
            ({"UA": "UNITED"}, pa.int32()),
            ({"AA": "AMERICAN", "UA": "U"}, pa.int64()),
        ]
    ):
        copies[version] = str(tmp_path / f"v{version}.parquet")
        columns = {
            "carrier": list(names),
            "name": list(names.values()),
            "fleet": pa.array([1] * len(names), fleet),
        }
        pq.write_table(pa.table(columns), copies[version])
    params = {
        "reference": "airlines.parquet",
        "on": ["carrier"],
        "columns": ["name", "fleet"],
        REFERENCE_PATH: copies[0],
        REFERENCE_BY_FILE: {"b.jsonl": copies[1], "c.jsonl": copies[2]},
    }
    # When they are joined, the file each came from picking its copy
    joined = apply_record_step(frame, "join", params, keep=[SEGMENT_COL], origin=SEGMENT_COL)
    # Then each record has its own file's copy's row: a.jsonl the first, c.jsonl the last
    assert joined.columns == [SEGMENT_COL, "carrier", "delay", "name", "fleet"]
    assert sorted((r["delay"], r["name"], r["fleet"]) for r in joined.collect()) == [
        (1.0, "United", 1),
        (2.0, "UNITED", 1),
        (3.0, "U", 1),
        (4.0, "AMERICAN", 1),
    ]
