"""A source's declared fields, what each operator writes from what it reads, and the
field problems of its parameters (sparkjobs/schemas.py): pure, no JVM."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkjobs import expressions
from sparkjobs.schemas import MAX_FIELDS, Field, Schema, declared, infer, output, propose

RECORDS = Schema(
    [
        Field("key", "string"),
        Field("value", "double"),
        Field("user", "string"),
        Field("qty", "long"),
        Field("ok", "boolean"),
        Field("ts", "timestamp"),
    ]
)


def _types(schema: Schema) -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in schema.fields]


def test_a_declared_schema_is_read_in_order_as_spark_writes_it_in_ddl() -> None:
    schema, problems = declared("key string, value DOUBLE,user: string")
    assert problems == []
    assert schema is not None
    assert _types(schema) == [("key", "string"), ("value", "double"), ("user", "string")]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"key": "string"}, "must list the fields and their types"),
        ("", "at least one field"),
        ("key text", "type 'text'; use one of string, long"),
        ("key", "field 1 ('key'): write a name and a type"),
        ("key string, value", "field 2 ('value'): write a name and a type"),
        ("ke-y string", "'ke-y' is not a field name"),
        ("key string, KEY long", "KEY: declared twice"),
        (", ".join(f"f{i} long" for i in range(MAX_FIELDS + 1)), f"at most {MAX_FIELDS} fields"),
        ("k string" * 10_000, "longer than"),
    ],
)
def test_a_bad_declaration_says_which_field_and_why(value: object, says: str) -> None:
    schema, problems = declared(value)
    assert schema is None
    assert any(says in p for p in problems), problems


def test_a_misspelt_grouping_field_is_refused_with_the_closest_field() -> None:
    _, problems = output("aggregate", {"key": "kye", "value": "value", "distinct": "user"}, RECORDS)
    assert [(p.param, p.message) for p in problems] == [
        (
            "key",
            "unknown field 'kye' (did you mean 'key'?); the input has key, value, user, qty, "
            "ok, ts",
        )
    ]


def test_an_aggregate_writes_its_key_and_the_aggregates_it_computes() -> None:
    written, problems = output(
        "aggregate",
        {"key": "KEY", "value": "qty", "distinct": "user", "aggregates": ["count", "max", "avg"]},
        RECORDS,
    )
    assert problems == []
    # The key under its declared name (fields resolve whatever their case), then the
    # measures the form means (sparkjobs/key_form.py), typed as grouped measures are: a
    # maximum of a number is a double, whatever the number's own type
    assert _types(written) == [
        ("key", "string"),
        ("count", "long"),
        ("max", "double"),
        ("avg", "double"),
    ]


def test_a_required_field_the_input_lacks_is_refused_at_required() -> None:
    params = {
        "group_by": ["key"],
        "measures": [{"name": "n", "fn": "count"}],
        "required": ["key", "usr"],
    }
    _, problems = output("aggregate", params, RECORDS)
    assert [(p.param, p.message.split(" (")[0]) for p in problems] == [
        ("required", "unknown field 'usr'")
    ]


def test_a_value_that_is_not_a_number_is_refused() -> None:
    _, problems = output("running", {"key": "key", "value": "user", "distinct": "user"}, RECORDS)
    assert [(p.param, p.message) for p in problems] == [
        ("value", "'user' is a string, not a number")
    ]


def test_a_window_needs_an_event_time_field_that_can_hold_one() -> None:
    params = {"key": "key", "value": "value", "distinct": "user", "window_s": 60}
    _, problems = output("aggregate", params, RECORDS)
    assert [p.param for p in problems] == ["event_time"]  # its default, event_time, is absent
    written, problems = output("aggregate", {**params, "event_time": "ts"}, RECORDS)
    assert problems == []
    # Each window's start and end, then the key, as grouped measures write them
    assert [f.name for f in written.fields][:3] == ["window_start", "window_end", "key"]
    _, problems = output("aggregate", {**params, "event_time": "ok"}, RECORDS)
    assert [(p.param, p.message.split(";")[0]) for p in problems] == [
        ("event_time", "'ok' is a boolean")
    ]
    # Without a window the event-time field is not read, whatever it names
    _, problems = output("aggregate", {"key": "key", "event_time": "nope"}, RECORDS)
    assert problems == []


def test_a_filter_keeps_its_fields_and_refuses_unknown_ones_and_conditions_that_are_not() -> None:
    written, problems = output("filter", {"condition": "value > 10 AND Ok"}, RECORDS)
    assert problems == [] and written == RECORDS
    _, problems = output("filter", {"condition": "valeu > 10 or usr = 'a'"}, RECORDS)
    assert [p.message.split(";")[0] for p in problems] == [
        "at character 1: unknown field 'valeu' (did you mean 'value'?)",
        "at character 15: unknown field 'usr' (did you mean 'user'?)",
    ]
    _, problems = output("filter", {"condition": "upper(key)"}, RECORDS)
    assert [p.message for p in problems] == ["is a string, not a true/false condition"]


def test_a_project_writes_its_columns_named_and_typed() -> None:
    columns = ["KEY", "value * 2 AS doubled", "cast(qty as string) qty_text", "length(user)"]
    written, problems = output("project", {"columns": columns}, RECORDS)
    assert problems == []
    # A bare field keeps its declared name; an unnamed column is named by its text
    assert _types(written) == [
        ("key", "string"),
        ("doubled", "double"),
        ("qty_text", "string"),
        ("length(user)", "long"),
    ]
    everything, problems = output("project", {"columns": ["*", "qty * 2 AS twice"]}, RECORDS)
    assert problems == []
    assert everything.fields == [*RECORDS.fields, Field("twice", "long")]


def test_a_project_column_named_twice_is_refused() -> None:
    _, problems = output("project", {"columns": ["key", "upper(user) AS KEY"]}, RECORDS)
    assert [(p.param, p.message) for p in problems] == [
        ("columns", "column 'KEY' twice: name one with AS")
    ]


def test_a_join_adds_the_table_s_columns_after_the_record_s_fields() -> None:
    params = {"reference": "airlines.csv", "on": ["key"], "columns": ["name", "country"]}
    schema, problems = output("join", params, RECORDS)
    assert problems == []
    assert _types(schema)[-3:] == [("ts", "timestamp"), ("name", "unknown"), ("country", "unknown")]


def test_a_join_on_an_unknown_field_or_adding_one_the_record_has_is_refused() -> None:
    params = {"reference": "airlines.csv", "on": ["carrier"], "columns": ["name", "Value"]}
    _, problems = output("join", params, RECORDS)
    assert [(p.param, p.message.split(";")[0]) for p in problems] == [
        ("on", "unknown field 'carrier'"),
        ("columns", "'Value' is already a field of the input, the table's would hide it"),
    ]


TABLE = Schema([Field("key", "string"), Field("name", "string"), Field("fleet", "long")])


def test_a_join_with_its_table_known_adds_the_columns_with_the_table_s_types() -> None:
    params = {"reference": "airlines.csv", "on": ["key"], "columns": ["name", "fleet"]}
    schema, problems = output("join", params, RECORDS, table=TABLE)
    assert problems == []
    assert _types(schema)[-2:] == [("name", "string"), ("fleet", "long")]


@pytest.mark.parametrize(
    ("on", "columns", "says"),
    [
        (["key"], ["name", "country"], ("columns", "the reference table has no column 'country'")),
        (["qty"], ["name"], ("on", "the reference table has no column 'qty'")),
        (["key"], ["name"], None),
    ],
)
def test_a_join_naming_a_column_its_table_lacks_is_refused(
    on: list[str], columns: list[str], says: tuple[str, str] | None
) -> None:
    params = {"reference": "airlines.csv", "on": on, "columns": columns}
    _, problems = output("join", params, RECORDS, table=TABLE)
    found = [(p.param, p.message.split(" (")[0]) for p in problems]
    assert found == ([] if says is None else [says])


@pytest.mark.parametrize(
    ("mine", "theirs", "fits"),
    [
        ("string", "string", True),
        ("long", "double", True),
        ("string", "long", False),
        ("timestamp", "string", False),
        ("unknown", "long", True),
    ],
)
def test_a_join_field_must_compare_with_the_table_s(mine: str, theirs: str, fits: bool) -> None:
    records = Schema([Field("carrier", mine), Field("delay", "double")])  # type: ignore[arg-type]
    table = Schema([Field("carrier", theirs), Field("name", "string")])  # type: ignore[arg-type]
    params = {"reference": "t.csv", "on": ["carrier"], "columns": ["name"]}
    _, problems = output("join", params, records, table=table)
    assert (problems == []) is fits, problems
    if not fits:
        assert problems[0].message.startswith(f"'carrier' is {mine} in the records but {theirs}")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("qty + 1", "long"),
        ("qty + value", "double"),
        ("qty / 2", "double"),
        ("qty div 2", "long"),
        ("key || user", "string"),
        ("not ok", "boolean"),
        ("key like 'a%'", "boolean"),
        ("value between 1 and 2", "boolean"),
        ("cast(value as bigint)", "long"),
        ("value::string", "string"),
        ("coalesce(qty, 0)", "long"),
        ("coalesce(qty, value)", "double"),
        ("coalesce(qty, key)", "unknown"),
        ("if(ok, key, user)", "string"),
        ("hour(ts)", "long"),
        ("to_date(ts)", "date"),
        ("date_format(ts, 'yyyy')", "string"),
        ("case when ok then 1 else 2 end", "unknown"),
        ("1.5", "double"),
        ("true", "boolean"),
        ("NULL", "unknown"),
        ("nosuchfield + 1", "unknown"),
    ],
)
def test_an_expression_s_type_is_inferred_where_the_language_makes_it_certain(
    text: str, kind: str
) -> None:
    tree = expressions.parse(text)
    assert tree is not None
    assert infer(tree, RECORDS) == kind


names = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


@given(fields=st.lists(names, min_size=1, max_size=12, unique_by=str.lower), used=names)
def test_a_reference_is_refused_exactly_when_no_field_has_its_name_whatever_its_case(
    fields: list[str], used: str
) -> None:
    schema = Schema([Field(name, "string") for name in fields])
    _, problems = output("filter", {"condition": f"{used.upper()} IS NULL"}, schema)
    known = used.lower() in {f.lower() for f in fields}
    assert (problems == []) == known


def test_the_checks_are_linear_in_the_fields() -> None:
    many = Schema([Field(f"field_{i}", "long") for i in range(MAX_FIELDS)])
    began = time.perf_counter()
    for _ in range(20):
        output("project", {"columns": ["*", "field_499 + field_0 AS total"]}, many)
        output("aggregate", {"key": "field_1", "value": "field_2", "distinct": "missing"}, many)
    assert time.perf_counter() - began < 2.0


def test_json_records_propose_their_values_types_in_the_order_fields_come() -> None:
    records = [
        {"key": "a", "qty": 1, "ok": True, "at": "2026-12-05T08:00:00Z", "meta": {"x": 1}},
        {"key": "b", "qty": 2.5, "ok": None, "at": "2026-12-05", "day": "2026-12-05"},
        {"key": 7, "tags": [1], "bad name": 1},
    ]
    proposal = propose(records, text=False)
    # a field whose values disagree is a string; longs and doubles make a double, dates
    # and timestamps a timestamp; nested values and names that are not field names left out
    assert proposal.ddl == "key string, qty double, ok boolean, at timestamp, day date"
    assert proposal.nested == ["meta", "tags"]
    assert declared(proposal.ddl)[1] == []


def test_csv_text_proposes_the_type_its_form_says() -> None:
    rows = [
        {"carrier": "UA", "dep_delay": "12", "distance": "1400.5", "hour": "5", "ok": "true"},
        {"carrier": "AA", "dep_delay": "", "distance": "733", "hour": "x", "ok": "False"},
    ]
    assert propose(rows, text=True).ddl == (
        "carrier string, dep_delay long, distance double, hour string, ok boolean"
    )


def test_a_field_seen_only_as_null_is_a_string() -> None:
    assert propose([{"a": None}, {"a": None}], text=False).ddl == "a string"
