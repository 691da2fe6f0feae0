"""An input path or glob from the console (orchestrator/pipeline/inputs.py
``confined_files``): refused on its fixed part before the disk is looked at when that
lies outside the input roots, expanded by a walk that never leaves them and stops at its
caps, and refused in words that name only what the operator typed or paths inside the
roots."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.pipeline import inputs
from orchestrator.pipeline.inputs import MAX_INPUT_FILES, InputError, confined_files


class Listings:
    """Every folder os.scandir lists, and how many entries the walk read from them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folders: list[str] = []
        self.entries = 0
        real_scandir = os.scandir

        def counting(path: Any) -> Any:
            self.folders.append(str(path))
            listing = real_scandir(path)
            listings = self

            class Counted:
                def __enter__(self) -> Counted:
                    return self

                def __exit__(self, *exc: object) -> None:
                    listing.close()

                def __iter__(self) -> Iterator[os.DirEntry[str]]:
                    for entry in listing:
                        listings.entries += 1
                        yield entry

                def close(self) -> None:
                    listing.close()

            return Counted()

        monkeypatch.setattr(os, "scandir", counting)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    (folder / "day1").mkdir(parents=True)
    (folder / "day1" / "part-0.jsonl").write_text("{}\n")
    return folder


def test_a_pattern_outside_the_roots_is_refused_naming_only_what_was_typed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listings = Listings(monkeypatch)
    # When an operator asks for /etc/pass* (which matches /etc/passwd on this host)
    with pytest.raises(InputError) as refused:
        confined_files("/etc/pass*", [root], follow_symlinks=False)
    # Then the refusal names the pattern, not the host's file it matches
    message = str(refused.value)
    assert "'/etc/pass*' must lie under an input folder" in message
    assert "passwd" not in message
    # and no folder was listed to find that out
    assert listings.folders == []


def test_a_pattern_over_the_whole_disk_is_refused_at_once_without_walking(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listings = Listings(monkeypatch)
    started = time.monotonic()
    with pytest.raises(InputError, match="must lie under an input folder"):
        confined_files("/*/*/*/*/*/*/*/*", [root], follow_symlinks=False)
    assert time.monotonic() - started < 0.1
    assert listings.folders == []
    # nor through '..' after the root
    with pytest.raises(InputError, match="must lie under an input folder"):
        confined_files(f"{root}/../../../*/*/*/*", [root], follow_symlinks=False)
    assert listings.folders == []


def test_a_folder_holding_more_than_the_cap_is_refused_after_about_the_cap_entries(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a folder of twice as many files as a pattern may match
    many = root / "many"
    many.mkdir()
    for number in range(2 * MAX_INPUT_FILES):
        (many / f"f{number}.jsonl").touch()
    listings = Listings(monkeypatch)
    # When a pattern matches all of them
    with pytest.raises(InputError, match=f"matches more than {MAX_INPUT_FILES} files"):
        confined_files("many/*", [root], follow_symlinks=False)
    # Then the walk stopped as soon as the cap was passed
    assert listings.folders == [str(many)]
    assert listings.entries <= MAX_INPUT_FILES + 1


def test_the_walk_looks_into_a_bounded_number_of_folders(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "MAX_WALKED_FOLDERS", 5)
    for number in range(10):
        (root / "days" / f"d{number}").mkdir(parents=True)
    listings = Listings(monkeypatch)
    with pytest.raises(InputError, match="looks into more than 5 folders"):
        confined_files("days/*/*.jsonl", [root], follow_symlinks=False)
    assert len(listings.folders) <= 5


def test_the_walk_never_lists_a_folder_a_link_leads_out_of_the_roots_to(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a link inside the root to /etc
    (root / "etcdir").symlink_to("/etc")
    listings = Listings(monkeypatch)
    for pattern, follow in [("etcdir/*", False), ("etcdir/*", True), ("*/pass*", True)]:
        # When a pattern's wildcards would walk through it
        with pytest.raises(InputError) as refused:
            confined_files(pattern, [root], follow_symlinks=follow)
        # Then it is refused naming the link, inside the root, and nothing of /etc
        message = str(refused.value)
        assert f"'{root}/etcdir' must lie under an input folder" in message, message
        assert "passwd" not in message
    assert not any(folder.startswith("/etc") for folder in listings.folders)


def test_a_glob_inside_the_root_matches_as_glob_does(root: Path) -> None:
    (root / "day1" / "part-1.jsonl").write_text("{}\n")
    (root / "day1" / ".hidden.jsonl").write_text("{}\n")
    (root / "day2").mkdir()
    (root / "day2" / "part-0.jsonl").write_text("{}\n")
    found = confined_files("day*/part-[0-1].jsonl", [root], follow_symlinks=False)
    assert [str(Path(f).relative_to(root.resolve())) for f in found] == [
        "day1/part-0.jsonl",
        "day1/part-1.jsonl",
        "day2/part-0.jsonl",
    ]
    assert confined_files(f"{root}/day1/.*", [root], follow_symlinks=False) == [
        str(root.resolve() / "day1" / ".hidden.jsonl")
    ]
    with pytest.raises(InputError, match="no input file matches"):
        confined_files("day1/*.csv", [root], follow_symlinks=False)


NAMES = st.sampled_from(["a", "b", "ab", ".a", "a.jsonl"])
TREES = st.lists(st.lists(NAMES, min_size=1, max_size=3), max_size=8)
PARTS = st.sampled_from(["*", "a*", "?", "[ab]", "*.jsonl", ".*", "**", "a", "ab", "a.jsonl"])


@settings(max_examples=150, deadline=None)
@given(TREES, st.lists(PARTS, min_size=1, max_size=3))
def test_a_pattern_inside_the_root_matches_what_glob_matches(
    tree: list[list[str]], pattern: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        # Given a small tree of folders and files under an input root
        root = Path(scratch).resolve() / "inputs"
        root.mkdir()
        for path in tree:
            folder = root.joinpath(*path[:-1])
            # (a path through a name that is already a file is left out)
            with contextlib.suppress(FileExistsError, NotADirectoryError):
                folder.mkdir(parents=True, exist_ok=True)
                if not (folder / path[-1]).exists():
                    (folder / path[-1]).write_text("{}\n")
        text = "/".join(pattern)
        # When a pattern is expanded, and when glob expands it
        globbed = sorted(glob.glob(str(root / text)))  # noqa: PTH207 - the reference
        try:
            found: list[str] | None = confined_files(text, [root], follow_symlinks=False)
        except InputError:
            found = None
        # Then both name the same files, and a pattern that matches no file or a folder
        # is refused
        if not globbed or not all(Path(p).is_file() for p in globbed):
            assert found is None, (text, globbed, found)
        else:
            assert found == globbed, (text, globbed, found)
