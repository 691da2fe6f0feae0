"""The join operator on Spark (sparkjobs/reference.py): the table's columns after the
record's fields, inner or left, and a clear error for a column the table lacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkjobs.expression_guard import apply_record_step
from sparkjobs.reference import REFERENCE_PATH, ReferenceError

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
