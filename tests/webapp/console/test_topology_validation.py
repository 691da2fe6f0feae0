"""The topology format: every problem reported at once, with its location."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.orchestrator.run.scenarios import joined_flights
from webapp.console.topology_io import parse_yaml
from webapp.console.validation import validate_document

REFERENCE = Path(__file__).resolve().parents[3] / "webapp/console/topologies/reference.yaml"


@pytest.fixture
def reference() -> dict[str, Any]:
    return parse_yaml(REFERENCE.read_text())


def messages(doc: Any) -> list[str]:
    return [str(p) for p in validate_document(doc)]


def test_reference_topology_is_valid(reference: dict[str, Any]) -> None:
    assert validate_document(reference) == []


def test_unknown_node_in_an_edge_is_named_with_its_location(reference: dict[str, Any]) -> None:
    reference["edges"].append({"from": "task1", "to": "nowhere"})
    assert "edges[6].to: unknown node 'nowhere'" in messages(reference)


def test_cycle_lists_the_nodes_on_it(reference: dict[str, Any]) -> None:
    reference["nodes"].append(
        {"name": "loop", "kind": "operator", "operator": "filter", "params": {"condition": "1=1"}}
    )
    reference["edges"] += [
        {"from": "task1", "to": "loop"},
        {"from": "loop", "to": "task1"},
    ]
    found = [m for m in messages(reference) if "cycle" in m]
    assert len(found) == 1
    assert "task1 -> loop -> task1" in found[0]


def test_no_source_and_no_sink(reference: dict[str, Any]) -> None:
    doc = {
        "name": "headless",
        "nodes": [
            {"name": "a", "kind": "operator", "operator": "filter", "params": {"condition": "x>1"}}
        ],
        "edges": [],
    }
    found = messages(doc)
    assert "nodes: no source node (kind: source)" in found
    assert "nodes: no sink node (kind: sink)" in found


def test_unreachable_node_and_dead_end(reference: dict[str, Any]) -> None:
    reference["nodes"].append(
        {"name": "orphan", "kind": "operator", "operator": "filter", "params": {"condition": "1=1"}}
    )
    reference["nodes"].append(
        {"name": "deadend", "kind": "operator", "operator": "filter", "params": {"condition": "1"}}
    )
    reference["edges"].append({"from": "orphan", "to": "output"})
    reference["edges"].append({"from": "source", "to": "deadend"})
    found = messages(reference)
    assert "node orphan: unreachable from any source" in found
    assert "node deadend: its data never reaches a sink" in found


def test_bad_operator_parameters_are_reported_per_node(reference: dict[str, Any]) -> None:
    reference["nodes"][1]["params"]["aggregates"] = ["count", "median"]
    reference["nodes"][0]["params"]["segment_mb"] = -1
    reference["nodes"][0]["params"]["colour"] = "red"
    found = messages(reference)
    assert any(m.startswith("nodes[1] (task1).params:") and "median" in m for m in found), found
    assert any("nodes[0] (source).params" in m and "segment_mb" in m for m in found)
    assert any("unknown parameter 'colour'" in m for m in found)


def test_threshold_out_of_range_and_inverted(reference: dict[str, Any]) -> None:
    reference["policy_overrides"] = {
        "high_water": 0.95,
        "alpha": 1.0,
        "scale_in_busy": 1.5,
        "scale_in_after_s": 0,
    }
    found = messages(reference)
    assert "policy_overrides.high_water: 0.95 is outside [0.6, 0.9]" in found
    assert "policy_overrides.alpha: 1 is outside (0, 1)" in found
    assert "policy_overrides.scale_in_busy: 1.5 is outside (0, 1)" in found
    assert "policy_overrides.scale_in_after_s: 0 is outside [5, 3600]" in found
    reference["policy_overrides"] = {"high_water": 0.6, "low_water": 0.4, "recovery_threshold": 0.9}
    found = messages(reference)
    assert any("recovery_threshold" in m for m in found)


def test_every_problem_is_reported_at_once(reference: dict[str, Any]) -> None:
    broken = copy.deepcopy(reference)
    broken["edges"].append({"from": "ghost", "to": "output"})
    broken["policy_overrides"] = {"beta": 0}
    broken["nodes"][2]["buffer_mb"] = 0
    found = messages(broken)
    assert len(found) >= 3
    assert any(m.startswith("edges[6].from") for m in found)
    assert any(m.startswith("policy_overrides.beta") for m in found)
    assert any("buffer_mb" in m for m in found)


def test_stage_members_must_be_interchangeable(reference: dict[str, Any]) -> None:
    reference["nodes"][3]["params"] = {"key": "user", "value": "value"}
    assert any("stage 'agg' mixes" in m for m in messages(reference))


def test_every_upstream_of_a_keyed_stage_feeds_all_its_members() -> None:
    doc = parse_yaml((REFERENCE.parent / "running-totals.yaml").read_text())
    assert validate_document(doc) == []
    doc["edges"] = [e for e in doc["edges"] if e != {"from": "source", "to": "totals2"}]
    assert any(
        m.startswith("node totals2: keyed stage 'totals'") and "source does not feed" in m
        for m in messages(doc)
    )


def test_a_running_stage_keyed_local_global_takes_any_record_at_any_member() -> None:
    doc = parse_yaml((REFERENCE.parent / "running-totals.yaml").read_text())
    for node in doc["nodes"][1:3]:
        node["params"]["keying"] = "local_global"
    assert validate_document(doc) == []
    doc["edges"] = [e for e in doc["edges"] if e != {"from": "source", "to": "totals2"}]
    assert messages(doc) == ["node totals2: unreachable from any source"]
    doc["nodes"][1]["params"]["keying"] = "by_magic"
    doc["nodes"][2]["params"]["keying"] = "by_magic"
    assert any(
        "totals1" in m and "keying" in m and "must be one of local_global, key_groups" in m
        for m in messages(doc)
    ), messages(doc)


def test_a_join_with_reference_data_is_valid_and_its_fields_reach_the_aggregate() -> None:
    assert validate_document(joined_flights()) == []
    from_a_database = joined_flights(reference=None, table="airlines", database="reports")
    assert validate_document(from_a_database) == []


@pytest.mark.parametrize(
    ("join", "says"),
    [
        ({"reference": "/etc/passwd.csv"}, "parameter 'reference' must be a file below an input"),
        ({"reference": "../up.csv"}, "parameter 'reference' must be a file below an input"),
        ({"reference": "tables/*.csv"}, "parameter 'reference' must name one file, not a pattern"),
        ({"reference": "airlines.xlsx"}, "parameter 'reference' must end in .csv, .jsonl"),
        ({"on": []}, "parameter 'on' must be a list of 1 to 16 field names"),
        ({"on": ["carrier", "CARRIER"]}, "parameter 'on' names a field twice"),
        ({"columns": ["name", "carrier"]}, "columns and on both name carrier"),
        ({"how": "outer"}, "parameter 'how' must be one of inner, left"),
        ({"on": ["airline"]}, "nodes[1] (enrich).params.on: unknown field 'airline'"),
        ({"table": "airlines", "database": "reports"}, "give reference (a file) or table and"),
        ({"reference": None}, "give reference (a file) or table and database"),
        ({"reference": None, "table": "airlines"}, "table and database go together"),
        (
            {"reference": None, "table": "airlines", "database": "console"},
            "parameter 'database' must be a database the admin named for pipelines",
        ),
        ({"reference": None, "table": "Airlines", "database": "r"}, "parameter 'table' must be"),
    ],
)
def test_a_bad_join_is_refused_saying_which_parameter_and_why(
    join: dict[str, Any], says: str
) -> None:
    found = messages(joined_flights(**join))
    assert any(says in m for m in found), found


def test_a_user_document_cannot_name_a_snapshot_of_its_own() -> None:
    doc = joined_flights()
    doc["nodes"][1]["reference_file"] = "0" * 64 + ".csv"  # type: ignore[typeddict-unknown-key]
    assert "nodes[1].reference_file: unknown key" in messages(doc)


def test_sources_take_no_input_and_sinks_give_no_output(reference: dict[str, Any]) -> None:
    reference["edges"].append({"from": "output", "to": "source"})
    found = messages(reference)
    assert any(m.startswith("node source: a source has no inputs") for m in found)
    assert any(m.startswith("node output: a sink has no outputs") for m in found)


def test_not_a_mapping_and_garbage_keys() -> None:
    assert messages(["a", "list"]) == ["(document): must be a mapping with name, nodes and edges"]
    found = messages({"name": "x", "nodes": [], "colour": 1})
    assert "colour: unknown key" in found
    assert "nodes: must be a non-empty list of nodes" in found


def windowed(doc: dict[str, Any], **params: Any) -> dict[str, Any]:
    """``doc`` with ``params`` on every operator, its source declaring the event time."""
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {**(node.get("params") or {}), **params}
        if node["kind"] == "source":
            field = params.get("event_time", "event_time")
            node["params"]["schema"] += f", {field} timestamp"
    return doc


def test_windows_on_every_aggregate_are_valid(reference: dict[str, Any]) -> None:
    assert messages(windowed(reference, window_s=60, slide_s=15, lateness_s=5)) == []


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"window_s": 0.5}, "parameter 'window_s' must be between 1 and 86400, got 0.5"),
        ({"window_s": 90_000}, "parameter 'window_s' must be between 1 and 86400, got 90000"),
        ({"window_s": "1m"}, "parameter 'window_s' must be a number, got '1m'"),
        ({"window_s": 1.0000001}, "must be a whole number of microseconds"),
        ({"window_s": 10, "slide_s": 20}, "slide_s (20) must not exceed window_s (10)"),
        ({"window_s": 600, "slide_s": 1}, "window_s / slide_s must be at most 100"),
        ({"window_s": 10, "lateness_s": -1}, "parameter 'lateness_s' must be between 0"),
        ({"window_s": 10, "event_time": "a.b"}, "parameter 'event_time' must be a field name"),
        ({"lateness_s": 5}, "lateness_s given without window_s (no windows)"),
    ],
)
def test_window_fields_out_of_range_are_refused_with_the_allowed_range(
    reference: dict[str, Any], params: dict[str, Any], expected: str
) -> None:
    found = messages(windowed(reference, **params))
    assert any(expected in m and m.startswith("nodes[1] (task1).params") for m in found), found


def test_aggregates_that_window_differently_are_refused(reference: dict[str, Any]) -> None:
    windowed(reference, window_s=60)
    reference["nodes"][2]["params"]["window_s"] = 30
    found = [m for m in messages(reference) if m.startswith("nodes: aggregating")]
    assert len(found) == 1
    assert found[0].startswith("nodes: aggregating nodes must have the same window fields")
    assert "task2" in found[0]


def test_a_window_shorter_than_the_tick_is_refused(reference: dict[str, Any]) -> None:
    doc = windowed(reference, window_s=2)
    doc["policy_overrides"] = {"tick_ms": 5000}
    assert messages(doc) == [
        "nodes: window_s (2 s) must not be shorter than the balancer tick (tick_ms 5000)"
    ]


def test_a_stateful_running_stage_windows_like_the_aggregates() -> None:
    doc = parse_yaml((REFERENCE.parent / "running-totals.yaml").read_text())
    doc["nodes"][1]["params"]["window_s"] = 10
    found = [m for m in messages(doc) if m.startswith("nodes: aggregating")]
    assert len(found) == 1 and "totals2: no window" in found[0]
    assert "totals1: window_s 10, slide_s 10, event_time event_time, lateness_s 0" in found[0]
    assert messages(windowed(doc, window_s=10, event_time="ts")) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "k" * 129, "must be a field name of at most 128 characters, got 129", id="long"
        ),
        pytest.param("k" * 128, None, id="at the bound"),
        pytest.param(
            "user`) , evil" * 9,
            "must be a field name (letters, digits, _), got 'user`) , evil",
            id="hostile, quoted short",
        ),
    ],
)
def test_a_field_name_is_bounded_and_quoted_short(
    reference: dict[str, Any], name: str, expected: str | None
) -> None:
    # The name's own bound, whether or not the source declares such a field
    reference["nodes"][0]["params"].pop("schema")
    reference["nodes"][1]["params"] = {**(reference["nodes"][1].get("params") or {}), "key": name}
    found = [m for m in messages(reference) if m.startswith("nodes[1] (task1).params")]
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found
        assert len(found[0]) < 200


def test_a_grouped_pipeline_is_valid_and_its_measures_have_types() -> None:
    from orchestrator.pipeline.schemas import derive

    doc = joined_flights(grouped=True)
    assert messages(doc) == []
    fields = derive(doc["nodes"], doc["edges"]).by_node["agg1"]
    assert [(f.name, f.type) for f in fields.fields] == [
        ("name", "unknown"),  # the table's, unknown without reading it
        ("origin", "string"),
        ("flights", "long"),
        ("delayed", "long"),
        ("mean_delay", "double"),
        ("total_delay", "double"),
        ("least_delay", "double"),
        ("most_delay", "double"),
        ("tails", "long"),
    ]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"measures": [{"name": "m", "fn": "avg", "field": "tail"}]},
            "nodes[2] (agg1).params.measures: measures[0]: avg of 'tail', a string: it needs "
            "a number",
        ),
        (
            {"measures": [{"name": "m", "fn": "count", "field": "tial"}]},
            "nodes[2] (agg1).params.measures: measures[0]: unknown field 'tial' (did you mean "
            "'tail'?)",
        ),
        (
            {"group_by": ["origen"]},
            "nodes[2] (agg1).params.group_by: unknown field 'origen' (did you mean 'origin'?)",
        ),
        (
            {"measures": [{"name": "origin", "fn": "count"}]},
            "nodes[2] (agg1).params: measures[0].name 'origin' is also a group_by field",
        ),
    ],
)
def test_a_bad_measure_is_refused_where_it_is(change: dict[str, Any], says: str) -> None:
    doc = joined_flights(grouped=True)
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], **change}
    assert any(m.startswith(says) for m in messages(doc)), messages(doc)


def test_a_computed_group_field_has_its_expression_s_type_and_names_known_fields() -> None:
    from orchestrator.pipeline.schemas import derive

    doc = joined_flights(grouped=True)
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], "group_by": ["name", "length(tail) AS tail_len"]}
    assert messages(doc) == []
    fields = derive(doc["nodes"], doc["edges"]).by_node["agg1"].fields
    assert [(f.name, f.type) for f in fields][:2] == [("name", "unknown"), ("tail_len", "long")]
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], "group_by": ["name", "length(tial) AS tail_len"]}
    assert any(
        m.startswith(
            "nodes[2] (agg1).params.group_by: tail_len: at character 8: unknown field 'tial'"
        )
        for m in messages(doc)
    ), messages(doc)


def test_branches_of_one_stage_must_compute_the_same_measures() -> None:
    doc = joined_flights(grouped=True)
    doc["nodes"][3]["params"] = {**doc["nodes"][3]["params"], "group_by": ["origin"]}
    assert any(
        "aggregating nodes must compute the same group_by and measures" in m for m in messages(doc)
    )


def test_grouped_measures_over_windows_go_to_a_table_whose_columns_they_name() -> None:
    from orchestrator.pipeline.schemas import derive

    doc = joined_flights(grouped=True)
    doc["nodes"][0]["params"]["schema"] += ", t long"
    doc["nodes"][-1]["params"] = {"sink": "postgres", "table": "flights"}
    # Without windows, a table has no window to write
    assert any("sink postgres writes closed windows" in m for m in messages(doc))
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], "window_s": 60, "event_time": "t"}
    assert messages(doc) == []
    fields = derive(doc["nodes"], doc["edges"]).by_node["agg1"].fields
    assert [f.name for f in fields][:4] == ["window_start", "window_end", "name", "origin"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"measures": [{"name": "run_id", "fn": "count"}]},
            "'run_id' is a column the sink writes itself: name it otherwise",
        ),
        (
            {"measures": [{"name": "n" * 64, "fn": "count"}]},
            "is longer than a sink column's name may be (63 bytes)",
        ),
        ({"event_time": "tt"}, "params.event_time: unknown field 'tt' (did you mean 't'?)"),
        ({"event_time": "delay"}, ""),
    ],
)
def test_a_windowed_table_sink_refuses_names_it_cannot_keep(
    change: dict[str, Any], says: str
) -> None:
    doc = joined_flights(grouped=True)
    doc["nodes"][0]["params"]["schema"] += ", t long"
    doc["nodes"][-1]["params"] = {"sink": "parquet", "path": "flights"}
    for node in doc["nodes"][2:4]:
        node["params"] = {**node["params"], "window_s": 60, "event_time": "t", **change}
    found = messages(doc)
    if says:
        assert any(says in m for m in found), found
    else:
        assert found == []  # a number of seconds is an event time


def _sql_flights(statement: str) -> dict[str, Any]:
    """The flights pipeline whose aggregating stage is one statement."""
    doc = joined_flights(grouped=True)
    for node in doc["nodes"][2:4]:
        node["operator"] = "sql"
        node["params"] = {"statement": statement}
    return doc


FLIGHTS_SQL = (
    "SELECT name, origin, count(*) AS flights, avg(delay) AS mean_delay, "
    "approx_percentile(delay, 0.95) AS p95, count(DISTINCT tail) AS tails "
    "FROM input WHERE delay IS NOT NULL GROUP BY name, origin"
)


def test_a_sql_stage_is_valid_and_writes_its_groups_and_measures() -> None:
    from orchestrator.pipeline.schemas import derive

    doc = _sql_flights(FLIGHTS_SQL)
    assert messages(doc) == []
    fields = derive(doc["nodes"], doc["edges"]).by_node["agg1"]
    assert [(f.name, f.type) for f in fields.fields] == [
        ("name", "unknown"),
        ("origin", "string"),
        ("flights", "long"),
        ("mean_delay", "double"),
        ("p95", "double"),
        ("tails", "long"),
    ]


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        (
            "SELECT name, collect_list(tail) AS tails FROM input GROUP BY name",
            "nodes[2] (agg1).params: parameter 'statement' at character 14: collect_list() "
            "cannot be a measure",
        ),
        (
            FLIGHTS_SQL.replace("delay IS NOT NULL", "dealy IS NOT NULL"),
            "nodes[2] (agg1).params.statement: at character 1: unknown field 'dealy' (did you "
            "mean 'delay'?)",
        ),
        (
            FLIGHTS_SQL.replace("avg(delay)", "avg(tail)"),
            "nodes[2] (agg1).params.statement: measures[1]: avg of 'tail', a string",
        ),
    ],
)
def test_a_sql_stage_s_problem_is_refused_where_it_is(statement: str, says: str) -> None:
    found = messages(_sql_flights(statement))
    assert any(m.startswith(says) for m in found), found
