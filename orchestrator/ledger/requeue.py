"""Waiting data moved from one instance's pool to a sibling's (balancer/queued.py).

A segment keeps its id, file and place in the input; only the node whose pool holds it
changes (and ``migrated_from`` names the node it was first queued at), so the sink
merges it once whichever instance ran it, and an upstream's batch run again, inserting
the same id, adds nothing. Only whole segments that have arrived and that no batch
holds move: the claim of either node and the move never interleave, since both lock
the nodes' instance rows (the move in name order), and a claimed segment is never
taken.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from orchestrator.models import Instance, Segment


def move_waiting(run_id: int, node: str, to: str, max_bytes: float) -> int:
    """Move the newest waiting segments of ``node`` to ``to`` while they hold at most
    ``max_bytes`` together (the node's next batch keeps its oldest); returns the bytes
    moved."""
    if max_bytes <= 0 or node == to:
        return 0
    now = timezone.now()
    with transaction.atomic():
        list(
            Instance.objects.select_for_update()
            .filter(run_id=run_id, name__in=(node, to))
            .order_by("name")
            .values_list("pk", flat=True)
        )
        candidates = (
            Segment.objects.select_for_update(skip_locked=True)
            .filter(
                run_id=run_id,
                node=node,
                state=Segment.State.QUEUED,
                available_at__lte=now,
                marker=False,
            )
            .order_by("-available_at", "-chunk")
            .values_list("pk", "bytes")
        )
        chosen: list[str] = []
        size = 0
        for pk, length in candidates.iterator(chunk_size=200):
            if size + length > max_bytes:
                break
            chosen.append(pk)
            size += length
        if not chosen:
            return 0
        Segment.objects.filter(pk__in=chosen, migrated_from="").update(migrated_from=node)
        Segment.objects.filter(pk__in=chosen).update(node=to)
    return size
