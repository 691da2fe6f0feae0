"""A stateful stage's state per group and event-time window: folded exactly, dropped
once its window closes, never the state over all time."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection

from orchestrator.ledger import keystate
from orchestrator.ledger.groups import digest
from orchestrator.ledger.keystate import Kept, StateKey
from orchestrator.models import KeyState
from sparkjobs.keygroups import KEY_SLOTS, group_slot
from sparkjobs.merge import GroupPartial
from tests.orchestrator.key_form import key_partial, key_states
from tests.orchestrator.migrating import back_to_latest, latest, migrate
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MINUTE_US = 60_000_000
# The running-totals pipeline's stage: key, value and distinct, read as grouped measures.
KEY_FORM = keystate.state_grouping({"key": "key", "value": "value", "distinct": "user"})


def one(key: str, value: int, window: int | None = None, user: str = "u1") -> keystate.Delta:
    """A batch's partial of one record of ``key``, by ``user``."""
    (delta,) = keystate.group_deltas(
        [key_partial(key, key_states(1, value, value, value, [user]), window=window)]
    )
    return delta


def kept(count: int, total: int, low: int, high: int, users: list[str]) -> Kept:
    return Kept(key_states(count, total, low, high, users), count)


def at(key: str, window: int | None = None) -> StateKey:
    """Where the state of ``key`` is kept: by its group's digest, as any group's."""
    return StateKey(digest([key]), window)


def test_a_key_form_stage_keeps_every_measure_of_the_form() -> None:
    assert [(m.name, m.fn, m.field) for m in KEY_FORM.measures] == [
        ("count", "count", None),
        ("sum", "sum", "value"),
        ("min", "min", "value"),
        ("max", "max", "value"),
        ("avg", "avg", "value"),
        ("distinct_users", "count_distinct", "user"),
    ]
    assert KEY_FORM.group_by == ("key",)
    # (a record without one of the form's fields is malformed, as the form has it)
    assert KEY_FORM.required == ("key", "value", "user")


def test_a_stage_naming_no_valid_grouping_has_no_state_to_keep() -> None:
    with pytest.raises(ValueError, match="no valid grouping"):
        keystate.state_grouping({"group_by": ["key"]})


def test_a_window_s_state_folds_apart_from_other_windows_and_all_time() -> None:
    run = pending_run("running-totals")
    for value in (3, 5):
        keystate.fold(
            run.pk,
            "totals",
            "totals1",
            KEY_FORM,
            [
                one("a", value, user=f"u{value}"),
                one("a", value, 0),
                one("a", value * 10, MINUTE_US),
            ],
        )
    assert keystate.totals(run.pk, "totals") == {
        at("a"): kept(2, 8, 3, 5, ["u3", "u5"]),
        at("a", 0): kept(2, 8, 3, 5, ["u1"]),
        at("a", MINUTE_US): kept(2, 80, 30, 50, ["u1"]),
    }


def test_closing_a_window_drops_its_state_and_only_its_own() -> None:
    run = pending_run("running-totals")
    for holder in ("totals1", "totals2"):
        keystate.fold(
            run.pk,
            "totals",
            holder,
            KEY_FORM,
            [one(k, 1, w) for k in ("a", "b") for w in (None, 0, MINUTE_US)],
        )
    # The sink's watermark is 1 ms short of the second window's end: only the first goes.
    assert keystate.forget_closed(run.pk, MINUTE_US, 2 * MINUTE_US - 1_000) == 4
    assert set(keystate.holders(run.pk, "totals")) == {
        at("a"),
        at("a", MINUTE_US),
        at("b"),
        at("b", MINUTE_US),
    }
    assert keystate.forget_closed(run.pk, MINUTE_US, 2 * MINUTE_US) == 4
    assert set(keystate.holders(run.pk, "totals")) == {at("a"), at("b")}


FLIGHTS = {
    "group_by": ["carrier", "origin"],
    "measures": [
        {"name": "flights", "fn": "count"},
        {"name": "mean_delay", "fn": "avg", "field": "dep_delay"},
        {"name": "tails", "fn": "count_distinct", "field": "tailnum"},
        {"name": "first_tail", "fn": "first", "field": "tailnum", "by": "time_hour"},
    ],
}


def flights(count: int, delay: int, tails: list[str], first: tuple[int, str]) -> Kept:
    """A partial of ``count`` flights of one group, delayed ``delay`` minutes in all."""
    return Kept(
        {
            "flights": count,
            "mean_delay": {"sum": str(delay), "count": count},
            "tails": sorted(tails),
            "first_tail": [first[0], first[1]],
        },
        count,
    )


def grouped_run() -> int:
    run = pending_run("running-totals")
    for node in run.topology["nodes"]:
        if node.get("operator") == "running":
            node["params"] = {**FLIGHTS, "keying": node["params"].get("keying", "key_groups")}
    run.save(update_fields=["topology"])
    return run.pk


def test_a_grouped_stage_keeps_each_measure_merged_per_group_over_batches_and_holders() -> None:
    run_id = grouped_run()
    grouping = keystate.state_grouping(FLIGHTS)
    ua = ("UA", "EWR")
    batches = [
        ("totals1", flights(2, 10, ["N1", "N2"], (300, "N2"))),
        ("totals1", flights(1, 4, ["N3"], (100, "N3"))),
        ("totals2", flights(3, 30, ["N1", "N4"], (200, "N4"))),
    ]
    for holder, partial in batches:
        keystate.fold(
            run_id,
            "totals",
            holder,
            grouping,
            keystate.group_deltas([GroupPartial(ua, partial.states, partial.records)]),
        )
    whole = Kept(
        {
            "flights": 6,
            "mean_delay": {"sum": "44", "count": 6},
            "tails": ["N1", "N2", "N3", "N4"],
            "first_tail": [100, "N3"],
        },
        6,
    )
    state = keystate.StateKey(digest(list(ua)))
    # The group's state over its two holders is the state of all six flights
    assert keystate.totals(run_id, "totals") == {state: whole}
    assert keystate.holders(run_id, "totals") == {state: ["totals1", "totals2"]}
    # Its records count where its slot is, per holder
    slot = group_slot(ua)
    progress = keystate.progress(run_id, "totals", ["totals1", "totals2"])
    assert progress.records == {("totals1", slot): 3, ("totals2", slot): 3}
    # And moving totals1's slots to totals2 merges the two rows into one, unchanged
    assert keystate.move(run_id, "totals", "totals1", "totals2", [slot]) == 1
    assert keystate.holders(run_id, "totals") == {state: ["totals2"]}
    assert keystate.totals(run_id, "totals") == {state: whole}
    assert keystate.misplaced(run_id, "totals", dict.fromkeys(range(KEY_SLOTS), "totals2")) == []
    assert keystate.misplaced(run_id, "totals", dict.fromkeys(range(KEY_SLOTS), "totals1")) == [
        state.key
    ]


def test_a_move_takes_only_the_named_slots() -> None:
    run_id = grouped_run()
    grouping = keystate.state_grouping(FLIGHTS)
    groups = [("UA", origin) for origin in ("EWR", "JFK", "LGA", "BOS", "SFO", "ORD")]
    assert len({group_slot(g) for g in groups}) > 1, "the groups need two slots or more"
    partials = [GroupPartial(g, flights(1, 1, ["N1"], (1, "N1")).states, 1) for g in groups]
    keystate.fold(run_id, "totals", "totals1", grouping, keystate.group_deltas(partials))
    moving = group_slot(groups[0])
    moved = keystate.move(run_id, "totals", "totals1", "totals2", [moving])
    held = keystate.holders(run_id, "totals")
    assert moved == sum(1 for g in groups if group_slot(g) == moving)
    assert {k.key: who for k, who in held.items()} == {
        digest(list(g)): ["totals2" if group_slot(g) == moving else "totals1"] for g in groups
    }


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_keeps_a_key_s_totals_as_its_measures_states_and_refuses_to_go_back() -> None:
    run = pending_run("running-totals")
    with back_to_latest():
        # Given a running stage's state kept as four columns (before migration 0023)
        migrate("0022_seen_records_keyed_by_digest")
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO orchestrator_keystate (run_id, stage, holder, key, window_us,"
                " slot, count, sum, min, max) VALUES (%s, 'totals', 'totals1', 'a', NULL, 7,"
                " 3, 7.5, 1.25, 4)",
                [run.pk],
            )
        # When the database is migrated
        migrate(latest())
        # Then the key's state is kept by its group's digest as the key form's measures:
        # count, sum, min and max exactly, the average of that sum and count, and no
        # distinct value (the columns never kept one)
        (row,) = KeyState.objects.filter(run=run).values_list("key", "states", "records", "slot")
        total = "7.5000000000"
        assert row == (
            digest(["a"]),
            {
                "count": 3,
                "sum": total,
                "min": "1.2500000000",
                "max": "4.0000000000",
                "avg": {"sum": total, "count": 3},
                "distinct_users": [],
            },
            3,
            7,
        )
        assert keystate.totals(run.pk, "totals") == {at("a"): Kept(row[1], 3)}
        assert KEY_FORM.finish(row[1])["avg"] == Decimal("2.5")
        # ...and going back is refused, saying why, the state as it was: it is keyed by
        # its group's digest, which the key's column cannot be made of again
        with pytest.raises(RuntimeError, match="state of the key form"):
            migrate("0022_seen_records_keyed_by_digest")
        assert KeyState.objects.filter(run=run).values_list("key", "states").get() == (
            row[0],
            row[1],
        )


@pytest.mark.django_db(transaction=True)
def test_the_four_columns_come_back_from_the_form_s_states_and_grouped_state_refuses() -> None:
    run = pending_run("running-totals")
    with back_to_latest():
        # Given the schema of migration 0023 and a key-form stage's state as its four
        # measures
        KeyState.objects.filter(run=run).delete()
        migrate("0023_keystate_measures")
        states = {"count": 3, "sum": "7.5", "min": "1.25", "max": "4"}
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO orchestrator_keystate (run_id, stage, holder, key, window_us,"
                " slot, states, records) VALUES (%s, 'totals', "
                "'totals1', 'a', NULL, 7, %s::jsonb, 3)",
                [run.pk, json.dumps(states)],
            )
        # When it goes back, the columns are its measures
        migrate("0022_seen_records_keyed_by_digest")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count, sum, min, max FROM orchestrator_keystate WHERE run_id = %s",
                [run.pk],
            )
            assert cursor.fetchall() == [(3, Decimal("7.5"), Decimal("1.25"), Decimal(4))]
            # (Not a state the way forward must read: it goes.)
            cursor.execute("DELETE FROM orchestrator_keystate WHERE run_id = %s", [run.pk])
        # ...while a grouped stage's state refuses to go back
        migrate("0023_keystate_measures")
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO orchestrator_keystate (run_id, stage, holder, key, window_us,"
                " slot, states, records) VALUES (%s, 'other', "
                "'totals2', 'b', NULL, 8, %s::jsonb, 1)",
                [run.pk, json.dumps({"flights": 1})],
            )
        with pytest.raises(DatabaseError, match="holds grouped measures"):
            migrate("0022_seen_records_keyed_by_digest")
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM orchestrator_keystate WHERE run_id = %s", [run.pk])
