"""The source's cut: chunks tile the input, never split a record, and become segment
files holding exactly the input's bytes in its own format (JSON lines and CSV are copied
by the kernel, never read into the source; Parquet is cut by rows). Where the source
allows it, a file that is one whole chunk becomes its segment by a hard link (ADR 11).
"""

from __future__ import annotations

import csv
import errno
import io
import itertools
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.pipeline import inputs
from orchestrator.pipeline.inputs import Chunk, InputError, chunks, resolve_inputs, write_chunk
from sparkjobs import segments


def cut(
    path: Path,
    fmt: str = "jsonl",
    segment_bytes: int = 64,
    *,
    in_place: bool = False,
    **start: int,
) -> list[Chunk]:
    files = resolve_inputs(str(path), fmt)
    return list(
        chunks(files, fmt, segment_bytes=segment_bytes, route_by="key", in_place=in_place, **start)
    )


def written(chunks_: list[Chunk], folder: Path) -> list[bytes]:
    out = []
    for chunk in chunks_:
        target = folder / f"c{chunk.index}.jsonl"
        assert write_chunk(target, chunk) == chunk.size
        out.append(target.read_bytes())
    return out


def reference_cuts(data: bytes, segment_bytes: int) -> list[tuple[int, int]]:
    """The rule: a chunk ends after the first newline at or past ``segment_bytes``."""
    cuts, offset = [], 0
    while offset < len(data):
        found = data.find(b"\n", offset + segment_bytes - 1)
        end = len(data) if found < 0 else found + 1
        cuts.append((offset, end - offset))
        offset = end
    return cuts


def test_json_lines_are_cut_at_line_ends_and_copied_byte_for_byte(tmp_path: Path) -> None:
    records = [{"key": f"k{i % 3}", "value": i, "user": f"u{i}"} for i in range(40)]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "in.jsonl").write_bytes(data)
    got = cut(tmp_path / "in.jsonl", segment_bytes=100)
    bodies = written(got, tmp_path)
    assert b"".join(bodies) == data
    assert all(body.endswith(b"\n") for body in bodies)
    assert [(c.offset, c.length) for c in got] == reference_cuts(data, 100)
    for chunk, body in zip(got, bodies, strict=True):
        assert chunk.tag == json.loads(body.splitlines()[0])["key"]


def test_a_last_line_without_newline_gets_one_in_its_segment(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"a"}\n{"key":"b"}')
    got = cut(tmp_path / "in.jsonl", segment_bytes=4)
    assert written(got, tmp_path) == [b'{"key":"a"}\n', b'{"key":"b"}\n']
    assert [(c.length, c.size) for c in got] == [(12, 12), (11, 12)]


def test_the_tag_is_the_first_non_empty_line_even_past_the_read_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "CUT_WINDOW", 8)
    (tmp_path / "in.jsonl").write_bytes(b'\n\n{"key":"far","pad":"xxxxxxxxxxxxxxxx"}\n')
    (chunk,) = cut(tmp_path / "in.jsonl", segment_bytes=1024)
    assert chunk.tag == "far"


def test_resuming_at_a_position_yields_the_rest_of_the_same_chunks(tmp_path: Path) -> None:
    data = b"".join(b'{"key":"k%d","value":%d}\n' % (i % 4, i) for i in range(60))
    (tmp_path / "in.jsonl").write_bytes(data)
    whole = cut(tmp_path / "in.jsonl", segment_bytes=90)
    third = whole[3]
    rest = cut(
        tmp_path / "in.jsonl",
        segment_bytes=90,
        start_file=0,
        start_offset=third.offset,
        start_index=3,
    )
    assert rest == whole[3:]


def test_without_a_kernel_copy_the_bytes_go_through_user_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(*_: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    monkeypatch.setattr(segments, "COPY_STEP", 5)
    data = b"".join(b'{"key":"k","value":%d}\n' % i for i in range(30))
    (tmp_path / "in.jsonl").write_bytes(data)
    assert b"".join(written(cut(tmp_path / "in.jsonl", segment_bytes=70), tmp_path)) == data


def test_a_failed_copy_leaves_no_segment_file(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"a"}\n')
    target = tmp_path / "out" / "c0.jsonl"
    fd = os.open(tmp_path / "in.jsonl", os.O_RDONLY)
    with pytest.raises(OSError, match="ended"):
        segments.copy_atomic(target, fd, 0, 100, newline=False)
    os.close(fd)
    assert list(target.parent.iterdir()) == []


def same_file(a: Path, b: Path) -> bool:
    return Path(a).stat().st_ino == Path(b).stat().st_ino


def test_a_whole_file_read_in_place_becomes_its_segment_by_a_link(tmp_path: Path) -> None:
    # Given JSON-lines files, each smaller than a segment, and a CSV file with its header
    lines = [b'{"key":"k%d","value":%d}\n' % (i % 3, i) for i in range(30)]
    for number in range(3):
        (tmp_path / f"part-{number}.jsonl").write_bytes(b"".join(lines[number * 10 :][:10]))
    (tmp_path / "in.csv").write_bytes(b"key,value\r\nk1,1\nk2,2\n")
    # When a source that allows it cuts them
    got = cut(tmp_path / "part-*.jsonl", segment_bytes=1 << 20, in_place=True)
    (csv_chunk,) = cut(tmp_path / "in.csv", fmt="csv", segment_bytes=1 << 20, in_place=True)
    # Then each is one chunk, and its segment is the file itself, not a copy
    assert [c.in_place for c in got] == [True] * 3
    assert written(got, tmp_path / "out") == [
        (tmp_path / f"part-{n}.jsonl").read_bytes() for n in range(3)
    ]
    assert all(same_file(tmp_path / "out" / f"c{c.index}.jsonl", c.path) for c in got)
    assert csv_chunk.in_place
    write_chunk(tmp_path / "out" / "c.csv", csv_chunk)
    assert same_file(tmp_path / "out" / "c.csv", tmp_path / "in.csv")
    # ...and deleting a segment leaves the input file as it was
    for segment in (tmp_path / "out").iterdir():
        segment.unlink()
    assert b"".join((tmp_path / f"part-{n}.jsonl").read_bytes() for n in range(3)) == b"".join(
        lines
    )
    assert (tmp_path / "in.csv").stat().st_nlink == 1


def test_a_file_that_is_not_one_whole_chunk_is_copied(tmp_path: Path) -> None:
    # A file cut in several chunks, one whose segment needs a newline added, and a whole
    # file whose source does not allow linking (a landing folder's) are each copied.
    (tmp_path / "big.jsonl").write_bytes(b'{"key":"k"}\n' * 40)
    (tmp_path / "open.jsonl").write_bytes(b'{"key":"k"}\n{"key":"j"}')
    (tmp_path / "small.jsonl").write_bytes(b'{"key":"k"}\n')
    several = cut(tmp_path / "big.jsonl", segment_bytes=100, in_place=True)
    (open_ended,) = cut(tmp_path / "open.jsonl", segment_bytes=1 << 20, in_place=True)
    (not_allowed,) = cut(tmp_path / "small.jsonl", segment_bytes=1 << 20)
    assert len(several) > 1
    assert not any(c.in_place for c in [*several, open_ended, not_allowed])
    written([*several, open_ended, not_allowed], tmp_path / "out")
    assert all((tmp_path / f"{n}.jsonl").stat().st_nlink == 1 for n in ("big", "open", "small"))


def test_a_whole_file_changed_since_it_was_measured_is_copied_as_measured(
    tmp_path: Path,
) -> None:
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"k"}\n')
    (chunk,) = cut(tmp_path / "in.jsonl", segment_bytes=1 << 20, in_place=True)
    with (tmp_path / "in.jsonl").open("ab") as grown:
        grown.write(b'{"key":"later"}\n')
    assert written([chunk], tmp_path / "out") == [b'{"key":"k"}\n']
    assert (tmp_path / "in.jsonl").stat().st_nlink == 1
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["c0.jsonl"]  # no link left


def test_an_input_swapped_for_a_symbolic_link_is_neither_linked_nor_copied(
    tmp_path: Path,
) -> None:
    # Given an input file checked and cut, then replaced by a link to another file
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"k"}\n')
    (chunk,) = cut(tmp_path / "in.jsonl", segment_bytes=1 << 20, in_place=True)
    (tmp_path / "secret").write_bytes(b"0123456789\n")
    (tmp_path / "in.jsonl").unlink()
    (tmp_path / "in.jsonl").symlink_to(tmp_path / "secret")
    target = tmp_path / "out" / "c0.jsonl"
    # Then the segment is refused, and nothing of the other file is written
    with pytest.raises(InputError, match=r"in\.jsonl changed since it was measured"):
        write_chunk(target, chunk)
    assert not target.parent.exists()


@pytest.mark.parametrize("in_place", [True, False])
def test_an_input_whose_folder_became_a_link_is_neither_linked_nor_copied(
    tmp_path: Path, in_place: bool
) -> None:
    # Given an input file checked and cut, then its folder (not the file) replaced by a
    # link to a folder holding a file of the same name and size
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b'{"key":"k"}\n')
    (chunk,) = cut(tmp_path / "in" / "a.jsonl", segment_bytes=1 << 20, in_place=in_place)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.jsonl").write_bytes(b'{"key":"s"}\n')
    (tmp_path / "in").rename(tmp_path / "in.old")
    (tmp_path / "in").symlink_to(tmp_path / "other", target_is_directory=True)
    # Then the segment is refused, naming the file and the link, and nothing of the
    # other file is written
    target = tmp_path / "out" / "c0.jsonl"
    with pytest.raises(InputError, match=r"in/a\.jsonl changed since it was measured") as refused:
        write_chunk(target, chunk)
    assert f"{str(tmp_path / 'in')[1:]!r} is a symbolic link" in str(refused.value)
    assert not target.parent.exists()
    assert (tmp_path / "other" / "a.jsonl").stat().st_nlink == 1


@pytest.mark.parametrize("in_place", [True, False])
def test_an_input_gone_or_shorter_than_measured_is_an_input_error_naming_it(
    tmp_path: Path, in_place: bool
) -> None:
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"k"}\n' * 40)
    whole, *_ = cut(tmp_path / "in.jsonl", segment_bytes=1 << 20, in_place=in_place)
    first, *_ = cut(tmp_path / "in.jsonl", segment_bytes=100)
    (tmp_path / "in.jsonl").write_bytes(b'{"key":"k"}\n')  # shorter than its first chunk
    with pytest.raises(InputError, match=r"ended .* bytes early"):
        write_chunk(tmp_path / "out" / "short.jsonl", first)
    (tmp_path / "in.jsonl").unlink()
    with pytest.raises(InputError, match="No such file"):
        write_chunk(tmp_path / "out" / "gone.jsonl", whole)
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM, errno.EMLINK])
def test_a_file_the_file_system_cannot_link_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def refused(*_: object, **__: object) -> None:
        raise OSError(code, os.strerror(code))

    (tmp_path / "in.jsonl").write_bytes(b'{"key":"k"}\n')
    (chunk,) = cut(tmp_path / "in.jsonl", segment_bytes=1 << 20, in_place=True)
    monkeypatch.setattr(os, "link", refused)
    assert written([chunk], tmp_path / "out") == [b'{"key":"k"}\n']
    assert not same_file(tmp_path / "out" / "c0.jsonl", tmp_path / "in.jsonl")


def test_a_csv_segment_is_its_header_line_then_the_input_bytes_copied(tmp_path: Path) -> None:
    data = b"".join(f'"u,{i}",k{i % 3},{i}\n'.encode() for i in range(40))
    (tmp_path / "in.csv").write_bytes(b"user,key,value\r\n" + data[:-1])  # no final newline
    got = cut(tmp_path / "in.csv", fmt="csv", segment_bytes=100)
    assert len(got) > 3
    bodies = written(got, tmp_path)
    assert all(body.startswith(b"user,key,value\r\n") for body in bodies)
    assert b"".join(body.removeprefix(b"user,key,value\r\n") for body in bodies) == data
    assert [(c.offset, c.length + (c is got[-1])) for c in got] == [
        (offset + len(b"user,key,value\r\n"), length)
        for offset, length in reference_cuts(data, 100)
    ]
    # The routing field is found by its column in the header, quoted commas and all.
    assert [c.tag for c in got] == [
        next(csv.reader([body.decode().splitlines()[1]]))[1] for body in bodies
    ]
    assert {c.kind for c in got} == {"csv"}


def test_a_parquet_input_is_cut_by_rows_into_parquet_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"key": f"k{i % 5}", "value": i / 4, "user": f"u{i}"} for i in range(1000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=300)
    # The source reads a row group at a time, never the whole file
    with monkeypatch.context() as whole_file:
        whole_file.setattr(pq, "read_table", lambda *a, **k: pytest.fail("read the whole file"))
        got = cut(tmp_path / "in.parquet", fmt="parquet", segment_bytes=4096)
        resumed = cut(
            tmp_path / "in.parquet",
            fmt="parquet",
            segment_bytes=4096,
            start_offset=got[2].offset,
            start_index=2,
        )
    assert any(c.offset // 300 != (c.offset + c.length - 1) // 300 for c in got)  # spans groups
    assert [(c.offset, c.length) for c in resumed] == [(c.offset, c.length) for c in got[2:]]
    assert len(got) > 3
    assert [c.offset for c in got] == list(itertools.accumulate([0] + [c.length for c in got[:-1]]))
    back = [pq.read_table(io.BytesIO(body)) for body in written(got, tmp_path)]
    assert [row for table in back for row in table.to_pylist()] == rows
    assert back[0].schema == pq.read_schema(tmp_path / "in.parquet")
    assert [c.tag for c in got] == [table.column("key")[0].as_py() for table in back]
    assert {c.kind for c in got} == {"parquet"}


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.text(alphabet='ab{}":,', max_size=30), max_size=25),
    trailing_newline=st.booleans(),
    segment_bytes=st.integers(min_value=1, max_value=120),
)
def test_chunks_tile_the_input_exactly_whatever_the_lines_and_segment_size(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[str],
    trailing_newline: bool,
    segment_bytes: int,
) -> None:
    folder = tmp_path_factory.mktemp("tile")
    data = "\n".join(lines).encode() + (b"\n" if trailing_newline and lines else b"")
    (folder / "in.jsonl").write_bytes(data)
    got = cut(folder / "in.jsonl", segment_bytes=segment_bytes)
    assert [(c.offset, c.length) for c in got] == reference_cuts(data, segment_bytes)
    bodies = written(got, folder)
    assert all(body.endswith(b"\n") for body in bodies)
    expected = data if data.endswith(b"\n") or not data else data + b"\n"
    assert b"".join(bodies) == expected


def test_a_csv_header_line_past_the_bound_is_refused_before_anything_is_cut(
    tmp_path: Path,
) -> None:
    # Every segment repeats the header: a hostile one would be copied into each.
    path = tmp_path / "wide.csv"
    path.write_bytes(b"a" * (segments.MAX_HEADER_BYTES + 1) + b"\nx\n")
    with pytest.raises(inputs.InputError, match="header line is longer than 1024 KB"):
        resolve_inputs(str(path), "csv")
    path.write_bytes(b"a" * (segments.MAX_HEADER_BYTES - 1) + b"\nx\n")
    assert resolve_inputs(str(path), "csv")[0].data_start == segments.MAX_HEADER_BYTES


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("rows.parquet", "jsonl"),
        ("rows.PARQUET", "csv"),
        ("t.csv", "jsonl"),
        ("e.jsonl", "parquet"),
    ],
)
def test_a_file_whose_suffix_names_another_format_is_refused_before_it_is_read(
    tmp_path: Path, name: str, fmt: str
) -> None:
    (tmp_path / name).write_bytes(b'{"key":"k"}\n')
    with pytest.raises(InputError, match=rf"{name}: its name says .* \(format: {fmt}\)"):
        resolve_inputs(str(tmp_path / "*"), fmt)


@pytest.mark.parametrize("name", ["events.log", "events", "events.json", "events.ndjson"])
def test_a_file_whose_suffix_names_no_other_format_is_read_in_the_sources(
    tmp_path: Path, name: str
) -> None:
    (tmp_path / name).write_bytes(b'{"key":"k"}\n')
    (item,) = resolve_inputs(str(tmp_path / name), "jsonl")
    assert item.size == 12
