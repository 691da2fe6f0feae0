"""Grouped measures' partial states merge exactly (sparkjobs/measures.py): the records
of a stage split into any partials, merged in any order, give what one aggregation of
all of them gives, as SQL computes it (nulls left out of all but a count of records);
and a document's measures are checked saying which one is wrong."""

from __future__ import annotations

import base64
import math
import random
from decimal import Decimal
from typing import Any

import datasketches
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjobs.catalog import validate_params
from sparkjobs.key_form import as_measures
from sparkjobs.measures import FUNCTIONS, HLL_LG_K, KLL_K, Grouping, Measure, State, problems

FIELDS = ("a", "b", "c", "x", "y", "t")
PERCENTILE = 0.75
Record = dict[str, Any]


def _at_time(measure: Measure, records: list[Record]) -> tuple[int, str | None] | None:
    """The first (last) record's (time, value) by its time ``t``, at one time the
    smallest (largest) value, a null one smallest; records without a time left out."""
    timed = [(r["t"], r[measure.field or ""]) for r in records if r["t"] is not None]
    if not timed:
        return None
    key = lambda pair: (pair[0], pair[1] is not None, pair[1] or "")  # noqa: E731
    return min(timed, key=key) if measure.fn == "first" else max(timed, key=key)


def _state(measure: Measure, records: list[Record]) -> State:
    """A measure's partial state over ``records``, by its definition (the Spark job
    computes the same: sparkjobs/grouped.py)."""
    if measure.field is None:
        return len(records)
    if measure.fn in ("first", "last"):
        found = _at_time(measure, records)
        return None if found is None else [str(found[0]), found[1]]
    values = [r[measure.field] for r in records if r[measure.field] is not None]
    if measure.fn == "count":
        return len(values)
    if measure.fn == "count_distinct":
        return sorted({str(v) for v in values})
    if measure.fn == "approx_count_distinct":
        hll = datasketches.hll_sketch(HLL_LG_K, datasketches.tgt_hll_type.HLL_8)
        for v in values:
            hll.update(str(v))
        return base64.b64encode(hll.serialize_compact()).decode()
    if measure.fn == "approx_percentile":
        kll = datasketches.kll_doubles_sketch(KLL_K)
        for v in values:
            kll.update(float(Decimal(v)))
        return base64.b64encode(kll.serialize()).decode()
    numbers = [Decimal(v) for v in values]
    total = str(sum(numbers, Decimal(0))) if numbers else None
    if measure.fn == "sum":
        return total
    if measure.fn == "avg":
        return {"sum": total, "count": len(numbers)}
    if not numbers:
        return None
    return str(min(numbers) if measure.fn == "min" else max(numbers))


def _partials(grouping: Grouping, records: list[Record]) -> dict[tuple[Any, ...], dict[str, State]]:
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for record in records:
        groups.setdefault(tuple(record[f] for f in grouping.group_by), []).append(record)
    return {g: {m.name: _state(m, rs) for m in grouping.measures} for g, rs in groups.items()}


def _sql(grouping: Grouping, records: list[Record]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What SQL's GROUP BY gives, computed apart from the states."""
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for record in records:
        groups.setdefault(tuple(record[f] for f in grouping.group_by), []).append(record)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for group, rows in groups.items():
        values: dict[str, Any] = {}
        for m in grouping.measures:
            seen = [r[m.field] for r in rows if m.field and r[m.field] is not None]
            if m.field is None:
                values[m.name] = len(rows)
            elif m.fn in ("first", "last"):
                found = _at_time(m, rows)
                values[m.name] = None if found is None else found[1]
            elif m.fn == "count":
                values[m.name] = len(seen)
            elif m.fn in ("count_distinct", "approx_count_distinct"):
                # a sketch of so few values (at most 40) counts them exactly
                values[m.name] = len(set(map(str, seen)))
            elif m.fn == "approx_percentile" and seen:
                # ...and keeps every value: the quantile of the inclusive rank
                ordered = sorted(float(Decimal(v)) for v in seen)
                values[m.name] = ordered[math.ceil(PERCENTILE * len(ordered)) - 1]
            elif not seen:
                values[m.name] = None
            else:
                numbers = [Decimal(v) for v in seen]
                values[m.name] = {
                    "sum": sum(numbers, Decimal(0)),
                    "min": min(numbers),
                    "max": max(numbers),
                    "avg": sum(numbers, Decimal(0)) / Decimal(len(numbers)),
                }[m.fn]
        out[group] = values
    return out


def _values() -> st.SearchStrategy[str | None]:
    """Decimal text of DECIMAL(38,10)'s range, or null."""
    number = st.decimals(
        min_value=Decimal("-1e12"), max_value=Decimal("1e12"), places=10, allow_nan=False
    )
    return st.one_of(st.none(), number.map(str))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Grouping, list[Record], int, int]:
    group_by = tuple(draw(st.lists(st.sampled_from(FIELDS[:3]), max_size=3, unique=True)))
    picked = draw(
        st.lists(
            st.tuples(st.sampled_from(FUNCTIONS), st.sampled_from((None, "x", "y"))),
            min_size=1,
            max_size=6,
        )
    )
    measures = tuple(
        Measure(
            f"m{i}",
            fn,
            field if fn == "count" else field or "x",
            PERCENTILE if fn == "approx_percentile" else None,
            "t" if fn in ("first", "last") else None,
        )
        for i, (fn, field) in enumerate(picked)
    )
    text = st.one_of(st.none(), st.sampled_from(("p", "q", "r")))
    # few distinct times, so that records often share one
    time = st.one_of(st.none(), st.integers(0, 5))
    record = st.fixed_dictionaries(
        {"a": text, "b": text, "c": text, "x": _values(), "y": _values(), "t": time}
    )
    records = draw(st.lists(record, max_size=40))
    return Grouping(group_by, measures), records, draw(st.integers(1, 6)), draw(st.integers())


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_partials_of_any_split_merged_in_any_order_equal_one_aggregation(
    case: tuple[Grouping, list[Record], int, int],
) -> None:
    grouping, records, parts, seed = case
    shuffled = random.Random(seed)
    cuts = [records[i::parts] for i in range(parts)]  # records of a group in several parts
    partials = [p for cut in cuts for p in _partials(grouping, cut).items()]
    shuffled.shuffle(partials)

    merged: dict[tuple[Any, ...], dict[str, State]] = {}
    for group, states in partials:
        merged[group] = grouping.merge(merged[group], states) if group in merged else states

    # Exact states merge into the state of the whole; sketches into sketches of the
    # same values (their bytes may differ: a union keeps no insertion order)
    assert merged.keys() == _partials(grouping, records).keys()
    assert {g: grouping.finish(s) for g, s in merged.items()} == _sql(grouping, records)


def test_each_function_finishes_as_sql_computes_it() -> None:
    grouping = Grouping(
        ("a",),
        tuple(
            Measure(f"m{i}", fn, "x", PERCENTILE, "t" if fn in ("first", "last") else None)
            for i, fn in enumerate(FUNCTIONS)
        ),
    )
    records = [
        {"a": "p", "x": "2.5", "t": 7},
        {"a": "p", "x": None, "t": 3},
        {"a": "p", "x": "-1", "t": None},
    ]
    states = _partials(grouping, records)[("p",)]
    assert grouping.finish(states) == {
        "m0": 2,
        "m1": Decimal("1.5"),
        "m2": Decimal("-1"),
        "m3": Decimal("2.5"),
        "m4": Decimal("0.75"),
        "m5": 2,
        "m6": 2,
        "m7": 2.5,
        "m8": None,  # the first by time: a null value, at time 3
        "m9": "2.5",  # the last by time, as its text; a record with no time is in neither
    }


GOOD: dict[str, Any] = {
    "group_by": ["carrier", "origin"],
    "measures": [
        {"name": "flights", "fn": "count"},
        {"name": "mean_delay", "fn": "avg", "field": "dep_delay"},
        {"name": "tails", "fn": "count_distinct", "field": "tailnum"},
    ],
}


def test_a_grouping_reads_its_fields_as_their_functions_need() -> None:
    grouping = Grouping.of(GOOD)
    assert grouping is not None
    assert grouping.strings == ["carrier", "origin", "tailnum"]
    assert grouping.numbers == ["dep_delay"]
    assert grouping.required == ()  # none: a missing or null field is null, as in SQL
    # The key form is read as the measures it means (sparkjobs/key_form.py); parameters
    # that name no measures are no grouping
    assert Grouping.of({"key": "k"}) == Grouping.of(as_measures({"key": "k"}))
    assert Grouping.of({"group_by": ["k"]}) is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"key": "carrier"}, "key and measures are two ways to say what to compute"),
        ({"measures": []}, "measures must be a list of 1 to 32 measures"),
        ({"measures": [{"name": "n", "fn": "median", "field": "x"}]}, "measures[0].fn must be"),
        ({"measures": [{"name": "1n", "fn": "count"}]}, "measures[0].name must be an identifier"),
        ({"measures": [{"name": "origin", "fn": "count"}]}, "'origin' is also a group_by field"),
        (
            {"measures": [{"name": "n", "fn": "count"}, {"name": "N", "fn": "count"}]},
            "measures[1].name 'N' names two measures",
        ),
        ({"measures": [{"name": "s", "fn": "sum"}]}, "measures[0]: sum needs a field"),
        ({"measures": [{"name": "s", "fn": "sum", "field": "x", "as": 1}]}, "unknown key(s) as"),
        ({"measures": ["count(*)"]}, "measures[0] must be a mapping"),
        (
            {"measures": [{"name": "p", "fn": "approx_percentile", "field": "x"}]},
            "measures[0].percentile must be a number in (0, 1]",
        ),
        (
            {
                "measures": [
                    {"name": "p", "fn": "approx_percentile", "field": "x", "percentile": 95}
                ]
            },
            "measures[0].percentile must be a number in (0, 1], e.g. 0.95; got 95",
        ),
        (
            {"measures": [{"name": "n", "fn": "count", "percentile": 0.5}]},
            "measures[0].percentile is for approx_percentile only",
        ),
        ({"group_by": ["a", "A"]}, "group_by names a field twice"),
        (
            {"measures": [{"name": "f", "fn": "first", "field": "x"}]},
            "measures[0].by must name the event time field it is first by",
        ),
        (
            {"measures": [{"name": "n", "fn": "count", "by": "t"}]},
            "measures[0].by is for first and last only",
        ),
        (
            {"measures": [{"name": "f", "fn": "last", "field": "x", "by": "_segment"}]},
            "measures[0].by: '_segment' is a name the console's Spark jobs use",
        ),
        ({"group_by": ["a", "upper(b) AS A"]}, "group_by names a field twice"),
        ({"group_by": ["hour(t)"]}, "group_by[0] must be a field name, or an expression named"),
        ({"group_by": ["hour(t) AS _segment"]}, "group_by[0] "),
        ({"group_by": ["reflect('java.lang.Runtime', 'x') AS r"]}, "group_by[0] "),
        ({"group_by": ["hour(t AS h"]}, "group_by[0] "),
        (
            {"group_by": ["hour(t) AS origin"], "measures": [{"name": "origin", "fn": "count"}]},
            "measures[0].name 'origin' is also a group_by field",
        ),
        ({"group_by": ["a b"]}, "group_by[0] must be a field name, or an expression named with AS"),
        ({"group_by": [f"f{i}" for i in range(17)]}, "group_by must be a list of at most 16"),
        (
            {"measures": [{"name": "s", "fn": "sum", "field": "origin"}]},
            "group_by field(s) origin also read as numbers",
        ),
        ({"required": "carrier"}, "required must be a list of at most 64 field names"),
        ({"required": ["carrier", 3]}, "required must be a list of at most 64 field names"),
        ({"required": ["no such"]}, "required must be a list of at most 64 field names"),
        ({"required": ["carrier"] * 65}, "required must be a list of at most 64 field names"),
        ({"required": ["_Segment"]}, "required[0]: '_Segment' is a name the console's Spark"),
        (
            {"group_by": ["carrier", "hour(dep_time) AS dep_hour"], "required": ["dep_hour"]},
            "required[0]: 'dep_hour' is computed by group_by, not a field of the records",
        ),
    ],
)
def test_a_bad_measure_is_refused_saying_which(change: dict[str, Any], says: str) -> None:
    found = problems({**GOOD, **change})
    assert any(says in p for p in found), found


@pytest.mark.parametrize("keying", ["local_global", "key_groups"])
def test_a_running_stage_takes_the_same_measures_and_refuses_the_same_mistakes(
    keying: str,
) -> None:
    assert validate_params("running", "operator", {**GOOD, "keying": keying}) == []
    found = validate_params("running", "operator", {**GOOD, "keying": keying, "value": "x"})
    assert any("value and measures are two ways to say what to compute" in p for p in found)
    named = {**GOOD, "measures": [{"name": "origin", "fn": "count"}]}
    assert any("also a group_by field" in p for p in validate_params("running", "operator", named))


def test_a_stage_may_require_any_field_of_the_records_and_nothing_without_measures() -> None:
    # Its group fields, the fields its measures read, the times they are taken by, and a
    # field it reads only to require it (as text)
    params = {
        **GOOD,
        "measures": [*GOOD["measures"], {"name": "f", "fn": "first", "field": "gate", "by": "t"}],
        "required": ["carrier", "dep_delay", "tailnum", "gate", "t", "flight"],
    }
    assert problems(params) == []
    grouping = Grouping.of(params)
    assert grouping is not None
    assert grouping.required == ("carrier", "dep_delay", "tailnum", "gate", "t", "flight")
    assert "flight" in grouping.strings
    assert problems({"required": ["carrier"]}) == ["required given without measures"]
    assert problems({"group_by": ["a"], "required": ["a"]}) == [
        "group_by and required given without measures"
    ]


def test_a_group_field_may_be_computed_from_the_record_by_an_admitted_expression() -> None:
    params = {**GOOD, "group_by": ["carrier", "hour(dep_time) AS dep_hour"]}
    assert problems(params) == []
    grouping = Grouping.of(params)
    assert grouping is not None
    assert grouping.group_by == ("carrier", "dep_hour")
    assert grouping.computing == {"dep_hour": "hour(dep_time) AS dep_hour"}
    assert "dep_hour" in grouping.strings  # read as the expression's value, as text


def test_a_hostile_measures_list_is_checked_in_linear_time() -> None:
    huge = {"group_by": ["a"], "measures": [{"name": "n", "fn": "count"}] * 100_000}
    assert problems(huge) == ["measures must be a list of 1 to 32 measures"]
