"""The key form of an aggregating stage (key, value, distinct and aggregates) read as the
grouped measures it means (sparkjobs/key_form.py): ``group_by: [key]``, one measure per
aggregate named as the form's results always were, and its fields required. Pure
Python: the console reads a stage this way without a JVM."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkjobs.catalog import validate_params
from sparkjobs.key_form import AGGREGATES, as_measures, is_key_form
from sparkjobs.measures import Grouping, Measure, problems

EVERY_MEASURE = [
    {"name": "count", "fn": "count"},
    {"name": "sum", "fn": "sum", "field": "value"},
    {"name": "min", "fn": "min", "field": "value"},
    {"name": "max", "fn": "max", "field": "value"},
    {"name": "avg", "fn": "avg", "field": "value"},
    {"name": "distinct_users", "fn": "count_distinct", "field": "user"},
]


def test_no_parameters_are_the_reference_pipeline_s_key_value_and_user() -> None:
    assert as_measures({}) == {
        "group_by": ["key"],
        "measures": EVERY_MEASURE,
        "required": ["key", "value", "user"],
    }
    grouping = Grouping.of({})
    assert grouping is not None
    assert grouping.group_by == ("key",)
    assert grouping.required == ("key", "value", "user")
    assert grouping.strings == ["key", "user"]
    assert grouping.numbers == ["value"]
    assert grouping.computed == ()


def test_the_form_s_fields_name_what_each_measure_reads_and_the_others_are_kept() -> None:
    # Given a stage of the form naming its own fields, over windows
    params = {
        "key": "carrier",
        "value": "dep_delay",
        "distinct": "tailnum",
        "window_s": 60,
        "event_time": "t",
    }
    read = as_measures(params)
    # Then the measures read them, under the form's names, and its other parameters stay
    assert read == {
        "window_s": 60,
        "event_time": "t",
        "group_by": ["carrier"],
        "measures": [
            {"name": "count", "fn": "count"},
            {"name": "sum", "fn": "sum", "field": "dep_delay"},
            {"name": "min", "fn": "min", "field": "dep_delay"},
            {"name": "max", "fn": "max", "field": "dep_delay"},
            {"name": "avg", "fn": "avg", "field": "dep_delay"},
            {"name": "distinct_users", "fn": "count_distinct", "field": "tailnum"},
        ],
        "required": ["carrier", "dep_delay", "tailnum"],
    }
    assert problems(params) == []
    # ...and the form's parameters are not left beside the measures they became
    assert not {"key", "value", "distinct", "aggregates"} & read.keys()


def test_an_aggregates_subset_makes_those_measures_in_the_form_s_order() -> None:
    read = as_measures({"aggregates": ["avg", "count_distinct", "count"]})
    assert read["group_by"] == ["key"]
    assert read["measures"] == [
        {"name": "count", "fn": "count"},
        {"name": "avg", "fn": "avg", "field": "value"},
        {"name": "distinct_users", "fn": "count_distinct", "field": "user"},
    ]
    assert as_measures({"aggregates": ["count"]})["measures"] == [{"name": "count", "fn": "count"}]


@pytest.mark.parametrize("aggregates", [["count"], ["count", "sum", "max"], ["count_distinct"]])
def test_a_stage_of_the_form_computing_some_of_its_aggregates_is_valid(
    aggregates: list[str],
) -> None:
    # The catalog's own documentation of the form offers any non-empty subset
    assert validate_params("aggregate", "operator", {"aggregates": aggregates}) == []


def test_a_field_named_twice_is_required_once() -> None:
    read = as_measures({"key": "k", "value": "v", "distinct": "k"})
    assert read["required"] == ["k", "v"]
    grouping = Grouping.of(read)
    assert grouping is not None and grouping.required == ("k", "v")
    assert problems({"key": "k", "value": "v", "distinct": "k"}) == []


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(
            {"group_by": ["key"], "measures": [{"name": "n", "fn": "count"}]}, id="measures"
        ),
        pytest.param({"statement": "SELECT key, count(*) AS n FROM input GROUP BY key"}, id="sql"),
        pytest.param({"required": ["key"]}, id="required alone"),
        pytest.param({"group_by": ["key"]}, id="group_by alone"),
        pytest.param(
            {"key": "k", "measures": [{"name": "n", "fn": "count"}]}, id="both forms at once"
        ),
    ],
)
def test_parameters_of_another_form_are_left_as_given(params: dict[str, Any]) -> None:
    assert not is_key_form(params)
    assert as_measures(params) == params
    assert as_measures(params) is not params  # a copy: the caller's stays its own


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"key": 3}, "parameter 'key' "),
        ({"value": ["v"]}, "parameter 'value' "),
        ({"distinct": None}, "parameter 'distinct' "),
        ({"aggregates": ["count", "median"]}, "unknown aggregate(s) median"),
        ({"aggregates": "count"}, "parameter 'aggregates' must be a non-empty list"),
    ],
)
def test_an_invalid_value_of_the_form_is_left_for_the_catalog_to_refuse(
    params: dict[str, Any], says: str
) -> None:
    # Given a value of the wrong kind: the form is not read into measures it cannot make
    assert as_measures(params) == params
    assert Grouping.of(params) is None
    # ...and the catalog says what is wrong with it
    found = validate_params("aggregate", "operator", params)
    assert any(says in p for p in found), found


def test_an_empty_aggregates_list_is_refused() -> None:
    found = validate_params("aggregate", "operator", {"aggregates": []})
    assert any("parameter 'aggregates' must be a non-empty list" in p for p in found), found


def test_a_stage_of_the_form_is_the_grouping_of_the_measures_it_means() -> None:
    params = {
        "key": "k",
        "value": "v",
        "distinct": "d",
        "aggregates": ["count_distinct", "sum", "max"],
    }
    assert Grouping.of(params) == Grouping.of(as_measures(params))
    assert Grouping.of(params) == Grouping(
        group_by=("k",),
        measures=(
            Measure("sum", "sum", "v"),
            Measure("max", "max", "v"),
            Measure("distinct_users", "count_distinct", "d"),
        ),
        required=("k", "v", "d"),
    )


names = st.sampled_from(["key", "value", "user", "carrier", "dep_delay", "tailnum", "k"])


@given(
    fields=st.fixed_dictionaries({}, optional={"key": names, "value": names, "distinct": names}),
    aggregates=st.none() | st.lists(st.sampled_from(list(AGGREGATES)), min_size=1, unique=True),
)
def test_any_stage_of_the_form_reads_as_measures_once_and_for_all(
    fields: dict[str, str], aggregates: list[str] | None
) -> None:
    params: dict[str, Any] = dict(fields)
    if aggregates is not None:
        params["aggregates"] = aggregates
    read = as_measures(params)
    # Read once, the measures are of another form: reading them again changes nothing
    assert not is_key_form(read)
    assert as_measures(read) == read
    # One measure per aggregate wanted, in the form's order, under its name
    wanted = aggregates or list(AGGREGATES)
    assert [m["name"] for m in read["measures"]] == [
        name for aggregate, (name, _) in AGGREGATES.items() if aggregate in wanted
    ]
    # Grouped by the key (required first), each field a measure reads required
    key = fields.get("key", "key")
    named = [key, fields.get("value", "value"), fields.get("distinct", "user")]
    assert read["group_by"] == [key]
    assert read["required"][0] == key
    grouping = Grouping.of(params)
    assert grouping is not None
    assert set(grouping.fields) <= set(read["required"]) <= set(named)
    assert len(read["required"]) == len(set(read["required"]))
    if aggregates is None:
        assert read["required"] == list(dict.fromkeys(named))
        # Every aggregate valid, unless the key is also the number measured (refused in
        # any form: group by a copy)
        said = problems(params)
        if key == fields.get("value", "value"):
            assert any("also read as numbers" in p for p in said), said
        else:
            assert said == []
