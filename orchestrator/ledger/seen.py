"""The identities a ``deduplicate`` stage kept (sparkjobs/dedup.py): one row per (run,
stage, digest), so that a record equal to one kept earlier, in any batch of any of the
stage's instances, is dropped.

A batch records its digests in the transaction that completes it (:func:`keep_first`),
which tells it those no batch had kept before: its outputs keep only their records.
Nothing is kept twice (the key refuses a digest twice, and a batch that crashes before
its commit recorded nothing), and nothing dropped that was not kept. A digest is
remembered for the stage's ``within_s`` after it was kept (:func:`forget`, from the
driver's sweep): a duplicate arriving later than that goes on, as Structured
Streaming's ``dropDuplicatesWithinWatermark`` lets one through once its state expired,
and a stream's state stays bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from django.utils import timezone

from balancer.document import PipelineDocument
from orchestrator.ledger import bound
from orchestrator.models import SeenRecord
from sparkjobs.catalog import DEDUP_WITHIN_S, operator_name


def keep_first(run_id: int, stage: str, digests: Sequence[str]) -> set[str]:
    """Record as kept those of ``digests`` (32 hexadecimal digits each) the stage has
    not kept yet, in the caller's transaction (the batch's); returns them.

    A digest another transaction recorded and has not committed yet is waited for: kept
    there once it commits (not returned here), or kept here if it rolls back. Digests
    go in sorted, so two batches that share some wait for one another in one order,
    never each for the other."""
    if not digests:
        return set()
    # Sent as text, in order (hexadecimal digits sort as the UUIDs they make), cast
    # and returned as text by the server: a UUID object per digest in Python would
    # cost as much as the insert's index.
    inserted = bound.fetch(
        "INSERT INTO orchestrator_seenrecord (run_id, stage, digest, kept_at)"
        " SELECT %b, %b, d::uuid, %b FROM unnest(%b::text[]) AS d"
        " ON CONFLICT (run_id, stage, digest) DO NOTHING"
        " RETURNING encode(uuid_send(digest), 'hex')",
        [run_id, stage, timezone.now(), sorted(digests)],
    )
    return {str(row[0]) for row in inserted}


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
