"""The durable segment ledger: every state change of data is one PostgreSQL transaction.

- Emit: the source's chunk row and its resume position are written together, and only
  by the driver of the current epoch (a paused old owner is refused).
- Claim: ``SELECT ... FOR UPDATE SKIP LOCKED`` under a lease, so two workers never take
  the same segment; an emulated node rate is a token bucket checked in the same step.
- Complete: outputs inserted (deterministic ids, so a re-run inserts nothing new) and
  inputs marked done, in one transaction that first checks the lease is still ours.
- Sink: the merged chunks are recorded under a unique constraint in the same transaction
  as the result rows, so nothing is merged twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from orchestrator.models import MergedChunk, Run, Segment, Throttle

MEGABIT = 1_000_000 / 8  # bytes per second in one Mb/s


class StaleEpochError(RuntimeError):
    """A write from an owner whose epoch is no longer the run's."""


class LeaseLostError(RuntimeError):
    """The batch's lease expired and someone else took (or will take) the segments."""


class AlreadyMergedError(RuntimeError):
    def __init__(self, chunks: set[int]) -> None:
        super().__init__(f"chunks already merged: {sorted(chunks)[:10]}")
        self.chunks = chunks


@dataclass(frozen=True)
class NewSegment:
    id: str
    chunk: int
    origin_file: int
    origin_offset: int
    origin_length: int
    node: str
    upstream: str
    tag: str
    path: str
    bytes: int
    records: int
    migrated_from: str = ""
    link_mbps: float = 0.0  # bandwidth of the link it travels; 0 = unlimited


def bump_epoch(run_id: int) -> int:
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(epoch=F("epoch") + 1)
        return Run.objects.values_list("epoch", flat=True).get(pk=run_id)


def _arrival(run_id: int, link: str, size: int, mbps: float, now: dt.datetime) -> dt.datetime:
    """When ``size`` bytes sent now over ``link`` arrive: links serialise their traffic."""
    if mbps <= 0:
        return now
    bucket, _ = Throttle.objects.select_for_update().get_or_create(
        run_id=run_id, name=f"link:{link}", defaults={"free_at": now}
    )
    start = max(now, bucket.free_at)
    bucket.free_at = start + dt.timedelta(seconds=size / (mbps * MEGABIT))
    bucket.save(update_fields=["free_at"])
    return bucket.free_at


def _insert(run_id: int, epoch: int, items: Sequence[NewSegment], now: dt.datetime) -> None:
    # Lock link buckets in a fixed order so concurrent completions cannot deadlock.
    rows = []
    for item in sorted(items, key=lambda s: (s.upstream, s.node, s.id)):
        arrival = _arrival(run_id, f"{item.upstream}>{item.node}", item.bytes, item.link_mbps, now)
        rows.append(
            Segment(
                id=item.id, run_id=run_id, chunk=item.chunk, origin_file=item.origin_file,
                origin_offset=item.origin_offset, origin_length=item.origin_length,
                node=item.node, upstream=item.upstream, tag=item.tag[:200], path=item.path,
                bytes=item.bytes, records=item.records, migrated_from=item.migrated_from,
                available_at=arrival, epoch=epoch,
            )
        )  # fmt: skip
    Segment.objects.bulk_create(rows, ignore_conflicts=True)


def emit_chunk(
    run_id: int, epoch: int, segment: NewSegment, position: dict[str, int], input_bytes: int
) -> None:
    """Queue a source chunk and move the source's resume position, atomically."""
    now = timezone.now()
    with transaction.atomic():
        moved = Run.objects.filter(pk=run_id, epoch=epoch).update(
            source_position=position, input_bytes=input_bytes
        )
        if not moved:
            raise StaleEpochError(f"run {run_id}: epoch {epoch} is no longer current")
        _insert(run_id, epoch, [segment], now)


def finish_source(run_id: int, epoch: int, chunks_total: int) -> None:
    with transaction.atomic():
        if not Run.objects.filter(pk=run_id, epoch=epoch).update(chunks_total=chunks_total):
            raise StaleEpochError(f"run {run_id}: epoch {epoch} is no longer current")


def claim_batch(
    run_id: int,
    node: str,
    owner: str,
    *,
    max_segments: int,
    max_bytes: int,
    lease_s: float,
    rate_mbps: float = 0.0,
) -> list[Segment]:
    """Take up to ``max_segments`` arrived segments of ``node`` under a lease."""
    now = timezone.now()
    with transaction.atomic():
        bucket = None
        if rate_mbps > 0:
            bucket, _ = Throttle.objects.select_for_update().get_or_create(
                run_id=run_id, name=f"node:{node}", defaults={"free_at": now}
            )
            if bucket.free_at > now:
                return []
        candidates = list(
            Segment.objects.select_for_update(skip_locked=True)
            .filter(run_id=run_id, node=node, state=Segment.State.QUEUED, available_at__lte=now)
            .order_by("available_at", "chunk")[:max_segments]
        )
        batch: list[Segment] = []
        size = 0
        for seg in candidates:
            if batch and size + seg.bytes > max_bytes:
                break
            batch.append(seg)
            size += seg.bytes
        if not batch:
            return []
        Segment.objects.filter(pk__in=[s.pk for s in batch]).update(
            state=Segment.State.CLAIMED,
            lease_owner=owner,
            lease_expires=now + dt.timedelta(seconds=lease_s),
            attempts=F("attempts") + 1,
            claimed_at=now,
        )
        if bucket is not None:
            # The node is busy for as long as its emulated rate needs for these bytes.
            bucket.free_at = max(now, bucket.free_at) + dt.timedelta(
                seconds=size / (rate_mbps * MEGABIT)
            )
            bucket.save(update_fields=["free_at"])
    return batch


def _finish_inputs(owner: str, inputs: Sequence[Segment], malformed: dict[str, int]) -> None:
    now = timezone.now()
    ids = [s.pk for s in inputs]
    done = Segment.objects.filter(
        pk__in=ids, state=Segment.State.CLAIMED, lease_owner=owner
    ).update(state=Segment.State.DONE, done_at=now)
    if done != len(ids):
        raise LeaseLostError(f"lease of {len(ids) - done} of {len(ids)} segments was lost")
    for seg_id, count in malformed.items():
        if count:
            Segment.objects.filter(pk=seg_id).update(malformed=count)


def complete_batch(
    run_id: int,
    owner: str,
    inputs: Sequence[Segment],
    outputs: Sequence[NewSegment],
    malformed: dict[str, int],
) -> None:
    """Outputs in, inputs done, in one transaction; refused if the lease was lost."""
    now = timezone.now()
    with transaction.atomic():
        _finish_inputs(owner, inputs, malformed)
        epoch = Run.objects.values_list("epoch", flat=True).get(pk=run_id)
        _insert(run_id, epoch, outputs, now)


@dataclass(frozen=True)
class KeyDelta:
    key: str
    count: int
    sum: Decimal
    min: Decimal
    max: Decimal
    distinct: tuple[str, ...]


def complete_sink_batch(
    run_id: int,
    sink: str,
    owner: str,
    inputs: Sequence[Segment],
    deltas: Iterable[KeyDelta],
) -> None:
    """Merge a batch into the result and record its chunks, once, in one transaction."""
    with transaction.atomic():
        _finish_inputs(owner, inputs, {})
        rows = [
            MergedChunk(
                run_id=run_id, chunk=s.chunk, origin_file=s.origin_file,
                origin_offset=s.origin_offset, origin_length=s.origin_length,
                segment=s.pk, sink=sink,
            )
            for s in inputs
        ]  # fmt: skip
        already = set(
            MergedChunk.objects.filter(
                run_id=run_id, chunk__in=[r.chunk for r in rows]
            ).values_list("chunk", flat=True)
        )
        if already:
            raise AlreadyMergedError(already)
        MergedChunk.objects.bulk_create(rows)  # the unique constraint is the last word
        _upsert_results(run_id, list(deltas))


def _upsert_results(run_id: int, deltas: list[KeyDelta]) -> None:
    if not deltas:
        return
    with connection.cursor() as cursor:
        cursor.executemany(
            """
            INSERT INTO orchestrator_resultkey (run_id, key, count, sum, min, max)
            VALUES (%s, %s, %s, %s, %s, %s)
            ON CONFLICT (run_id, key) DO UPDATE SET
              count = orchestrator_resultkey.count + EXCLUDED.count,
              sum = orchestrator_resultkey.sum + EXCLUDED.sum,
              min = LEAST(orchestrator_resultkey.min, EXCLUDED.min),
              max = GREATEST(orchestrator_resultkey.max, EXCLUDED.max)
            """,
            [(run_id, d.key, d.count, d.sum, d.min, d.max) for d in deltas],
        )
        cursor.executemany(
            """
            INSERT INTO orchestrator_resultdistinct (run_id, key, value)
            VALUES (%s, %s, %s) ON CONFLICT DO NOTHING
            """,
            [(run_id, d.key, value) for d in deltas for value in d.distinct],
        )


def reclaim_expired(run_id: int | None = None) -> int:
    """Give segments whose lease ran out back to their node's pool."""
    query = Q(state=Segment.State.CLAIMED, lease_expires__lt=timezone.now())
    if run_id is not None:
        query &= Q(run_id=run_id)
    return Segment.objects.filter(query).update(
        state=Segment.State.QUEUED, lease_owner="", lease_expires=None
    )


@dataclass(frozen=True)
class NodeFlow:
    queued_bytes: int  # queued or being processed: the node's pool
    arrived_bytes: int  # bytes that arrived in the window
    done_bytes: int  # bytes processed in the window
    arrived_waiting: int  # queued segments that have arrived (ready to claim)
    claimed: int


def node_flows(run_id: int, since: dt.datetime) -> dict[str, NodeFlow]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT node,
              COALESCE(SUM(bytes) FILTER (WHERE state <> 'done'), 0),
              COALESCE(SUM(bytes) FILTER (WHERE available_at >= %s
                                             AND available_at <= now()), 0),
              COALESCE(SUM(bytes) FILTER (WHERE state = 'done' AND done_at >= %s), 0),
              COUNT(*) FILTER (WHERE state = 'queued' AND available_at <= now()),
              COUNT(*) FILTER (WHERE state = 'claimed')
            FROM orchestrator_segment
            WHERE run_id = %s AND (state <> 'done' OR done_at >= %s OR available_at >= %s)
            GROUP BY node
            """,
            [since, since, run_id, since, since],
        )
        return {
            row[0]: NodeFlow(int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]))
            for row in cursor.fetchall()
        }


def unfinished(run_id: int) -> int:
    return Segment.objects.filter(run_id=run_id).exclude(state=Segment.State.DONE).count()


@dataclass(frozen=True)
class Coverage:
    exact: bool
    chunks_expected: int | None
    chunks_merged: int
    missing: list[str]
    duplicates: int
    overlaps: list[str]

    def to_json(self) -> dict[str, object]:
        return {
            "status": "exact" if self.exact else "incomplete",
            "chunks_expected": self.chunks_expected,
            "chunks_merged": self.chunks_merged,
            "missing": self.missing[:20],
            "duplicates": self.duplicates,
            "overlaps": self.overlaps[:20],
        }


def coverage(run: Run, files: Sequence[tuple[int, int]]) -> Coverage:
    """Do the merged chunks tile every input file exactly once?

    ``files`` gives each input file's (data start, end) in its own units.
    """
    merged = list(
        MergedChunk.objects.filter(run=run)
        .order_by("origin_file", "origin_offset")
        .values_list("origin_file", "origin_offset", "origin_length")
    )
    missing: list[str] = []
    overlaps: list[str] = []
    by_file: dict[int, list[tuple[int, int]]] = {}
    for file_index, offset, length in merged:
        by_file.setdefault(file_index, []).append((offset, length))
    for file_index, (start, end) in enumerate(files):
        position = start
        for offset, length in by_file.get(file_index, []):
            if offset > position:
                missing.append(f"file {file_index} [{position}, {offset})")
            elif offset < position:
                overlaps.append(f"file {file_index} [{offset}, {min(position, offset + length)})")
            position = max(position, offset + length)
        if position < end:
            missing.append(f"file {file_index} [{position}, {end})")
    merged_count = len(merged)
    duplicates = merged_count - len({(f, o) for f, o, _ in merged})
    expected = run.chunks_total
    exact = not missing and not overlaps and duplicates == 0 and expected == merged_count
    return Coverage(exact, expected, merged_count, missing, duplicates, overlaps)


def migrated_segments(run_id: int) -> int:
    return Segment.objects.filter(run_id=run_id).exclude(migrated_from="").count()


def malformed_records(run_id: int) -> int:
    total = Segment.objects.filter(run_id=run_id).aggregate(total=Sum("malformed"))["total"]
    return int(total or 0)
