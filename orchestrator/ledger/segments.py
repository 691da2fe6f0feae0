"""The durable segment ledger: every state change of data is one PostgreSQL transaction.

- Emit: the source's chunk row and its resume position are written together, and only
  by the driver of the current epoch (a paused old owner is refused).
- Claim: ``SELECT ... FOR UPDATE SKIP LOCKED`` under a lease, so two workers never take
  the same segment; an emulated node rate is a token bucket checked in the same step.
- Complete: outputs inserted (deterministic ids, so a re-run inserts nothing new) and
  inputs marked done, in one transaction that first checks the lease is still ours.
- Sink: the merged chunks (or key-group parts of chunks) are recorded under a unique
  constraint in the same transaction as the result rows, so nothing is merged twice.
- Rescale: a claim takes data in the order it is given (``ClaimOrder``): a node taking
  part in a hot rescale takes only data from before the markers until it has aligned,
  which ``orchestrator.rescale`` decides, under the same row lock; a retired instance's
  late completion is refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from balancer.units import MEGABIT
from orchestrator.ledger import groups as group_ledger
from orchestrator.ledger import windows as window_ledger
from orchestrator.models import Instance, MergedChunk, Run, Segment, Throttle
from sparkjobs.event_time import WindowSpec
from sparkjobs.keygroups import KEY_SLOTS
from sparkjobs.measures import Grouping
from sparkjobs.merge import GroupPartial


class StaleEpochError(RuntimeError):
    """A write from an owner whose epoch is no longer the run's."""


class LeaseLostError(RuntimeError):
    """The batch's lease expired and someone else took (or will take) the segments."""


class AlreadyMergedError(RuntimeError):
    def __init__(self, parts: set[tuple[int, int]]) -> None:
        super().__init__(f"(chunk, first slot) already merged: {sorted(parts)[:10]}")
        self.parts = parts


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
    migrated_from: str = ""
    link_mbps: float = 0.0  # bandwidth of the link it travels; 0 = unlimited
    config: int = 0  # graph version the sender routed it with
    slots_from: int = 0  # the key slots it carries, for a keyed stage's key group
    slots_to: int = KEY_SLOTS
    # Event-time marks of its chunk (windowed pipelines): the largest event time before
    # it (its watermark) and up to and with it. Carried unchanged through every stage.
    high_before_us: int | None = None
    high_us: int | None = None


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
                id=item.id,
                run_id=run_id,
                chunk=item.chunk,
                origin_file=item.origin_file,
                origin_offset=item.origin_offset,
                origin_length=item.origin_length,
                node=item.node,
                upstream=item.upstream,
                tag=item.tag[:200],
                path=item.path,
                bytes=item.bytes,
                migrated_from=item.migrated_from,
                available_at=arrival,
                epoch=epoch,
                config=item.config,
                slots_from=item.slots_from,
                slots_to=item.slots_to,
                high_before_us=item.high_before_us,
                high_us=item.high_us,
            )
        )
    Segment.objects.bulk_create(rows, ignore_conflicts=True)


def emit_chunk(
    run_id: int,
    epoch: int,
    copies: Sequence[NewSegment],
    position: Mapping[str, object],  # the run's source_position after the last chunk
    input_bytes: int,
) -> None:
    """Queue source chunks (each one copy per key group of a keyed stage; the pacer
    sends a slice's chunks together) and move the source's resume position past them,
    atomically."""
    now = timezone.now()
    with transaction.atomic():
        moved = Run.objects.filter(pk=run_id, epoch=epoch).update(
            source_position=position, input_bytes=input_bytes
        )
        if not moved:
            raise StaleEpochError(f"run {run_id}: epoch {epoch} is no longer current")
        _insert(run_id, epoch, copies, now)


def finish_source(run_id: int, epoch: int, chunks_total: int) -> None:
    with transaction.atomic():
        if not Run.objects.filter(pk=run_id, epoch=epoch).update(chunks_total=chunks_total):
            raise StaleEpochError(f"run {run_id}: epoch {epoch} is no longer current")


@dataclass(frozen=True)
class ClaimOrder:
    """Which queued segments a claim takes first.

    ``config_first``: data routed with an older graph version before newer data (a node
    aligning for a rescale drains what came before the markers); ``barrier``: none
    routed at or after this version (a node behind a changed keyed stage)."""

    config_first: bool = False
    barrier: int | None = None


ARRIVAL_ORDER = ClaimOrder()


@dataclass
class Claim:
    """A batch under lease and the graph version its outputs are routed with."""

    segments: list[Segment]
    config: int

    def __bool__(self) -> bool:
        return bool(self.segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)


def claim_batch(
    run_id: int,
    node: str,
    owner: str,
    *,
    max_segments: int,
    max_bytes: int,
    lease_s: float,
    rate_mbps: float = 0.0,
    order: ClaimOrder = ARRIVAL_ORDER,
) -> Claim:
    """Take up to ``max_segments`` arrived segments of ``node`` under a lease, in order,
    until they hold ``max_bytes``: the segment that crosses the bound is taken too (a
    soft bound, as Delta's ``maxBytesPerTrigger``), so a batch is never left one short
    of a whole backlog, and a segment larger than the bound still moves.

    The node's instance row is locked for the claim, so its alignment (when it takes
    part in a rescale, in the caller's transaction) and its claims never interleave. A
    batch holds segments of one key-group part only and never a marker.
    """
    now = timezone.now()
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(run_id=run_id, name=node).first()
        fields = ("config", "available_at", "chunk") if order.config_first else ()
        config = instance.config if instance is not None else 0
        bucket = None
        if rate_mbps > 0:
            bucket, _ = Throttle.objects.select_for_update().get_or_create(
                run_id=run_id, name=f"node:{node}", defaults={"free_at": now}
            )
            if bucket.free_at > now:
                return Claim([], config)
        query = Segment.objects.select_for_update(skip_locked=True).filter(
            run_id=run_id,
            node=node,
            state=Segment.State.QUEUED,
            available_at__lte=now,
            marker=False,
        )
        if order.barrier is not None:
            query = query.filter(config__lt=order.barrier)
        candidates = list(query.order_by(*(fields or ("available_at", "chunk")))[:max_segments])
        batch: list[Segment] = []
        size = 0
        for seg in candidates:
            if batch and (
                size >= max_bytes
                or seg.slots_from != batch[0].slots_from
                or seg.slots_to != batch[0].slots_to
            ):
                break
            batch.append(seg)
            size += seg.bytes
        if not batch:
            return Claim([], config)
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
    return Claim(batch, config)


def _refuse_ended(run_id: int) -> None:
    """A run that has ended takes no more merges: its result stays what it was when the
    run ended, and retention may keep its distinct counts and drop the sets behind them
    (``retention.freeze_results``).

    A key-share lock on the run's row (the lock the foreign keys of the rows a merge
    inserts take at its commit anyway, Django's constraints being deferred), taken first:
    every end of a run locks the row for update first (``lifecycle.set_status``,
    ``failures.record_failure`` and ``fail_run``, ``completion.settle``), so it waits for
    the merges in flight, and a merge after it sees the run ended. Merges do not wait
    for each other, nor for the source and the driver updating the row."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT status FROM {Run._meta.db_table} WHERE id = %s FOR KEY SHARE",  # noqa: S608 - the model's own table
            [run_id],
        )
        row = cursor.fetchone()
    status = row[0] if row else "gone"
    if status not in Run.ACTIVE:
        raise LeaseLostError(f"run {run_id} is {status}; its late batch is refused")


def _fence_retired(run_id: int, node: str) -> None:
    """A retired instance that wakes up late cannot write (hot-rescale.md)."""
    retired = Instance.objects.filter(
        run_id=run_id, name=node, status=Instance.Status.RETIRED
    ).exists()
    if retired:
        raise LeaseLostError(f"instance {node} was retired; its late batch is refused")


def _finish_inputs(
    owner: str,
    inputs: Sequence[Segment],
    malformed: dict[str, int],
    late: Mapping[str, int] | None = None,
    records: Mapping[str, int] | None = None,
) -> None:
    now = timezone.now()
    ids = [s.pk for s in inputs]
    counted = [int((records or {}).get(i, 0)) for i in ids]
    # One statement for the whole batch, its records counts with it.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Segment._meta.db_table} AS s
            SET state = %s, done_at = %s, records = u.records
            FROM unnest(%s::text[], %s::int[]) AS u(id, records)
            WHERE s.id = u.id AND s.state = %s AND s.lease_owner = %s
            """,  # noqa: S608 - the model's own table; values are parameters
            [Segment.State.DONE, now, ids, counted, Segment.State.CLAIMED, owner],
        )
        done = cursor.rowcount
    if done != len(ids):
        raise LeaseLostError(f"lease of {len(ids) - done} of {len(ids)} segments was lost")
    for seg_id, count in malformed.items():
        if count:
            Segment.objects.filter(pk=seg_id).update(malformed=count)
    for seg_id, count in (late or {}).items():
        if count:
            Segment.objects.filter(pk=seg_id).update(late=count)


def complete_batch(
    run_id: int,
    owner: str,
    inputs: Sequence[Segment],
    outputs: Sequence[NewSegment],
    malformed: dict[str, int],
    *,
    fold: Callable[[], None] | None = None,
    late: Mapping[str, int] | None = None,
    records: Mapping[str, int] | None = None,
) -> None:
    """Outputs in, inputs done (and a stateful operator's state folded), in one
    transaction; refused if the lease was lost or an instance whose inputs these are
    (a batch may hold its stage siblings', ``orchestrator/worker/batch.py``) was retired
    meanwhile. ``malformed``, ``late`` and ``records``: per input segment, what its
    operator counted in it."""
    now = timezone.now()
    with transaction.atomic():
        for node in sorted({s.node for s in inputs}):
            _fence_retired(run_id, node)
        _finish_inputs(owner, inputs, malformed, late, records)
        if fold is not None:
            fold()
        epoch = Run.objects.values_list("epoch", flat=True).get(pk=run_id)
        _insert(run_id, epoch, outputs, now)


def complete_sink_batch(
    run_id: int,
    sink: str,
    owner: str,
    inputs: Sequence[Segment],
    groups: Sequence[GroupPartial],
    *,
    grouping: Grouping,
    windows: WindowSpec | None = None,
    records: Mapping[str, int] | None = None,
) -> None:
    """Merge a batch's ``groups`` into the result by its ``grouping`` (a windowed
    pipeline's: into its open windows) and record its chunks (or chunk parts), once, in
    one transaction; ``records`` the partial rows each input held (what the sink's
    measured records per second count)."""
    with transaction.atomic():
        _refuse_ended(run_id)
        _fence_retired(run_id, sink)
        _finish_inputs(owner, inputs, {}, records=records)
        rows = [
            MergedChunk(
                run_id=run_id,
                chunk=s.chunk,
                origin_file=s.origin_file,
                origin_offset=s.origin_offset,
                origin_length=s.origin_length,
                slots_from=s.slots_from,
                slots_to=s.slots_to,
                segment=s.pk,
                sink=sink,
                high_us=s.high_us,
            )
            for s in inputs
        ]
        wanted = {(r.chunk, r.slots_from) for r in rows}
        prefix = Run.objects.values_list("merged_prefix", flat=True).get(pk=run_id)
        # Chunks below a continuous run's merged prefix have no rows any more
        # (orchestrator/ledger/coalesce.py): the prefix refuses them instead.
        folded = int((prefix or {}).get("chunk", 0))
        below = {pair for pair in wanted if pair[0] < folded}
        if below:
            raise AlreadyMergedError(below)
        already = {
            pair
            for pair in MergedChunk.objects.filter(
                run_id=run_id, chunk__in=[r.chunk for r in rows]
            ).values_list("chunk", "slots_from")
            if pair in wanted
        }
        if already:
            raise AlreadyMergedError(already)
        MergedChunk.objects.bulk_create(rows)  # the unique constraint is the last word
        closed = None
        if windows is not None:
            run = Run.objects.only("windows_closed").get(pk=run_id)
            closed = window_ledger.SinkWatermark.of(run).closed_us
        group_ledger.fold(run_id, grouping, groups, windows=windows, closed_us=closed)


def release(owner: str, segments: Sequence[Segment]) -> int:
    """Give claimed segments back to their pool unprocessed (a batch that was cancelled)."""
    return Segment.objects.filter(
        pk__in=[s.pk for s in segments], state=Segment.State.CLAIMED, lease_owner=owner
    ).update(state=Segment.State.QUEUED, lease_owner="", lease_expires=None)


def release_task(run_id: int, task_id: str) -> int:
    """Give back what a batch task that failed still held (its process died under it:
    nothing of it can complete any more), without waiting for its lease to run out."""
    return Segment.objects.filter(
        run_id=run_id, state=Segment.State.CLAIMED, lease_owner__contains=f":task={task_id}:"
    ).update(state=Segment.State.QUEUED, lease_owner="", lease_expires=None)


def renew_lease(segment_ids: Sequence[str], owner: str, lease_s: float) -> int:
    """Extend the lease of the segments ``owner`` still holds; how many it holds."""
    return Segment.objects.filter(
        pk__in=segment_ids, state=Segment.State.CLAIMED, lease_owner=owner
    ).update(lease_expires=timezone.now() + dt.timedelta(seconds=lease_s))


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
    held: int  # segments claimed under a live lease: a batch of the node is running
    waiting_bytes: int  # the bytes of the arrived_waiting segments


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
              COUNT(*) FILTER (WHERE state = 'claimed' AND lease_expires > now()),
              COALESCE(SUM(bytes) FILTER (WHERE state = 'queued' AND available_at <= now()), 0)
            FROM orchestrator_segment
            WHERE run_id = %s AND (state <> 'done' OR done_at >= %s OR available_at >= %s)
            GROUP BY node
            """,
            [since, since, run_id, since, since],
        )
        return {row[0]: NodeFlow(*(int(value) for value in row[1:])) for row in cursor.fetchall()}


def sent_bytes(run_id: int, since: dt.datetime) -> dict[str, int]:
    """Bytes each node sent on since ``since``: the outputs its completed batches
    inserted (in the transaction that marked their inputs done, so over the same window
    as :func:`node_flows`'s ``done_bytes``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT upstream, COALESCE(SUM(bytes), 0) FROM orchestrator_segment
            WHERE run_id = %s AND created_at >= %s AND NOT marker AND upstream <> ''
            GROUP BY upstream
            """,
            [run_id, since],
        )
        return {row[0]: int(row[1]) for row in cursor.fetchall()}


def unfinished(run_id: int) -> int:
    """Segments (and adjustment markers) not done yet."""
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
    """Do the merged chunks tile every input file exactly once, every key-group part
    of a split chunk included?

    ``files`` gives each input file's (data start, end) in its own units.
    """
    merged = list(
        MergedChunk.objects.filter(run=run).values_list(
            "chunk", "origin_file", "origin_offset", "origin_length", "slots_from", "slots_to"
        )
    )
    missing: list[str] = []
    overlaps: list[str] = []
    chunks: dict[int, tuple[int, int, int]] = {}
    slots: dict[int, list[tuple[int, int]]] = {}
    for chunk, file_index, offset, length, low, high in merged:
        chunks[chunk] = (file_index, offset, length)
        slots.setdefault(chunk, []).append((low, high))
    by_file: dict[int, list[tuple[int, int]]] = {}
    for file_index, offset, length in sorted(chunks.values()):
        by_file.setdefault(file_index, []).append((offset, length))
    # A continuous run's merged prefix (orchestrator/ledger/coalesce.py): its chunks'
    # rows are gone; they tiled every file before its file, and that one up to its offset.
    prefix = run.merged_prefix or {}
    folded = int(prefix.get("chunk", 0))
    if folded:
        last = int(prefix["file"])
        for file_index in range(min(last + 1, len(files))):
            start, end = files[file_index]
            reached = end if file_index < last else int(prefix["offset"])
            by_file.setdefault(file_index, []).insert(0, (start, reached - start))
    for file_index, (start, end) in enumerate(files):
        _tile(
            f"file {file_index}",
            start=start,
            end=end,
            spans=by_file.get(file_index, []),
            missing=missing,
            overlaps=overlaps,
        )
    for chunk, ranges in sorted(slots.items()):
        # A chunk split by key groups must have each of its key slots merged once.
        spans = [(low, high - low) for low, high in sorted(ranges)]
        _tile(
            f"chunk {chunk} slots",
            start=0,
            end=KEY_SLOTS,
            spans=spans,
            missing=missing,
            overlaps=overlaps,
        )
    duplicates = len(merged) - len({(chunk, low) for chunk, _, _, _, low, _ in merged})
    duplicates += sum(1 for chunk, *_ in merged if chunk < folded)
    expected = run.chunks_total
    count = len(chunks) + folded
    exact = not missing and not overlaps and duplicates == 0 and expected == count
    return Coverage(exact, expected, count, missing, duplicates, overlaps)


def _tile(
    what: str,
    *,
    start: int,
    end: int,
    spans: Sequence[tuple[int, int]],
    missing: list[str],
    overlaps: list[str],
) -> None:
    """Record where sorted ``(offset, length)`` spans fail to tile ``[start, end)``."""
    position = start
    for offset, length in spans:
        if offset > position:
            missing.append(f"{what} [{position}, {offset})")
        elif offset < position:
            overlaps.append(f"{what} [{offset}, {min(position, offset + length)})")
        position = max(position, offset + length)
    if position < end:
        missing.append(f"{what} [{position}, {end})")


def migrated_segments(run_id: int) -> int:
    return Segment.objects.filter(run_id=run_id).exclude(migrated_from="").count()


def late_records(run_id: int) -> int:
    """(record, window) pairs the operators found behind the watermark (windowed)."""
    return int(Segment.objects.filter(run_id=run_id).aggregate(n=Sum("late"))["n"] or 0)


def malformed_records(run_id: int) -> int:
    total = Segment.objects.filter(run_id=run_id).aggregate(total=Sum("malformed"))["total"]
    return int(total or 0)
