"""A bounded run's input files are the user's, named when the run was created: a whole
one becomes its segment in place, a larger one is cut and copied (ADR 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.pipeline.inputs import (
    Chunk,
    InputError,
    input_record,
    resolve_inputs,
    write_chunk,
)
from orchestrator.source.files import FileSource


def _lines(count: int, start: int = 0) -> bytes:
    return b"".join(
        b'{"key":"k%d","value":%d,"user":"u"}\n' % (i % 3, i) for i in range(start, count)
    )


def _read_all(source: FileSource) -> list[Chunk]:
    taken = []
    while (chunk := source.next_chunk()) is not None:
        taken.append(chunk)
    return taken


def test_a_bounded_run_reads_its_whole_files_in_place_and_copies_the_ranges_of_larger_ones(
    tmp_path: Path,
) -> None:
    small = [tmp_path / f"part-{n}.jsonl" for n in range(3)]
    for n, path in enumerate(small):
        path.write_bytes(_lines(10 * (n + 1), 10 * n))
    large = tmp_path / "large.jsonl"
    large.write_bytes(_lines(200))
    segment_mb = 2048 / 2**20  # 2 KB segments: the large file is cut, the parts are not
    source = FileSource({"paths": [*map(str, small), str(large)]}, {"segment_mb": segment_mb}, {})

    taken = _read_all(source)

    assert [c.in_place for c in taken[:3]] == [True] * 3
    assert len(taken) > 4 and not any(c.in_place for c in taken[3:])
    out = tmp_path / "segments"
    for chunk in taken:
        write_chunk(out / f"c{chunk.index}.jsonl", chunk)
    assert [(out / f"c{n}.jsonl").stat().st_ino for n in range(3)] == [
        p.stat().st_ino for p in small
    ]
    assert b"".join((out / f"c{c.index}.jsonl").read_bytes() for c in taken[3:]) == (
        large.read_bytes()
    )
    assert large.stat().st_nlink == 1


def test_the_source_reads_what_the_run_recorded_and_never_follows_a_link_put_there_since(
    tmp_path: Path,
) -> None:
    # Given a run's record of two files
    grown, swapped = tmp_path / "grown.jsonl", tmp_path / "swapped.jsonl"
    grown.write_bytes(_lines(10))
    swapped.write_bytes(_lines(10))
    record = {**input_record(resolve_inputs(str(tmp_path / "*.jsonl"), "jsonl")), "format": "jsonl"}
    # When one grows and the other is replaced by a link to a file outside
    with grown.open("ab") as more:
        more.write(_lines(20, 10))
    (tmp_path / "secret").write_bytes(b"not for the run\n")
    swapped.unlink()
    swapped.symlink_to(tmp_path / "secret")
    source = FileSource(record, {"segment_mb": 1}, {})
    # Then the source reads the grown file as recorded, and refuses the link
    first = source.next_chunk()
    assert first is not None
    write_chunk(tmp_path / "out" / "c0.jsonl", first)
    assert (tmp_path / "out" / "c0.jsonl").read_bytes() == _lines(10)
    with pytest.raises(InputError, match=r"swapped\.jsonl changed since it was measured"):
        source.next_chunk()
