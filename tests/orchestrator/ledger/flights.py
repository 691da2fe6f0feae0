"""The grouping the ledger's tests of grouped measures fold: flights per carrier, their
delays' total and their distinct tail numbers; and a batch's partial of it."""

from __future__ import annotations

import pytest

from sparkjobs.measures import Grouping, State
from sparkjobs.merge import GroupPartial

GROUPING = Grouping.of(
    {
        "group_by": ["carrier"],
        "measures": [
            {"name": "flights", "fn": "count"},
            {"name": "total", "fn": "sum", "field": "delay"},
            {"name": "tails", "fn": "count_distinct", "field": "tail"},
        ],
    }
) or pytest.fail("a valid grouping")


def partial(
    carrier: str, flights: int, total: str, tails: list[str], *, window: int | None = None
) -> GroupPartial:
    """A batch's partial of one carrier's flights (in one window's, with ``window``)."""
    states: dict[str, State] = {"flights": flights, "total": total, "tails": sorted(tails)}
    return GroupPartial((carrier,), states, records=flights, window=window)
