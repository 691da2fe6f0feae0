"""The reference pipeline's key form (``key``, ``value`` and ``distinct``) as the ledger
keeps it: the grouping its parameters are read as (sparkjobs/key_form.py), one key's
partial states of its measures, a sink batch's partial of one key and a run's result
row of one key."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

import pytest

from orchestrator.ledger.groups import digest
from orchestrator.models import ResultGroup, Run
from sparkjobs.measures import Grouping, State
from sparkjobs.merge import GroupPartial

# Per key: count, sum, min, max, avg of value and distinct_users, the count of distinct
# users; what a stage of the form with no parameters, or the reference's, computes.
KEY_FORM = Grouping.of({}) or pytest.fail("the key form names no grouping")


def key_states(
    count: int,
    total: Decimal | int,
    low: Decimal | int,
    high: Decimal | int,
    users: Iterable[str] = (),
) -> dict[str, State]:
    """One key's partial states of the form's measures: ``count`` records whose values
    add up to ``total``, from ``low`` to ``high``, of ``users``."""
    exact = str(total)
    return {
        "count": count,
        "sum": exact,
        "min": str(low),
        "max": str(high),
        "avg": {"sum": exact, "count": count},
        "distinct_users": sorted(set(users)),
    }


def key_partial(key: str, states: dict[str, State], *, window: int | None = None) -> GroupPartial:
    """A batch's partial of one key, of ``states`` (:func:`key_states`; in one window's,
    with ``window``)."""
    return GroupPartial((key,), states, records=int(str(states["count"])), window=window)


def key_group(run: Run, key: str, states: dict[str, State]) -> ResultGroup:
    """The run's result row of one key over all time, its ``states`` (:func:`key_states`)
    merged from its batches' partials and not yet finished."""
    return ResultGroup.objects.create(
        run=run,
        digest=digest([key]),
        group=[key],
        states=states,
        records=int(str(states["count"])),
    )
