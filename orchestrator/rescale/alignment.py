"""Alignment (docs/spec/hot-rescale.md section 2, steps 3 and 4), in each instance's
own claim.

Owns: the marker rows (:func:`send_marker`); the step an instance takes once it holds
the marker of every upstream connection and no data from before them is left
(:func:`try_align`, :func:`align`: its routing becomes the new graph's, a stateful
instance hands its state to the owner of its best-matching new key group, a retiring
stateless one hands its queued data on, the marker goes downstream); a worker's claim
that aligns first under the same lock of the instance row (:func:`claim_batch`, which
then claims through ``orchestrator.ledger.segments``); the control side's poll for idle
instances (:func:`align_waiting`); and which tails have reported (:func:`tails_reported`).

Data carries the graph version its sender routed it with (``Segment.config``); a node
that is aligning claims data from before the rescale first, and a changed keyed stage
none from after it, so a batch never mixes the two sides of a marker.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from orchestrator.ledger import keystate, segments
from orchestrator.ledger.events import record_event
from orchestrator.models import Adjustment, Instance, Segment
from orchestrator.rescale.plan import reroute


@dataclass(frozen=True)
class Aligned:
    """An instance applied its adjustment while claiming."""

    instance: str
    version: int
    tail: bool
    forwarded: tuple[str, ...]
    retired: bool = False


def send_marker(run_id: int, upstream: str, node: str, version: int, now: dt.datetime) -> None:
    """The marker of adjustment ``version`` on the connection ``upstream -> node``."""
    Segment.objects.get_or_create(
        id=f"r{run_id}.m{version}.{upstream}>{node}",
        defaults={
            "run_id": run_id,
            "chunk": -1,
            "origin_file": -1,
            "origin_offset": 0,
            "origin_length": 0,
            "node": node,
            "upstream": upstream,
            "path": "",
            "bytes": 0,
            "available_at": now,
            "config": version,
            "marker": True,
        },
    )


def try_align(instance: Instance, now: dt.datetime) -> Aligned | None:
    """Align ``instance`` (its row locked by the caller) if it can; None if not yet."""
    version = instance.target
    markers = set(
        Segment.objects.filter(
            run_id=instance.run_id,
            node=instance.name,
            marker=True,
            config=version,
            state=Segment.State.QUEUED,
        ).values_list("upstream", flat=True)
    )
    if not set(instance.expect) <= markers:
        return None
    pending = Segment.objects.filter(
        run_id=instance.run_id, node=instance.name, marker=False
    ).exclude(state=Segment.State.DONE)
    if pending.filter(state=Segment.State.CLAIMED).exists():
        return None  # its outputs must reach the downstreams before the marker does
    if instance.barrier and pending.filter(config__lt=version, upstream__in=instance.expect):
        return None  # a keyed instance handles data from before the marker first
    return align(instance, now)


@dataclass
class AlignedClaim(segments.Claim):
    """A claim, and the rescale step its node took while claiming (if any)."""

    aligned: Aligned | None = None


def claim_batch(
    run_id: int,
    node: str,
    owner: str,
    *,
    max_segments: int,
    max_bytes: int,
    lease_s: float,
    rate_mbps: float = 0.0,
) -> AlignedClaim:
    """A worker's claim: the node aligns first if it takes part in a rescale and can,
    under the same lock of its instance row as the claim; while it cannot yet, data from
    before the rescale goes first, and a node behind a barrier (a changed keyed stage)
    takes none from after it."""
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(run_id=run_id, name=node).first()
        aligned = None
        order = segments.ARRIVAL_ORDER
        if instance is not None and instance.aligning:
            aligned = try_align(instance, timezone.now())
            if aligned is None:
                barrier = instance.target if instance.barrier else None
                order = segments.ClaimOrder(config_first=True, barrier=barrier)
        claim = segments.claim_batch(
            run_id,
            node,
            owner,
            max_segments=max_segments,
            max_bytes=max_bytes,
            lease_s=lease_s,
            rate_mbps=rate_mbps,
            order=order,
        )
    return AlignedClaim(claim.segments, claim.config, aligned)


def claim_sibling(
    run_id: int,
    node: str,
    owner: str,
    *,
    config: int,
    max_segments: int,
    max_bytes: int,
    lease_s: float,
) -> segments.Claim:
    """A claim of ``node``'s arrived data for a batch of its stage sibling at
    configuration ``config`` (``orchestrator/worker/batch.py``, siblings in one job):
    nothing while ``node`` takes part in a rescale, is being removed, or stands at
    another configuration, so a batch routes all it holds with one graph and no
    alignment waits on a batch that is not its instance's own."""
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(run_id=run_id, name=node).first()
        if instance is not None and (
            instance.aligning
            or instance.status != Instance.Status.ACTIVE
            or instance.config != config
        ):
            return segments.Claim([], config)
        return segments.claim_batch(
            run_id,
            node,
            owner,
            max_segments=max_segments,
            max_bytes=max_bytes,
            lease_s=lease_s,
        )


def align_waiting(run_id: int, version: int) -> list[Aligned]:
    """Align every instance of adjustment ``version`` that can align now and is not
    being claimed: the control side's poll, so an idle instance (or one whose next batch
    waits in a worker's queue) does not hold the adjustment up. Same step, same lock."""
    aligned = []
    for name in Instance.objects.filter(
        run_id=run_id, target=version, config__lt=version
    ).values_list("name", flat=True):
        with transaction.atomic():
            instance = (
                Instance.objects.select_for_update(skip_locked=True)
                .filter(run_id=run_id, name=name, target=version, config__lt=version)
                .first()
            )
            if instance is not None:
                step = try_align(instance, timezone.now())
                if step is not None:
                    aligned.append(step)
    return aligned


def align(instance: Instance, now: dt.datetime) -> Aligned:
    """Apply ``instance``'s adjustment (its row locked, every marker in): hand state or
    queued data on, forward the marker, move the instance to the new version."""
    version = instance.target
    run_id = instance.run_id
    Segment.objects.filter(run_id=run_id, node=instance.name, marker=True, config=version).update(
        state=Segment.State.DONE, done_at=now
    )
    for downstream in instance.forward:
        send_marker(run_id, instance.name, downstream, version, now)
    adjustment = Adjustment.objects.get(run_id=run_id, version=version)
    taken = 0
    hand = adjustment.plan["handoff"].get(instance.stage)
    if hand is not None:
        for source, target, slots in hand["takeovers"]:
            if source == instance.name:
                taken += keystate.move(run_id, instance.stage, source, target, slots)
    retiring = instance.status == Instance.Status.RETIRING
    handed = 0
    if retiring and not instance.barrier:
        # Stateless: what it still holds goes where the new graph sends its upstreams'
        # data (its replacement, for a hot migration) instead of waiting for it here.
        handed = reroute(
            Segment.objects.filter(
                run_id=run_id, node=instance.name, marker=False, state=Segment.State.QUEUED
            ),
            adjustment.after,
        )
    instance.config = version
    instance.aligned_at = now
    instance.save(update_fields=["config", "aligned_at"])
    what = (
        f"handed its {handed} queued segment(s) on and disconnected"
        if retiring and not instance.barrier
        else "finished its data and disconnected"
        if retiring
        else "applied its adjustment"
    )
    extra = f"; handed {taken} key(s) to its best-matching group's owner" if taken else ""
    tail = " and reported as a tail" if instance.tail else ""
    forwarded = f"forwarded the marker to {', '.join(instance.forward)}" if instance.forward else ""
    record_event(
        run_id,
        "adjust_aligned",
        f"{instance.name} has every marker of adjustment {version}: {what}{extra}"
        f"{'; ' + forwarded if forwarded else ''}{tail}",
        node=instance.name,
        data={
            "version": version,
            "forwarded": instance.forward,
            "tail": instance.tail,
            "keys_taken_over": taken,
        },
    )
    return Aligned(instance.name, version, instance.tail, tuple(instance.forward), retiring)


def tails_reported(adjustment: Adjustment) -> list[str]:
    """The subgraph's tails that have aligned (step 4), by the ledger."""
    return sorted(
        Instance.objects.filter(
            run_id=adjustment.run_id,
            name__in=adjustment.plan["tails"],
            config__gte=adjustment.version,
        ).values_list("name", flat=True)
    )
