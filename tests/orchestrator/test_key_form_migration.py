"""Migration 0024: the key form's results become grouped measures' rows. Each key's
``ResultKey`` row, and each (window, key)'s ``WindowKey`` row, is the ``ResultGroup``
row of its group (and window), keyed by its digest, with the measures its stage names
(sparkjobs/key_form.py): as partial states while they may still merge, as finished
values once its run froze them or its window closed. A run's result reads as it did."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from orchestrator.ledger.groups import digest
from orchestrator.ledger.results import run_rows
from orchestrator.models import ResultGroup, Run
from sparkjobs.event_time import iso
from tests.orchestrator.migrating import back_to_latest, latest, migrate
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BEFORE = "0023_keystate_measures"
MINUTE_US = 60_000_000


def _run(**params: Any) -> Run:
    """A run of the reference pipeline (the key form, every aggregate), its aggregating
    stage's parameters updated with ``params``."""
    run = pending_run("reference")
    for node in run.topology["nodes"]:
        if node.get("stage") == "agg":
            node["params"] = {**node["params"], **params}
    run.save(update_fields=["topology"])
    return run


def _historical(name: str) -> Any:
    """The model ``name`` as the schema at ``BEFORE`` has it."""
    state = MigrationExecutor(connection).loader.project_state(("orchestrator", BEFORE))
    return state.apps.get_model("orchestrator", name)


def _groups(run: Run) -> list[tuple[Any, ...]]:
    """The run's result rows: digest, group, states, finished, records, window, closed."""
    return [
        (g.digest, g.group, g.states, g.finished, g.records, g.start_us, g.end_us, g.closed_at)
        for g in ResultGroup.objects.filter(run=run).order_by("start_us", "records")
    ]


def test_an_upgrade_makes_each_key_s_result_the_row_of_its_group_and_it_reads_the_same() -> None:
    # Given, before migration 0024, a run over all time with a key whose distinct set is
    # on its row and a key its run froze (its count kept, its set dropped)...
    over_all_time = _run()
    # ...a windowed run with an open window's key and a closed window's...
    windowed = _run(window_s=60, event_time="ts")
    # ...and a windowed run whose stage names only some of the form's aggregates
    some = _run(window_s=60, event_time="ts", aggregates=["count", "avg", "count_distinct"])
    closed_at = timezone.now() - dt.timedelta(minutes=5)
    with back_to_latest():
        migrate(BEFORE)
        result_key, window_key = _historical("ResultKey"), _historical("WindowKey")
        result_key.objects.create(
            run_id=over_all_time.pk,
            key="a",
            count=3,
            sum=Decimal("7.5"),
            min=Decimal("1.25"),
            max=4,
            values=["u2", "u1"],
        )
        result_key.objects.create(
            run_id=over_all_time.pk,
            key="b",
            count=2,
            sum=-1,
            min=-3,
            max=2,
            values=None,
            distinct=5,
        )
        for run in (windowed, some):
            window_key.objects.create(
                run_id=run.pk,
                start_us=0,
                end_us=MINUTE_US,
                key="a",
                count=2,
                sum=3,
                min=1,
                max=2,
                values=["u1"],
            )
            window_key.objects.create(
                run_id=run.pk,
                start_us=MINUTE_US,
                end_us=2 * MINUTE_US,
                key="a",
                count=1,
                sum=5,
                min=5,
                max=5,
                values=None,
                distinct=1,
                closed_at=closed_at,
            )
        # When the database is migrated
        migrate(latest())
    # Then the two tables are gone...
    tables = connection.introspection.table_names()
    assert "orchestrator_resultkey" not in tables and "orchestrator_windowkey" not in tables
    # ...each key over all time is the row of its group, keyed by the group's digest: an
    # active key's measures as partial states (its set sorted), a frozen key's as values
    a_sum, b_sum = "7.5000000000", "-1.0000000000"
    assert _groups(over_all_time) == [
        (
            digest(["b"]),
            ["b"],
            {},
            {
                "count": 2,
                "sum": b_sum,
                "min": "-3.0000000000",
                "max": "2.0000000000",
                "avg": "-0.5000000000",
                "distinct_users": 5,
            },
            2,
            None,
            None,
            None,
        ),
        (
            digest(["a"]),
            ["a"],
            {
                "count": 3,
                "sum": a_sum,
                "min": "1.2500000000",
                "max": "4.0000000000",
                "avg": {"sum": a_sum, "count": 3},
                "distinct_users": ["u1", "u2"],
            },
            None,
            3,
            None,
            None,
            None,
        ),
    ]
    # ...and its result reads as the key form's always did
    assert run_rows(over_all_time) == [
        {
            "key": "a",
            "count": 3,
            "sum": 7.5,
            "min": 1.25,
            "max": 4.0,
            "avg": 2.5,
            "distinct_users": 2,
        },
        {
            "key": "b",
            "count": 2,
            "sum": -1.0,
            "min": -3.0,
            "max": 2.0,
            "avg": -0.5,
            "distinct_users": 5,
        },
    ]
    # Each (window, key) is the row of its group in its window, digested with the window's
    # start: an open window's measures as states, a closed one's as values, still closed
    three, five = "3.0000000000", "5.0000000000"
    open_states = {
        "count": 2,
        "sum": three,
        "min": "1.0000000000",
        "max": "2.0000000000",
        "avg": {"sum": three, "count": 2},
        "distinct_users": ["u1"],
    }
    closed_values = {
        "count": 1,
        "sum": five,
        "min": five,
        "max": five,
        "avg": five,
        "distinct_users": 1,
    }
    open_row = (digest(["a"], 0), ["a"], open_states, None, 2, 0, MINUTE_US, None)
    closed_row = (
        digest(["a"], MINUTE_US),
        ["a"],
        {},
        closed_values,
        1,
        MINUTE_US,
        2 * MINUTE_US,
        closed_at,
    )
    assert _groups(windowed) == [open_row, closed_row]
    window = {"window_start": iso(0), "window_end": iso(MINUTE_US), "key": "a"}
    later = {"window_start": iso(MINUTE_US), "window_end": iso(2 * MINUTE_US), "key": "a"}
    assert run_rows(windowed) == [
        {**window, "count": 2, "sum": 3.0, "min": 1.0, "max": 2.0, "avg": 1.5, "distinct_users": 1},
        {**later, "count": 1, "sum": 5.0, "min": 5.0, "max": 5.0, "avg": 5.0, "distinct_users": 1},
    ]
    # A stage naming only some aggregates keeps only their measures
    named = ("count", "avg", "distinct_users")

    def only(values: dict[str, Any]) -> dict[str, Any]:
        return {name: values[name] for name in named}

    assert _groups(some) == [
        (*open_row[:2], only(open_states), *open_row[3:]),
        (*closed_row[:3], only(closed_values), *closed_row[4:]),
    ]
    assert run_rows(some) == [
        {**window, "count": 2, "avg": 1.5, "distinct_users": 1},
        {**later, "count": 1, "avg": 5.0, "distinct_users": 1},
    ]
    # And going back past it: refused for a stage computing fewer measures than the
    # columns keep, saying which run; without that run, each row is its table's again
    with back_to_latest():
        with pytest.raises(RuntimeError, match=f"run {some.pk}'s stage computes count, avg"):
            migrate(BEFORE)
        some.delete()
        migrate(BEFORE)
        result_key, window_key = _historical("ResultKey"), _historical("WindowKey")
        keys = result_key.objects.filter(run_id=over_all_time.pk).order_by("key")
        assert list(
            keys.values_list("key", "count", "sum", "min", "max", "values", "distinct")
        ) == [
            ("a", 3, Decimal("7.5"), Decimal("1.25"), Decimal(4), ["u1", "u2"], None),
            ("b", 2, Decimal(-1), Decimal(-3), Decimal(2), None, 5),
        ]
        windows = window_key.objects.filter(run_id=windowed.pk).order_by("start_us")
        assert list(
            windows.values_list("start_us", "end_us", "key", "count", "sum", "values", "distinct")
        ) == [
            (0, MINUTE_US, "a", 2, Decimal(3), ["u1"], None),
            (MINUTE_US, 2 * MINUTE_US, "a", 1, Decimal(5), None, 1),
        ]
        assert [w.closed_at for w in windows] == [None, closed_at]
