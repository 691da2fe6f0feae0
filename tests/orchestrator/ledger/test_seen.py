"""The identities a deduplicate stage kept (orchestrator/ledger/seen.py): asked for,
recorded in a batch's transaction, a batch refused whose identity another batch
recorded meanwhile (nothing of it written), and forgotten after the stage's period."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
from django.db import transaction

from orchestrator.ledger import seen
from orchestrator.models import SeenRecord
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_finds_what_the_stage_kept_and_records_what_it_keeps() -> None:
    run = pending_run("reference")
    with transaction.atomic():
        seen.keep(run.pk, "dedup", ["a" * 32, "b" * 32])
    assert seen.already_kept(run.pk, "dedup", ["b" * 32, "c" * 32]) == {"b" * 32}
    assert seen.already_kept(run.pk, "other", ["b" * 32]) == set()
    assert seen.already_kept(run.pk, "dedup", []) == set()


def test_a_batch_whose_record_another_batch_kept_meanwhile_is_refused_whole() -> None:
    run = pending_run("reference")
    with transaction.atomic():
        seen.keep(run.pk, "dedup", ["a" * 32])
    refused = pytest.raises(seen.KeptMeanwhileError, match="1 of the batch's records")
    with refused, transaction.atomic():
        seen.keep(run.pk, "dedup", ["c" * 32, "a" * 32])
    assert kept() == [("dedup", "a" * 32)]


def test_a_stage_forgets_what_it_kept_longer_ago_than_its_period() -> None:
    run = pending_run("reference")
    with transaction.atomic():
        seen.keep(run.pk, "dedup", ["a" * 32, "b" * 32])
        seen.keep(run.pk, "other", ["a" * 32])
    old = SeenRecord.objects.filter(digest=UUID(hex="a" * 32))
    old.update(kept_at=old.first().kept_at - timedelta(seconds=120))  # type: ignore[union-attr]
    assert seen.forget(run.pk, {"dedup": 60, "other": 600}) == 1
    assert kept() == [("dedup", "b" * 32), ("other", "a" * 32)]


def kept() -> list[tuple[str, str]]:
    """Each kept identity's stage and digest (32 hexadecimal digits), in order."""
    return sorted(
        (stage, digest.hex) for stage, digest in SeenRecord.objects.values_list("stage", "digest")
    )
