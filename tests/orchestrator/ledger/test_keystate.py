"""A stateful stage's state per key and event-time window: folded exactly, dropped once
its window closes, never the state over all time."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.ledger import keystate
from orchestrator.ledger.keystate import StateKey, Totals
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MINUTE_US = 60_000_000


def one(value: int) -> Totals:
    return Totals(1, Decimal(value), Decimal(value), Decimal(value))


def test_a_window_s_state_folds_apart_from_other_windows_and_all_time() -> None:
    run = pending_run("running-totals")
    for value in (3, 5):
        keystate.fold(
            run.pk,
            "totals",
            "totals1",
            [
                (StateKey("a"), one(value)),
                (StateKey("a", 0), one(value)),
                (StateKey("a", MINUTE_US), one(value * 10)),
            ],
        )
    assert keystate.totals(run.pk, "totals") == {
        StateKey("a"): Totals(2, Decimal(8), Decimal(3), Decimal(5)),
        StateKey("a", 0): Totals(2, Decimal(8), Decimal(3), Decimal(5)),
        StateKey("a", MINUTE_US): Totals(2, Decimal(80), Decimal(30), Decimal(50)),
    }


def test_closing_a_window_drops_its_state_and_only_its_own() -> None:
    run = pending_run("running-totals")
    for holder in ("totals1", "totals2"):
        keystate.fold(
            run.pk,
            "totals",
            holder,
            [(StateKey(k, w), one(1)) for k in ("a", "b") for w in (None, 0, MINUTE_US)],
        )
    # The sink's watermark is 1 ms short of the second window's end: only the first goes.
    assert keystate.forget_closed(run.pk, MINUTE_US, 2 * MINUTE_US - 1_000) == 4
    assert set(keystate.holders(run.pk, "totals")) == {
        StateKey("a"),
        StateKey("a", MINUTE_US),
        StateKey("b"),
        StateKey("b", MINUTE_US),
    }
    assert keystate.forget_closed(run.pk, MINUTE_US, 2 * MINUTE_US) == 4
    assert set(keystate.holders(run.pk, "totals")) == {StateKey("a"), StateKey("b")}
