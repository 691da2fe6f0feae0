"""Segment files are written whole or not at all: a body is flushed to disk before the
file takes its name; an empty one, which has nothing to flush, is not synced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkjobs.segments import write_atomic


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors os.fsync was called on (the real fsync still runs)."""
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_a_body_is_synced_before_the_file_takes_its_name(tmp_path: Path, synced: list[int]) -> None:
    path = tmp_path / "out" / "seg.jsonl"
    assert write_atomic(path, b'{"key":"a"}\n') == 12
    assert path.read_bytes() == b'{"key":"a"}\n'
    assert len(synced) == 1
    assert [p.name for p in path.parent.iterdir()] == ["seg.jsonl"]  # no temp file left


def test_an_empty_output_is_written_without_a_sync(tmp_path: Path, synced: list[int]) -> None:
    path = tmp_path / "seg.jsonl"
    path.write_bytes(b"old")
    assert write_atomic(path, b"") == 0
    assert path.exists() and path.read_bytes() == b""
    assert synced == []


def test_a_write_that_fails_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "seg.jsonl"
    path.write_bytes(b"before\n")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        write_atomic(path, b"after\n")
    assert path.read_bytes() == b"before\n"
    assert [p.name for p in tmp_path.iterdir()] == ["seg.jsonl"]
