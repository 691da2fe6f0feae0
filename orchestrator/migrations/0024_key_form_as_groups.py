"""The key, value and distinct form's results as grouped measures' rows: every
``ResultKey`` and ``WindowKey`` row becomes the ``ResultGroup`` row of its key (and
window), and a stateful stage's state of that form is keyed and kept as its measures
are, so a run of either form reads, merges and closes as one of grouped measures
(sparkjobs/key_form.py). The two tables then go.

The form's measures as sparkjobs/key_form.py names them, kept here as they were when
the rows were written: a later change of that module must not change what this
migration did."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from django.db import migrations

# The form's aggregates, in order, as the measure each is: (name, function).
_AGGREGATES = {
    "count": "count",
    "sum": "sum",
    "min": "min",
    "max": "max",
    "avg": "avg",
    "count_distinct": "distinct_users",
}
_BATCH = 2000


def _key_form(topology: dict[str, Any]) -> dict[str, list[str]]:
    """The run's aggregating stages of the key form, each with the measures it computes
    (by stage)."""
    stages = {}
    for node in topology.get("nodes") or []:
        operator = node.get("operator") or ("aggregate" if node.get("kind") == "operator" else "")
        params = node.get("params") or {}
        other = any(p in params for p in ("group_by", "measures", "required", "statement"))
        if operator in ("aggregate", "running") and not other:
            wanted = params.get("aggregates") or list(_AGGREGATES)
            names = [name for aggregate, name in _AGGREGATES.items() if aggregate in wanted]
            stages[node.get("stage") or node["name"]] = names
    return stages


def _digest(group: list[str], window: int | None = None) -> str:
    at: list[Any] = list(group) if window is None else [window, list(group)]
    return hashlib.sha256(json.dumps(at).encode()).hexdigest()


def _states(row: Any) -> dict[str, Any]:
    total = str(row.sum)
    return {
        "count": row.count,
        "sum": total,
        "min": str(row.min),
        "max": str(row.max),
        "avg": {"sum": total, "count": row.count},
        "distinct_users": sorted(row.values or []),
    }


def _finished(row: Any, distinct: int) -> dict[str, Any]:
    return {
        "count": row.count,
        "sum": str(row.sum),
        "min": str(row.min),
        "max": str(row.max),
        "avg": str(Decimal(row.sum) / Decimal(row.count)) if row.count else None,
        "distinct_users": distinct,
    }


def _only(values: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {name: values[name] for name in names}


def forwards(apps: Any, schema_editor: Any) -> None:
    run_model = apps.get_model("orchestrator", "Run")
    result_key = apps.get_model("orchestrator", "ResultKey")
    window_key = apps.get_model("orchestrator", "WindowKey")
    result_group = apps.get_model("orchestrator", "ResultGroup")
    key_state = apps.get_model("orchestrator", "KeyState")
    stages: dict[int, dict[str, list[str]]] = {}

    def key_form(run_id: int) -> dict[str, list[str]]:
        if run_id not in stages:
            stages[run_id] = _key_form(run_model.objects.get(pk=run_id).topology)
        return stages[run_id]

    def of_run(run_id: int) -> list[str]:
        return next(iter(key_form(run_id).values()), list(_AGGREGATES.values()))

    made = []
    for row in result_key.objects.order_by("pk").iterator(chunk_size=_BATCH):
        wanted = of_run(row.run_id)
        frozen = row.distinct is not None and row.values is None
        made.append(
            result_group(
                run_id=row.run_id,
                digest=_digest([row.key]),
                group=[row.key],
                states={} if frozen else _only(_states(row), wanted),
                records=row.count,
                finished=_only(_finished(row, row.distinct), wanted) if frozen else None,
            )
        )
        if len(made) >= _BATCH:
            result_group.objects.bulk_create(made)
            made = []
    for row in window_key.objects.order_by("pk").iterator(chunk_size=_BATCH):
        wanted = of_run(row.run_id)
        closed = row.closed_at is not None
        distinct = row.distinct if row.distinct is not None else len(row.values or [])
        made.append(
            result_group(
                run_id=row.run_id,
                digest=_digest([row.key], row.start_us),
                group=[row.key],
                states={} if closed else _only(_states(row), wanted),
                records=row.count,
                start_us=row.start_us,
                end_us=row.end_us,
                closed_at=row.closed_at,
                finished=_only(_finished(row, distinct), wanted) if closed else None,
            )
        )
        if len(made) >= _BATCH:
            result_group.objects.bulk_create(made)
            made = []
    result_group.objects.bulk_create(made)
    # A stateful stage of the form kept count, sum, min and max by its key: its key is
    # now its group's digest, and its state has every measure the form names (an
    # average from the sum and count; the distinct values it never kept, none).
    for state in key_state.objects.order_by("pk").iterator(chunk_size=_BATCH):
        names = key_form(state.run_id).get(state.stage)
        if names is None:  # a stage of grouped measures: kept as it is
            continue
        states = state.states
        full = {
            **states,
            "avg": {"sum": states["sum"], "count": states["count"]},
            "distinct_users": [],
        }
        state.key = _digest([state.key])
        state.states = _only(full, names)
        state.save(update_fields=["key", "states"])


def backwards(apps: Any, schema_editor: Any) -> None:
    """The key form's groups back into the two tables (made again before this runs),
    for runs whose stage computes every column they keep. A stateful stage's state of
    the form, or a stage computing fewer measures, refuses to go back: its states were
    keyed by their group's digest, and the columns need what they never computed."""
    run_model = apps.get_model("orchestrator", "Run")
    result_key = apps.get_model("orchestrator", "ResultKey")
    window_key = apps.get_model("orchestrator", "WindowKey")
    result_group = apps.get_model("orchestrator", "ResultGroup")
    key_state = apps.get_model("orchestrator", "KeyState")
    columns = ["count", "sum", "min", "max", "distinct_users"]
    for run_id, topology in run_model.objects.values_list("pk", "topology").iterator():
        stages = _key_form(topology)
        if not stages:
            continue
        if key_state.objects.filter(run_id=run_id, stage__in=list(stages)).exists():
            raise RuntimeError(
                f"run {run_id} holds a stateful stage's state of the key form, keyed by its "
                "groups' digests: delete the run to go back past this migration"
            )
        groups = result_group.objects.filter(run_id=run_id)
        if not groups.exists():
            continue
        names = next(iter(stages.values()))
        if not set(columns) <= set(names):
            raise RuntimeError(
                f"run {run_id}'s stage computes {', '.join(names)}, not every column the key "
                "form's tables keep: delete the run to go back past this migration"
            )
        for row in groups.order_by("pk").iterator(chunk_size=_BATCH):
            kept = row.finished
            values = row.states.get("distinct_users") if kept is None else None
            source = row.states if kept is None else kept
            fields = {
                "run_id": run_id,
                "key": row.group[0],
                "count": source["count"],
                "sum": Decimal(source["sum"]),
                "min": Decimal(source["min"]),
                "max": Decimal(source["max"]),
                "values": values,
                "distinct": kept["distinct_users"] if kept is not None else None,
            }
            if row.start_us is None:
                result_key.objects.create(**fields)
            else:
                window_key.objects.create(
                    start_us=row.start_us,
                    end_us=row.end_us,
                    closed_at=row.closed_at,
                    **fields,
                )
        groups.delete()


class Migration(migrations.Migration):
    dependencies = [("orchestrator", "0023_keystate_measures")]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
        migrations.DeleteModel(name="ResultKey"),
        migrations.DeleteModel(name="WindowKey"),
    ]
