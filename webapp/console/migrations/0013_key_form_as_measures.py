"""Stored pipelines' aggregating stages of the key, value and distinct form as the
grouped measures they mean (sparkjobs/key_form.py): ``group_by: [key]``, a measure per
aggregate, the three fields required. The editor then shows one form; the YAML form is
still read as it always was.

The translation as sparkjobs/key_form.py makes it, kept here as it was when these rows
were rewritten: a later change of that module must not change what this migration did."""

from __future__ import annotations

from typing import Any

from django.db import migrations

_FIELDS = {"key": "key", "value": "value", "distinct": "user"}
_AGGREGATES = {
    "count": ("count", "count"),
    "sum": ("sum", "sum"),
    "min": ("min", "min"),
    "max": ("max", "max"),
    "avg": ("avg", "avg"),
    "count_distinct": ("distinct_users", "count_distinct"),
}
_OTHER_FORMS = ("group_by", "measures", "required", "statement")


def _as_measures(params: dict[str, Any]) -> dict[str, Any] | None:
    if any(p in params for p in _OTHER_FORMS):
        return None
    named = {param: params.get(param, default) for param, default in _FIELDS.items()}
    wanted = params.get("aggregates") or list(_AGGREGATES)
    if not all(isinstance(n, str) for n in named.values()) or not isinstance(wanted, list):
        return None
    measures = []
    for aggregate, (name, fn) in _AGGREGATES.items():
        if aggregate in wanted:
            measure = {"name": name, "fn": fn}
            if fn != "count":
                measure["field"] = named["distinct" if fn == "count_distinct" else "value"]
            measures.append(measure)
    rest = {k: v for k, v in params.items() if k not in (*_FIELDS, "aggregates")}
    return {
        **rest,
        "group_by": [named["key"]],
        "measures": measures,
        "required": list(dict.fromkeys(named.values())),
    }


def forwards(apps: Any, schema_editor: Any) -> None:
    node_model = apps.get_model("console", "Node")
    for node in node_model.objects.filter(kind="operator").order_by("pk"):
        operator = node.operator or "aggregate"
        if operator not in ("aggregate", "running"):
            continue
        params = _as_measures(dict(node.params or {}))
        if params is not None:
            node.params = params
            node.save(update_fields=["params"])


class Migration(migrations.Migration):
    dependencies = [("console", "0012_alter_node_buffer_mb")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
