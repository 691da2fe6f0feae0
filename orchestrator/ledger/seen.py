"""The identities a ``deduplicate`` stage kept (sparkjobs/dedup.py): one row per (run,
stage, digest), so that a record equal to one kept earlier, in any batch of any of the
stage's instances, is dropped.

A batch asks which of its digests are kept already before it writes its outputs
(:func:`already_kept`), and records the ones it kept in its own transaction
(:func:`keep`): a digest another batch recorded in between refuses the batch, which runs
again and then finds it kept. Nothing is kept twice, and nothing dropped that was not
kept. A digest is remembered for the stage's ``within_s`` after it was kept
(:func:`forget`, from the driver's sweep): a duplicate arriving later than that goes on,
as Structured Streaming's ``dropDuplicatesWithinWatermark`` lets one through once its
state expired, and a stream's state stays bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from uuid import UUID

from django.utils import timezone

from balancer.document import PipelineDocument
from orchestrator.ledger import bound
from orchestrator.ledger.segments import LeaseLostError
from orchestrator.models import SeenRecord
from sparkjobs.catalog import DEDUP_WITHIN_S, operator_name


class KeptMeanwhileError(LeaseLostError):
    """Another batch kept one of this batch's records first: this batch's outputs would
    repeat it, so it is refused, and its segments given back to run again."""


def already_kept(run_id: int, stage: str, digests: Sequence[str]) -> set[str]:
    """Those of ``digests`` (32 hexadecimal digits each) the stage kept already."""
    if not digests:
        return set()
    found = bound.fetch(
        "SELECT digest FROM orchestrator_seenrecord"
        " WHERE run_id = %b AND stage = %b AND digest = ANY(%b::uuid[])",
        [run_id, stage, _uuids(digests)],
    )
    return {UUID(str(row[0])).hex for row in found}


def keep(run_id: int, stage: str, digests: Sequence[str]) -> None:
    """Record ``digests`` as kept, in the caller's transaction (the batch's); raises
    :class:`KeptMeanwhileError` if another batch recorded one of them first."""
    if not digests:
        return
    inserted = bound.fetch(
        "INSERT INTO orchestrator_seenrecord (run_id, stage, digest, kept_at)"
        " SELECT %b, %b, d, %b FROM unnest(%b::uuid[]) AS d"
        " ON CONFLICT (run_id, stage, digest) DO NOTHING RETURNING 1",
        [run_id, stage, timezone.now(), _uuids(digests)],
    )
    if len(inserted) != len(digests):
        raise KeptMeanwhileError(
            f"{len(digests) - len(inserted)} of the batch's records were kept by another "
            f"batch of stage {stage} meanwhile; the batch runs again"
        )


def _uuids(digests: Sequence[str]) -> list[UUID]:
    """Digests as UUIDs, sent in binary and in order: the key's index takes a sorted
    run of them in fewer page visits than the same in random order."""
    return sorted(UUID(hex=d) for d in digests)


def periods(doc: PipelineDocument) -> dict[str, float]:
    """Each deduplicate stage of ``doc`` and how long it remembers an identity."""
    return {
        node.get("stage") or node["name"]: float(
            (node.get("params") or {}).get("within_s", DEDUP_WITHIN_S[1])
        )
        for node in doc["nodes"]
        if operator_name(node) == "deduplicate"
    }


def forget(run_id: int, within_s: Mapping[str, float]) -> int:
    """Forget each stage's digests kept longer ago than its ``within_s``; returns how
    many."""
    now = timezone.now()
    forgotten = 0
    for stage, seconds in within_s.items():
        gone, _ = SeenRecord.objects.filter(
            run_id=run_id, stage=stage, kept_at__lt=now - timedelta(seconds=seconds)
        ).delete()
        forgotten += gone
    return forgotten
