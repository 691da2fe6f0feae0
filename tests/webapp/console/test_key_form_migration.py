"""Console migration 0013: stored pipelines' stages in the key form are rewritten as the
grouped measures they mean; every other stage is left as it was."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BEFORE = ("console", "0012_alter_node_buffer_mb")
AFTER = ("console", "0013_key_form_as_measures")


def _migrate(target: tuple[str, str]) -> Any:
    """The console's schema migrated to ``target``; the historical apps there."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    executor.loader.build_graph()
    return executor.loader.project_state([target]).apps


@pytest.fixture
def at_0012() -> Iterator[Any]:
    apps = _migrate(BEFORE)
    try:
        yield apps
    finally:
        leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("console")[0]
        _migrate(leaf)


def test_stages_of_the_key_form_are_stored_as_their_grouping(at_0012: Any) -> None:
    pipeline_model = at_0012.get_model("console", "Pipeline")
    node_model = at_0012.get_model("console", "Node")
    pipeline = pipeline_model.objects.create(name="old")

    def node(name: str, operator: str, params: dict[str, Any], kind: str = "operator") -> Any:
        return node_model.objects.create(
            pipeline=pipeline, name=name, kind=kind, operator=operator, params=params
        )

    defaults = node("a", "aggregate", {})
    custom = node(
        "b",
        "running",
        {
            "key": "carrier",
            "value": "delay",
            "distinct": "tail",
            "aggregates": ["count", "max"],
            "keying": "key_groups",
            "window_s": 60,
        },
    )
    grouped = node(
        "c", "aggregate", {"group_by": ["k"], "measures": [{"name": "n", "fn": "count"}]}
    )
    other = node("d", "filter", {"condition": "value > 1"})
    source = node("s", "read", {"format": "jsonl"}, kind="source")

    _migrate(AFTER)

    def params(row: Any) -> Any:
        return node_model.objects.get(pk=row.pk).params

    assert params(defaults) == {
        "group_by": ["key"],
        "measures": [
            {"name": "count", "fn": "count"},
            {"name": "sum", "fn": "sum", "field": "value"},
            {"name": "min", "fn": "min", "field": "value"},
            {"name": "max", "fn": "max", "field": "value"},
            {"name": "avg", "fn": "avg", "field": "value"},
            {"name": "distinct_users", "fn": "count_distinct", "field": "user"},
        ],
        "required": ["key", "value", "user"],
    }
    assert params(custom) == {
        "keying": "key_groups",
        "window_s": 60,
        "group_by": ["carrier"],
        "measures": [
            {"name": "count", "fn": "count"},
            {"name": "max", "fn": "max", "field": "delay"},
        ],
        "required": ["carrier", "delay", "tail"],
    }
    assert params(grouped) == {"group_by": ["k"], "measures": [{"name": "n", "fn": "count"}]}
    assert params(other) == {"condition": "value > 1"}
    assert params(source) == {"format": "jsonl"}
