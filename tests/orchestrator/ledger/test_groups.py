"""A sink batch's fold of grouped partials into the run's groups (orchestrator/ledger/
groups.py): a new group's row inserted, a known one's states merged; two sink batches
bringing the same new group at once both count, the second merging into the row the
first inserted."""

from __future__ import annotations

import pytest
from django.db import transaction

from orchestrator.ledger import groups as group_ledger
from orchestrator.models import ResultGroup, Run
from sparkjobs.merge import GroupPartial
from tests.orchestrator.ledger.flights import GROUPING, partial
from tests.orchestrator.ledger.locks import second_waits_on_first
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db(transaction=True)


def fold(run: Run, partials: list[GroupPartial]) -> None:
    with transaction.atomic():
        group_ledger.fold(run.pk, GROUPING, partials)


def test_a_known_group_merges_each_batch_and_a_new_one_is_inserted() -> None:
    run = pending_run("reference")
    fold(run, [partial("UA", 2, "1.5", ["N1", "N2"])])
    fold(run, [partial("UA", 3, "-0.5", ["N3", "N2"]), partial("AA", 1, "8", ["N9"])])
    assert group_ledger.group_rows(run, GROUPING) == [
        {"carrier": "AA", "flights": 1, "total": 8.0, "tails": 1},
        {"carrier": "UA", "flights": 5, "total": 1.0, "tails": 3},
    ]
    ua = ResultGroup.objects.get(run=run, group=["UA"])
    assert ua.records == 5 and ua.states["tails"] == ["N1", "N2", "N3"]


def test_two_batches_bringing_one_new_group_at_once_both_count() -> None:
    run = pending_run("reference")
    # Given a sink batch that inserted a new group and has not committed yet, when a
    # second batch brings the same group (its insert waits for the first's commit)
    second_waits_on_first(
        lambda: group_ledger.fold(run.pk, GROUPING, [partial("UA", 2, "1.5", ["N1"])]),
        lambda: fold(run, [partial("UA", 3, "2", ["N2"])]),
        waiting="the second batch waiting on the first's row",
    )
    # Then the group holds both batches' records, in one row
    assert group_ledger.group_rows(run, GROUPING) == [
        {"carrier": "UA", "flights": 5, "total": 3.5, "tails": 2}
    ]
