"""A continuous run's merged chunks fold into its merged prefix: the rows go, coverage
stays exact, and a chunk below the prefix can never be merged again."""

from __future__ import annotations

import random

import pytest

from orchestrator.ledger import segments
from orchestrator.ledger.coalesce import coalesce
from orchestrator.models import MergedChunk, Run, Segment, SourceFile
from orchestrator.run.snapshot import progress
from sparkjobs.keygroups import KEY_SLOTS
from tests.orchestrator.key_form import KEY_FORM

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _stream_run(chunks: int, per_chunk: int = 10) -> Run:
    return Run.objects.create(
        pipeline_name="stream",
        topology={"nodes": [], "edges": []},
        policy={},
        input_spec={"kind": "stream", "stream": "s", "format": "jsonl"},
        status="running",
        epoch=1,
        source_position={"chunk": chunks, "file": 0, "offset": chunks * per_chunk},
    )


def _merge(run: Run, chunk: int, parts: list[tuple[int, int]], per_chunk: int = 10) -> None:
    MergedChunk.objects.bulk_create(
        MergedChunk(
            run=run,
            chunk=chunk,
            origin_file=0,
            origin_offset=chunk * per_chunk,
            origin_length=per_chunk,
            slots_from=low,
            slots_to=high,
            segment=f"s{chunk}.{low}",
            sink="output",
        )
        for low, high in parts
    )


def _coverage(run: Run) -> segments.Coverage:
    run.refresh_from_db()
    run.chunks_total = int(run.source_position["chunk"])
    return segments.coverage(run, [(0, int(run.source_position["offset"]))])


def test_merged_chunks_fold_into_the_prefix_and_coverage_stays_exact() -> None:
    run = _stream_run(6)
    for chunk in range(6):
        _merge(run, chunk, [(0, KEY_SLOTS)] if chunk != 2 else [(0, 100), (100, KEY_SLOTS)])
    assert coalesce(run.pk, older_than_s=0) == 6
    run.refresh_from_db()
    assert run.merged_prefix == {"chunk": 6, "file": 0, "offset": 60, "parts": 7}
    assert not MergedChunk.objects.filter(run=run).exists()
    assert _coverage(run).exact


def test_the_prefix_stops_at_a_chunk_not_wholly_merged_or_still_unfinished() -> None:
    run = _stream_run(5)
    _merge(run, 0, [(0, KEY_SLOTS)])
    _merge(run, 1, [(0, 100)])  # one key-group part of chunk 1 is not merged yet
    _merge(run, 2, [(0, KEY_SLOTS)])
    assert coalesce(run.pk, older_than_s=0) == 1
    _merge(run, 1, [(100, KEY_SLOTS)])
    Segment.objects.create(
        id="open3",
        run=run,
        chunk=3,
        origin_file=0,
        origin_offset=30,
        origin_length=10,
        node="output",
        path="",
        bytes=1,
        available_at=run.created_at,
    )
    _merge(run, 3, [(0, 10)])
    assert coalesce(run.pk, older_than_s=0) == 2  # chunks 1 and 2; 3 is unfinished
    run.refresh_from_db()
    assert run.merged_prefix["chunk"] == 3
    assert not _coverage(run).exact  # chunks 3 and 4 are still missing


def test_recent_merges_stay_rows() -> None:
    run = _stream_run(2)
    _merge(run, 0, [(0, KEY_SLOTS)])
    assert coalesce(run.pk, older_than_s=3600) == 0
    assert MergedChunk.objects.filter(run=run).count() == 1


def test_a_chunk_below_the_prefix_is_never_merged_again() -> None:
    run = _stream_run(3)
    for chunk in range(3):
        _merge(run, chunk, [(0, KEY_SLOTS)])
    coalesce(run.pk, older_than_s=0)
    # A sink batch of chunk 1 that its lease still lets finish (a second copy of it)
    late = Segment.objects.create(
        id="late1",
        run=run,
        chunk=1,
        origin_file=0,
        origin_offset=10,
        origin_length=10,
        node="output",
        path="",
        bytes=1,
        slots_from=0,
        slots_to=KEY_SLOTS,
        state="claimed",
        lease_owner="me",
        available_at=run.created_at,
    )
    with pytest.raises(segments.AlreadyMergedError):
        segments.complete_sink_batch(run.pk, "output", "me", [late], [], grouping=KEY_FORM)
    assert _coverage(run).exact


@pytest.mark.parametrize("seed", range(5))
def test_folding_at_any_moments_gives_the_coverage_the_rows_gave(seed: int) -> None:
    rng = random.Random(seed)
    run = _stream_run(40)
    order = list(range(40))
    rng.shuffle(order)
    for chunk in order:
        cut = rng.randrange(1, KEY_SLOTS)
        parts = [(0, KEY_SLOTS)] if rng.random() < 0.5 else [(0, cut), (cut, KEY_SLOTS)]
        _merge(run, chunk, parts)
        if rng.random() < 0.3:
            coalesce(run.pk, older_than_s=0, limit=rng.randrange(1, 10))
    coalesce(run.pk, older_than_s=0)
    result = _coverage(run)
    assert result.exact and result.chunks_merged == 40
    run.refresh_from_db()
    assert run.merged_prefix["chunk"] == 40


def test_a_landing_folder_prefix_crosses_from_file_to_file() -> None:
    run = Run.objects.create(
        pipeline_name="landing",
        topology={"nodes": [], "edges": []},
        policy={},
        input_spec={"kind": "folder", "folder": "/x", "format": "jsonl"},
        status="running",
        epoch=1,
        source_position={"chunk": 4, "file": 2, "offset": 30},
    )
    for index, size in enumerate([20, 0, 30]):  # the second file is empty
        SourceFile.objects.create(run=run, index=index, path=f"/x/{index}", size=size, mtime_ns=0)
    origins = [(0, 0, 10), (0, 10, 10), (2, 0, 15), (2, 15, 15)]
    MergedChunk.objects.bulk_create(
        MergedChunk(
            run=run,
            chunk=chunk,
            origin_file=file_index,
            origin_offset=offset,
            origin_length=length,
            segment=f"s{chunk}",
            sink="output",
        )
        for chunk, (file_index, offset, length) in enumerate(origins)
    )
    assert coalesce(run.pk, older_than_s=0) == 4
    run.refresh_from_db()
    assert run.merged_prefix == {"chunk": 4, "file": 2, "offset": 30, "parts": 4}
    run.chunks_total = 4
    assert segments.coverage(run, [(0, 20), (0, 0), (0, 30)]).exact


def test_old_balancer_events_thin_to_one_per_kind_node_and_hour() -> None:
    import datetime as dt

    from django.utils import timezone

    from orchestrator.ledger.events import thin_events
    from orchestrator.models import Event

    run = _stream_run(1)
    now = timezone.now()
    old = now - dt.timedelta(hours=3)
    for _ in range(30):
        for kind in ("set_flag", "set_shares"):
            Event.objects.create(run=run, kind=kind, node="task1", reason="r", actor="balancer")
    Event.objects.create(run=run, kind="operator_migrate", node="task1", reason="r", actor="user")
    Event.objects.create(run=run, kind="driver", reason="r", actor="system")
    Event.objects.filter(run=run).update(time=old.replace(minute=0, second=0))
    for _recent in range(5):  # recent ones stay whole
        Event.objects.create(run=run, kind="set_flag", node="task1", reason="r", actor="balancer")
    assert thin_events(run.pk, older_than_s=3600) == 58
    kinds = list(Event.objects.filter(run=run).values_list("kind", flat=True))
    assert sorted(kinds) == sorted(
        ["set_flag", "set_shares", "operator_migrate", "driver", *["set_flag"] * 5]
    )
    assert thin_events(run.pk, older_than_s=3600) == 0


def test_a_chunk_merged_in_key_group_parts_counts_once_and_by_its_share() -> None:
    # Given a keyed run of 4 chunks of 10 bytes: chunk 0 merged in two halves of the key
    # slots, chunk 1 in one half only
    run = _stream_run(4)
    half = KEY_SLOTS // 2
    _merge(run, 0, [(0, half), (half, KEY_SLOTS)])
    _merge(run, 1, [(0, half)])
    Run.objects.filter(pk=run.pk).update(input_spec={**run.input_spec, "extent_total": 40})
    run.refresh_from_db()
    # Then the progress shown counts whole chunks and bytes, never a part as a chunk
    shown = progress(run)
    assert shown["merged_chunks"] == 1
    assert shown["completed_fraction"] == (10 + 5) / 40
    # ...and chunks folded into the merged prefix count as chunks, not as their parts
    Run.objects.filter(pk=run.pk).update(
        merged_prefix={"chunk": 1, "file": 0, "offset": 10, "parts": 2}
    )
    MergedChunk.objects.filter(run=run, chunk=0).delete()
    run.refresh_from_db()
    assert progress(run)["merged_chunks"] == 1
