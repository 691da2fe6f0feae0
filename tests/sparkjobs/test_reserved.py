"""The columns the Spark jobs add beside a record's fields are names no field a pipeline
names may have (sparkjobs/reserved.py): such a field would make every batch fail on an
ambiguous name, or be read as the job's own column."""

from __future__ import annotations

import pytest

from sparkjobs import grouped, long_sums, measure_parts, records, windows
from sparkjobs.catalog import validate_params
from sparkjobs.measures import problems
from sparkjobs.reserved import RESERVED, reserved

pytestmark = pytest.mark.spark  # the jobs' modules import pyspark


def test_every_column_a_job_adds_is_reserved() -> None:
    added = {
        value
        for module in (records, grouped, measure_parts, windows, long_sums)
        for name, value in vars(module).items()
        if isinstance(value, str) and (name.endswith("_COL") or name in ("CORRUPT", "EXACT"))
    }
    assert added, "no column constant found"
    assert added <= RESERVED, added - RESERVED


@pytest.mark.parametrize(
    ("operator", "params", "says"),
    [
        ("aggregate", {"key": "_segment"}, "'_segment' is a name the console's Spark jobs use"),
        ("aggregate", {"value": "_Raw"}, "'_Raw' is a name"),
        ("join", {"reference": "t.csv", "on": ["_malformed"], "columns": ["n"]}, "'_malformed'"),
        ("project", {"columns": ["key", "value * 2 AS _segment"]}, "[1] '_segment' is a name"),
    ],
)
def test_a_parameter_naming_a_job_s_column_is_refused(
    operator: str, params: dict[str, object], says: str
) -> None:
    kind = "operator"
    assert any(says in p for p in validate_params(operator, kind, params))


def test_a_group_or_measure_field_naming_a_job_s_column_is_refused() -> None:
    found = problems(
        {
            "group_by": ["_group"],
            "measures": [{"name": "n", "fn": "sum", "field": "_m0"}],
        }
    )
    assert any(p.startswith("group_by[0]: '_group' is a name") for p in found), found
    assert any(p.startswith("measures[0].field: '_m0' is a name") for p in found), found
    assert reserved("_g1") is not None
    assert reserved("carrier") is None and reserved("_id") is None
