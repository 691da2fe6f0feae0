"""The identities a deduplicate stage kept (orchestrator/ledger/seen.py): a batch keeps
those no batch kept before it, in its own transaction; one kept by a batch that has not
committed yet is waited for, and kept by whichever commits; each is forgotten after the
stage's period."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
from django.db import transaction

from orchestrator.ledger import seen
from orchestrator.models import SeenRecord
from tests.orchestrator.ledger.locks import second_waits_on_first
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_keeps_the_identities_no_batch_of_its_stage_kept_before() -> None:
    run = pending_run("reference")
    with transaction.atomic():
        assert seen.keep_first(run.pk, "dedup", ["a" * 32, "b" * 32]) == {"a" * 32, "b" * 32}
    with transaction.atomic():
        assert seen.keep_first(run.pk, "dedup", ["b" * 32, "c" * 32]) == {"c" * 32}
        assert seen.keep_first(run.pk, "other", ["b" * 32]) == {"b" * 32}
        assert seen.keep_first(run.pk, "dedup", []) == set()
    assert kept() == [
        ("dedup", "a" * 32),
        ("dedup", "b" * 32),
        ("dedup", "c" * 32),
        ("other", "b" * 32),
    ]


def test_a_batch_that_rolls_back_keeps_nothing() -> None:
    run = pending_run("reference")
    with pytest.raises(RuntimeError, match="crashed"), transaction.atomic():
        seen.keep_first(run.pk, "dedup", ["a" * 32])
        raise RuntimeError("the batch crashed before its commit")
    with transaction.atomic():
        assert seen.keep_first(run.pk, "dedup", ["a" * 32]) == {"a" * 32}


@pytest.mark.parametrize("first_commits", [True, False])
def test_an_identity_another_batch_is_keeping_is_kept_by_whichever_commits(
    first_commits: bool,
) -> None:
    # Given a batch that kept "a" and has not committed yet, when a second batch keeps
    # "a" and "b" (its insert of "a" waits for the first)
    run = pending_run("reference")
    found: list[set[str]] = []

    def second() -> None:
        with transaction.atomic():
            found.append(seen.keep_first(run.pk, "dedup", ["b" * 32, "a" * 32]))

    second_waits_on_first(
        lambda: seen.keep_first(run.pk, "dedup", ["a" * 32]),
        second,
        waiting="the second batch waiting on the first's identity",
        rollback=not first_commits,
    )
    # Then "a" is kept once: by the first if it committed, else by the second
    assert found == [{"b" * 32} if first_commits else {"a" * 32, "b" * 32}]
    assert kept() == [("dedup", "a" * 32), ("dedup", "b" * 32)]


def test_a_stage_forgets_what_it_kept_longer_ago_than_its_period() -> None:
    run = pending_run("reference")
    with transaction.atomic():
        seen.keep_first(run.pk, "dedup", ["a" * 32, "b" * 32])
        seen.keep_first(run.pk, "other", ["a" * 32])
    old = SeenRecord.objects.filter(digest=UUID(hex="a" * 32))
    old.update(kept_at=old.first().kept_at - timedelta(seconds=120))  # type: ignore[union-attr]
    assert seen.forget(run.pk, {"dedup": 60, "other": 600}) == 1
    assert kept() == [("dedup", "b" * 32), ("other", "a" * 32)]


def kept() -> list[tuple[str, str]]:
    """Each kept identity's stage and digest (32 hexadecimal digits), in order."""
    rows = SeenRecord.objects.values_list("stage", "digest")
    return sorted((stage, digest.hex) for stage, digest in rows)
