"""A landing folder takes each complete file once, in arrival order, numbers it durably,
never reads a changed file again, and cleans a file only once all of it is merged."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.ledger.ingested import ingested_extent
from orchestrator.ledger.segments import StaleEpochError
from orchestrator.models import Event, Run, Segment, SourceFile
from orchestrator.pipeline.inputs import Chunk, InputError, write_chunk
from orchestrator.source.landing import LandingFolderSource
from orchestrator.source.replay import ReplayError, write_ingested
from orchestrator.source.spec import LandingSpec

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

PARAMS = {"segment_mb": 64 / 1024 / 1024, "route_by": "key"}  # 64-byte chunks


def _run(spec: LandingSpec) -> Run:
    return Run.objects.create(
        pipeline_name="landing",
        topology={"nodes": [], "edges": []},
        policy={},
        input_spec=spec.to_json(),
        status="running",
        epoch=1,
    )


def _land(folder: Path, name: str, records: int, *, age_s: float = 10.0) -> Path:
    path = folder / name
    lines = (f'{{"key":"k{i % 3}","value":{i},"user":"u"}}\n' for i in range(records))
    path.write_text("".join(lines))
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def _read_all(source: LandingFolderSource) -> list[Chunk]:
    taken = []
    source.last_scan = 0.0
    while (chunk := source.next_chunk()) is not None:
        taken.append(chunk)
        source.committed(chunk)
    return taken


def test_complete_files_are_taken_once_in_arrival_order(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=1.0)
    run = _run(spec)
    _land(tmp_path, "b.jsonl", 4, age_s=20)
    _land(tmp_path, "a.jsonl", 4, age_s=10)  # arrived after b, though its name sorts first
    _land(tmp_path, ".hidden.jsonl", 4)
    _land(tmp_path, "_temporary.jsonl", 4)
    _land(tmp_path, "part.jsonl.tmp", 4)
    _land(tmp_path, "notes.txt", 4)
    _land(tmp_path, "growing.jsonl", 4, age_s=0)  # changed less than stable_s ago
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "a.jsonl")
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})

    chunks = _read_all(source)

    names = list(SourceFile.objects.filter(run=run).values_list("path", flat=True))
    assert [Path(n).name for n in names] == ["b.jsonl", "a.jsonl"]
    assert [c.file_index for c in chunks] == sorted(c.file_index for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    # Nothing is taken twice, and the stable file is taken once it has settled
    assert _read_all(source) == []
    stamp = time.time() - 5
    os.utime(tmp_path / "growing.jsonl", (stamp, stamp))
    later = _read_all(source)
    assert {c.file_index for c in later} == {2}
    assert SourceFile.objects.filter(run=run).count() == 3
    assert list(source.files) == [2], "files behind the ledger's position are not held"


def test_chunks_tile_each_file_and_the_extent_is_what_reached_the_ledger(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    first = _land(tmp_path, "1.jsonl", 10)
    _land(tmp_path, "2.jsonl", 10, age_s=5)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    chunks = _read_all(source)
    by_file: dict[int, int] = {}
    for chunk in chunks:
        assert chunk.offset == by_file.get(chunk.file_index, 0), "no gap, no overlap"
        by_file[chunk.file_index] = chunk.offset + chunk.length
    assert by_file[0] == first.stat().st_size
    last = chunks[-1]
    run.source_position = {"chunk": last.index + 1, "file": last.file_index, "offset": by_file[1]}
    run.save()
    assert ingested_extent(run) == [(0, by_file[0]), (0, by_file[1])]
    assert set(SourceFile.objects.filter(run=run).values_list("state", flat=True)) == {"read"}


def test_a_restarted_source_goes_on_after_the_last_chunk_in_the_ledger(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    _land(tmp_path, "1.jsonl", 10)
    _land(tmp_path, "2.jsonl", 10, age_s=5)
    every = _read_all(LandingFolderSource(run.pk, 1, spec, PARAMS, {}))
    cut = every[len(every) // 2]
    # A new driver starts from the position written with the chunk it had emitted last
    position = {"chunk": cut.index + 1, "file": cut.file_index, "offset": cut.offset + cut.length}
    resumed = _read_all(LandingFolderSource(run.pk, 2, spec, PARAMS, position))
    assert [(c.index, c.file_index, c.offset) for c in resumed] == [
        (c.index, c.file_index, c.offset) for c in every[len(every) // 2 + 1 :]
    ]


def test_a_file_changed_after_it_was_taken_is_reported_once_and_not_read_again(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    path = _land(tmp_path, "1.jsonl", 4)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    before = _read_all(source)
    path.write_text('{"key":"k9","value":1,"user":"u"}\n' * 50)  # rewritten
    assert _read_all(source) == []
    assert _read_all(source) == []
    events = Event.objects.filter(run=run, kind="source_file_changed")
    assert events.count() == 1
    assert "changed after it was taken in" in events.get().reason
    assert SourceFile.objects.get(run=run).changed
    assert before


def test_a_file_taken_whole_is_copied_so_a_rewrite_in_place_leaves_the_taken_bytes(
    tmp_path,
) -> None:
    spec = LandingSpec(str(tmp_path / "in"), "*.jsonl", stable_s=0)
    run = _run(spec)
    (tmp_path / "in").mkdir()
    path = _land(tmp_path / "in", "1.jsonl", 4)
    taken = path.read_bytes()
    (chunk,) = _read_all(LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {}))
    segment = tmp_path / "segments" / "c0.jsonl"
    write_chunk(segment, chunk)
    with path.open("r+b") as rewritten:  # the same file, written over where it lies
        rewritten.write(b"X" * len(taken))
    assert not chunk.in_place
    assert segment.read_bytes() == taken


def test_a_file_whose_name_says_another_format_is_reported_once_and_left_untaken(
    tmp_path,
) -> None:
    spec = LandingSpec(str(tmp_path), "*", stable_s=0)
    run = _run(spec)
    _land(tmp_path, "rows.parquet", 4, age_s=20)
    _land(tmp_path, "day.jsonl", 4, age_s=10)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    chunks = _read_all(source)
    assert [
        Path(n).name for n in SourceFile.objects.filter(run=run).values_list("path", flat=True)
    ] == ["day.jsonl"]
    assert {c.path for c in chunks} == {str(tmp_path / "day.jsonl")}
    assert _read_all(source) == []
    (event,) = Event.objects.filter(run=run, kind="source_file_changed")
    assert "rows.parquet: its name says Parquet, but the source reads JSON lines" in event.reason
    assert (tmp_path / "rows.parquet").exists()


def test_a_file_deleted_after_it_was_taken_is_reported_once_and_the_others_read(
    tmp_path,
) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    _land(tmp_path, "1.jsonl", 20, age_s=20)
    gone = _land(tmp_path, "2.jsonl", 4, age_s=10)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    source.last_scan = 0.0
    first = source.next_chunk()  # both files taken, the first being read
    assert first is not None and first.file_index == 0
    source.committed(first)
    gone.unlink()  # before any of it was cut
    rest = _read_all(source)
    assert {c.file_index for c in rest} == {0}
    row = SourceFile.objects.get(run=run, index=1)
    assert row.changed and row.size == 0  # nothing of it was read
    assert Event.objects.filter(run=run, kind="source_file_changed").count() == 1


def test_a_file_truncated_while_read_ends_where_the_run_read_it(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    path = _land(tmp_path, "1.jsonl", 20)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    source.last_scan = 0.0
    first = source.next_chunk()
    assert first is not None
    source.committed(first)
    with path.open("r+") as handle:
        handle.truncate(10)
    assert source.next_chunk() is None
    row = SourceFile.objects.get(run=run)
    assert row.changed and row.size == first.offset + first.length


def test_only_the_driver_of_the_current_epoch_takes_files(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    _land(tmp_path, "1.jsonl", 4)
    stale = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    Run.objects.filter(pk=run.pk).update(epoch=2)
    with pytest.raises(StaleEpochError):
        _read_all(stale)
    assert not SourceFile.objects.filter(run=run).exists()


def test_a_file_is_archived_only_once_all_of_it_is_merged(tmp_path) -> None:
    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    spec = LandingSpec(str(landing), "*.jsonl", stable_s=0, clean="archive", archive=str(archive))
    run = _run(spec)
    _land(landing, "1.jsonl", 4)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    (chunk,) = _read_all(source)
    segment = Segment.objects.create(
        id="s1",
        run=run,
        chunk=chunk.index,
        origin_file=chunk.file_index,
        origin_offset=chunk.offset,
        origin_length=chunk.length,
        node="task1",
        path="",
        bytes=chunk.size,
        available_at=run.created_at,
    )
    source.housekeeping()
    assert (landing / "1.jsonl").exists(), "a file with unfinished data stays"
    segment.state = "done"
    segment.save()
    source.last_housekeeping = 0.0
    source.housekeeping()
    assert not (landing / "1.jsonl").exists()
    assert (archive / "1.jsonl").exists()
    row = SourceFile.objects.get(run=run)
    assert row.state == "cleaned" and row.path == str(archive / "1.jsonl")
    # The name is free again: new data landing under it is a new file
    _land(landing, "1.jsonl", 2)
    source.last_scan = 0.0
    assert source.next_chunk() is not None
    assert SourceFile.objects.filter(run=run).count() == 2


def test_a_stopped_source_finishes_the_file_it_is_in_and_takes_no_other(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    first = _land(tmp_path, "1.jsonl", 20, age_s=20)
    _land(tmp_path, "2.jsonl", 20, age_s=10)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    source.last_scan = 0.0
    read = [source.next_chunk() for _ in range(4)]
    assert all(c is not None and c.file_index == 0 for c in read)
    source.committed(read[0])  # the ledger has the first chunk; three are read ahead
    kept = source.stop([c for c in read[1:] if c is not None])
    assert kept == read[1:], "the read-ahead of the file in progress is still sent"
    rest = []
    while (chunk := source.next_chunk()) is not None:
        rest.append(chunk)
    assert {c.file_index for c in rest} == {0}
    last = rest[-1]
    assert last.offset + last.length == first.stat().st_size, "the file is finished"
    assert source.exhausted
    assert source.next_chunk() is None


def test_a_source_stopped_between_files_stops_at_once(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0)
    run = _run(spec)
    _land(tmp_path, "1.jsonl", 2)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    chunks = _read_all(source)  # the whole file is in the ledger
    _land(tmp_path, "2.jsonl", 2)
    source.last_scan = 0.0
    ahead = source.next_chunk()
    assert ahead is not None and ahead.file_index == 1
    assert source.stop([ahead]) == [], "a file not begun is left for the next run"
    assert source.exhausted and source.next_chunk() is None
    assert chunks


def test_rows_of_files_cleaned_below_the_merged_prefix_go(tmp_path, settings) -> None:
    settings.BPCONSOLE_SOURCE_FILES_KEEP_S = 0
    landing = tmp_path / "landing"
    landing.mkdir()
    spec = LandingSpec(str(landing), "*.jsonl", stable_s=0, clean="delete")
    run = _run(spec)
    for name in ("1.jsonl", "2.jsonl"):
        _land(landing, name, 3, age_s=20 if name == "1.jsonl" else 10)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    chunks = _read_all(source)
    assert [c.file_index for c in chunks] == [0, 1]
    last = chunks[-1]
    run.source_position = {"chunk": 2, "file": 1, "offset": last.offset + last.length}
    run.merged_prefix = {"chunk": 2, "file": 1, "offset": last.offset + last.length, "parts": 2}
    run.save()
    source.last_housekeeping = 0.0
    source.housekeeping()  # both files are cleaned (no segment is unfinished)
    source.housekeeping(now=True)  # and the first one's row, below the prefix, goes
    assert list(SourceFile.objects.filter(run=run).values_list("index", flat=True)) == [1]
    assert ingested_extent(run) == [(0, 0), (0, last.offset + last.length)]
    # A driver started after that numbers the next file after the last, not over a gap
    _land(landing, "3.jsonl", 3, age_s=5)
    Run.objects.filter(pk=run.pk).update(epoch=2)
    resumed = LandingFolderSource(run.pk, 2, spec, {"segment_mb": 1}, run.source_position)
    assert [c.file_index for c in _read_all(resumed)] == [2]
    assert list(SourceFile.objects.filter(run=run).values_list("index", flat=True)) == [1, 2]
    # And the plain job can no longer be given all it took in: said, not half done
    with pytest.raises(ReplayError, match="forgot 1 of its files"):
        write_ingested(run, tmp_path / "replay.jsonl")


def test_a_checkpoint_goes_on_after_the_files_its_completed_runs_read(tmp_path) -> None:
    # Given a kept folder that a completed run with checkpoint "day" read whole
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0, clean="keep", checkpoint="day")
    _land(tmp_path, "1.jsonl", 4, age_s=30)
    rewritten = _land(tmp_path, "2.jsonl", 4, age_s=20)
    first = _run(spec)
    assert (
        len({c.file_index for c in _read_all(LandingFolderSource(first.pk, 1, spec, PARAMS, {}))})
        == 2
    )
    first.status = Run.Status.COMPLETED
    first.save()
    # When files land after it, one of its files is rewritten, and a new run starts
    _land(tmp_path, "3.jsonl", 4, age_s=10)
    rewritten.write_text('{"key":"k9","value":1,"user":"u"}\n')
    second = _run(spec)
    taken = _read_all(LandingFolderSource(second.pk, 1, spec, PARAMS, {}))
    # Then the new run reads only the new file; the rewritten one is reported, not read
    names = [
        Path(p).name for p in SourceFile.objects.filter(run=second).values_list("path", flat=True)
    ]
    assert names == ["3.jsonl"]
    assert {c.file_index for c in taken} == {0}
    changed = Event.objects.get(run=second, kind="source_file_changed")
    assert "2.jsonl changed after it was taken in" in changed.reason
    # And a run without the checkpoint, or with another, reads every file there
    for other in (
        LandingSpec(str(tmp_path), stable_s=0),
        LandingSpec(str(tmp_path), stable_s=0, checkpoint="audit"),
    ):
        run = _run(other)
        _read_all(LandingFolderSource(run.pk, 1, other, PARAMS, {}))
        assert SourceFile.objects.filter(run=run).count() == 3


def test_the_files_of_a_failed_run_are_read_again_by_its_checkpoint(tmp_path) -> None:
    spec = LandingSpec(str(tmp_path), "*.jsonl", stable_s=0, clean="keep", checkpoint="day")
    _land(tmp_path, "1.jsonl", 4)
    failed = _run(spec)
    _read_all(LandingFolderSource(failed.pk, 1, spec, PARAMS, {}))
    failed.status = Run.Status.FAILED
    failed.save()
    # Its results were abandoned: the checkpoint holds only what a completed run merged
    again = _run(spec)
    _read_all(LandingFolderSource(again.pk, 1, spec, PARAMS, {}))
    assert SourceFile.objects.filter(run=again).count() == 1


def _swap_for_link(folder: Path, target: Path) -> None:
    """``folder`` renamed away and a symbolic link to ``target`` put in its place."""
    folder.rename(folder.with_name(folder.name + ".old"))
    folder.symlink_to(target, target_is_directory=True)


def test_a_folder_swapped_for_a_link_mid_run_fails_and_nothing_is_read_or_deleted_through_it(
    tmp_path, settings
) -> None:
    # Given a landing run (clean: delete) over a folder of the input root, one file read
    root, other = tmp_path / "inputs", tmp_path / "other"
    (root / "landing").mkdir(parents=True)
    other.mkdir()
    settings.INPUT_ROOTS = [str(root)]
    spec = LandingSpec(str(root / "landing"), "*.jsonl", stable_s=0, clean="delete")
    run = _run(spec)
    _land(root / "landing", "1.jsonl", 4)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    assert len(_read_all(source)) == 1
    # When the folder is swapped for a link to a folder outside the root, holding a file
    # of the same name and a new one
    _swap_for_link(root / "landing", other)
    _land(other, "1.jsonl", 4)
    _land(other, "2.jsonl", 4)
    # Then cleaning up fails, naming the folder, and deletes nothing through the link
    with pytest.raises(InputError) as failed:
        source.housekeeping(now=True)
    assert str(failed.value) == (
        f"the landing folder cannot be opened: {root / 'landing'}: 'landing' is a symbolic "
        "link, which is never followed"
    )
    # And the next listing fails the same way, taking nothing from it
    source.last_scan = 0.0
    with pytest.raises(InputError, match="'landing' is a symbolic link"):
        source.next_chunk()
    source.close()
    assert sorted(p.name for p in other.iterdir()) == ["1.jsonl", "2.jsonl"]
    assert list(SourceFile.objects.filter(run=run).values_list("path", flat=True)) == [
        str(root / "landing" / "1.jsonl")
    ]
    assert (root / "landing.old" / "1.jsonl").exists()


def test_a_folder_above_the_landing_folder_swapped_for_a_link_before_the_run_fails_it(
    tmp_path, settings
) -> None:
    # Given a landing folder two levels below the input root, then the folder between
    # them replaced by a link to a folder outside the root holding the same names
    root, outside = tmp_path / "inputs", tmp_path / "outside"
    (root / "team" / "landing").mkdir(parents=True)
    (outside / "landing").mkdir(parents=True)
    _land(outside / "landing", "secret.jsonl", 4)
    settings.INPUT_ROOTS = [str(root)]
    spec = LandingSpec(str(root / "team" / "landing"), "*.jsonl", stable_s=0, clean="delete")
    run = _run(spec)
    _swap_for_link(root / "team", outside)
    # Then the source does not open, saying which folder, and nothing is taken
    with pytest.raises(InputError, match="'team' is a symbolic link, which is never followed"):
        LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    assert not SourceFile.objects.filter(run=run).exists()
    assert (outside / "landing" / "secret.jsonl").exists()


def test_a_landing_folder_replaced_by_another_folder_fails_the_run(tmp_path, settings) -> None:
    root = tmp_path / "inputs"
    (root / "landing").mkdir(parents=True)
    settings.INPUT_ROOTS = [str(root)]
    spec = LandingSpec(str(root / "landing"), "*.jsonl", stable_s=0)
    run = _run(spec)
    source = LandingFolderSource(run.pk, 1, spec, PARAMS, {})
    (root / "landing").rename(root / "landing.old")
    (root / "landing").mkdir()
    _land(root / "landing", "1.jsonl", 4)
    source.last_scan = 0.0
    with pytest.raises(InputError, match="was replaced by another folder since the run opened"):
        source.next_chunk()
    source.close()
    assert not SourceFile.objects.filter(run=run).exists()


def test_an_archive_folder_swapped_for_a_link_receives_nothing_through_it(
    tmp_path, settings
) -> None:
    root, outside = tmp_path / "inputs", tmp_path / "outside"
    (root / "landing").mkdir(parents=True)
    outside.mkdir()
    settings.INPUT_ROOTS = [str(root)]
    spec = LandingSpec(
        str(root / "landing"), "*.jsonl", stable_s=0, clean="archive", archive=str(root / "old")
    )
    run = _run(spec)
    _land(root / "landing", "1.jsonl", 4)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    assert (root / "old").is_dir(), "made when the source opened"
    assert len(_read_all(source)) == 1
    _swap_for_link(root / "old", outside)
    with pytest.raises(InputError, match=r"archive folder cannot be opened: .*'old' is a symbolic"):
        source.housekeeping(now=True)
    source.close()
    assert list(outside.iterdir()) == []
    assert (root / "landing" / "1.jsonl").exists()


def test_what_a_run_took_in_is_not_read_again_through_a_folder_swapped_for_a_link(
    tmp_path, settings
) -> None:
    # Given a landing run that read a file (kept in its folder), then the folder swapped
    # for a link to a folder holding a file of the same name
    root, outside = tmp_path / "inputs", tmp_path / "outside"
    (root / "landing").mkdir(parents=True)
    outside.mkdir()
    settings.INPUT_ROOTS = [str(root)]
    spec = LandingSpec(str(root / "landing"), "*.jsonl", stable_s=0)
    run = _run(spec)
    _land(root / "landing", "1.jsonl", 4)
    source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
    (chunk,) = _read_all(source)
    source.close()
    Run.objects.filter(pk=run.pk).update(source_position={"file": 0, "offset": chunk.length})
    _land(outside, "1.jsonl", 4)
    _swap_for_link(root / "landing", outside)
    # Then writing out what it took in is refused, naming the file and the link
    with pytest.raises(ReplayError, match="'landing' is a symbolic link, which is never followed"):
        write_ingested(Run.objects.get(pk=run.pk), tmp_path / "replay.jsonl")


def test_a_file_is_archived_to_another_file_system_through_the_folders_held(tmp_path) -> None:
    shm = Path("/dev/shm")  # noqa: S108 - mkdtemp makes a private folder in it
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (a tmpfs at /dev/shm) on this machine")
    archive = Path(tempfile.mkdtemp(dir=os.path.realpath(shm))) / "archive"
    try:
        landing = tmp_path / "landing"
        landing.mkdir()
        spec = LandingSpec(
            str(landing), "*.jsonl", stable_s=0, clean="archive", archive=str(archive)
        )
        run = _run(spec)
        body = _land(landing, "1.jsonl", 4).read_bytes()
        (landing / "1.jsonl").chmod(0o640)
        source = LandingFolderSource(run.pk, 1, spec, {"segment_mb": 1}, {})
        assert len(_read_all(source)) == 1
        source.housekeeping(now=True)
        source.close()
        assert not (landing / "1.jsonl").exists()
        assert (archive / "1.jsonl").read_bytes() == body
        assert (archive / "1.jsonl").stat().st_mode & 0o777 == 0o640
        assert SourceFile.objects.get(run=run).path == str(archive / "1.jsonl")
    finally:
        shutil.rmtree(archive.parent)
