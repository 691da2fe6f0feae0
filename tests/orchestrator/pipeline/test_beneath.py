"""Paths walked beneath a root by descriptor: no component followed if it is a symbolic
link, ``..`` and absolute paths refused, a held folder still the inode it was opened
on after its path is swapped, errors naming the path as given (real files and links)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.pipeline.beneath import LeavesRoot, Roots, WalkError, open_root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/a/b/data.jsonl inside the root; outside/a/b/data.jsonl (a secret) beside it."""
    for top, body in (("root", b"inside\n"), ("outside", b"secret\n")):
        (tmp_path / top / "a" / "b").mkdir(parents=True)
        (tmp_path / top / "a" / "b" / "data.jsonl").write_bytes(body)
    return tmp_path


def read(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def swap_for_link(path: Path, target: Path) -> None:
    """``path`` (a folder) renamed away and a symbolic link to ``target`` put in its place."""
    path.rename(path.with_name(path.name + ".old"))
    path.symlink_to(target, target_is_directory=True)


def test_a_file_is_opened_through_every_folder_of_its_path(tree: Path) -> None:
    with open_root(tree / "root") as root:
        assert read(root.open_file("a/b/data.jsonl", shown="a/b/data.jsonl")) == b"inside\n"
        assert read(root.open_file("./a//b/./data.jsonl", shown="x")) == b"inside\n"


@pytest.mark.parametrize("component", ["a", "a/b"])
def test_a_folder_of_the_path_swapped_for_a_link_out_of_the_root_is_never_followed(
    tree: Path, component: str
) -> None:
    # Given a folder on the way to the file (not its last component) replaced by a link
    # to the same folder outside the root
    swap_for_link(tree / "root" / component, tree / "outside" / component)
    shown = "inputs/a/b/data.jsonl"
    # Then opening the file is refused, naming the path as given and the link inside the
    # root, never the folder outside it
    with open_root(tree / "root") as root, pytest.raises(LeavesRoot) as refused:
        root.open_file("a/b/data.jsonl", shown=shown)
    assert str(refused.value) == (
        f"{shown}: {component!r} is a symbolic link, which is never followed"
    )
    assert "outside" not in str(refused.value)


def test_a_last_component_that_is_a_link_a_folder_or_a_fifo_is_not_opened(tree: Path) -> None:
    b = tree / "root" / "a" / "b"
    (b / "link.jsonl").symlink_to(tree / "outside" / "a" / "b" / "data.jsonl")
    os.mkfifo(b / "fifo.jsonl")  # opened for reading, it would wait for a writer
    with open_root(tree / "root") as root:
        with pytest.raises(LeavesRoot, match=r"'a/b/link\.jsonl' is a symbolic link"):
            root.open_file("a/b/link.jsonl", shown="a/b/link.jsonl")
        with pytest.raises(WalkError, match=r"fifo\.jsonl: not a regular file"):
            root.open_file("a/b/fifo.jsonl", shown="a/b/fifo.jsonl")
        with pytest.raises(WalkError, match="not a regular file"):
            root.open_file("a/b", shown="a/b")
        with pytest.raises(WalkError, match="No such file or directory"):
            root.open_file("a/c/data.jsonl", shown="a/c/data.jsonl")


@pytest.mark.parametrize("relative", ["../outside/a/b/data.jsonl", "a/../../outside", "/etc"])
def test_dot_dot_and_absolute_paths_are_refused_before_anything_is_opened(
    tree: Path, relative: str
) -> None:
    with (
        open_root(tree / "root") as root,
        pytest.raises(LeavesRoot, match=r"never followed|absolute"),
    ):
        root.open_file(relative, shown=relative)


def test_a_held_folder_is_still_the_one_opened_after_its_path_is_swapped(tree: Path) -> None:
    # Given a folder held open, then swapped for a link to a folder outside the root
    with open_root(tree / "root") as root:
        held = root.open_folder("a/b", shown="a/b")
        identity = held.identity
        swap_for_link(tree / "root" / "a" / "b", tree / "outside" / "a" / "b")
        # Then everything relative to it is in the folder opened, not the link's target
        assert [e.name for e in held.scandir()] == ["data.jsonl"]
        assert read(held.open_file("data.jsonl", shown="data.jsonl")) == b"inside\n"
        held.unlink("data.jsonl")
        assert (tree / "outside" / "a" / "b" / "data.jsonl").read_bytes() == b"secret\n"
        assert not (tree / "root" / "a" / "b.old" / "data.jsonl").exists()
        # And a fresh walk of its path says it is a link
        with pytest.raises(LeavesRoot, match="'a/b' is a symbolic link"):
            root.open_folder("a/b", shown="a/b")
        # While a folder put in its place is another inode
        (tree / "root" / "a" / "b").unlink()
        (tree / "root" / "a" / "b").mkdir()
        with root.open_folder("a/b", shown="a/b") as now:
            assert now.identity != identity
        held.close()


def test_missing_folders_are_made_one_by_one_and_none_through_a_link(tree: Path) -> None:
    with open_root(tree / "root") as root:
        with root.open_folder("new/deeper", shown="new/deeper", create=True) as made:
            os.close(made.create("file"))
        assert (tree / "root" / "new" / "deeper" / "file").is_file()
        (tree / "root" / "out").symlink_to(tree / "outside", target_is_directory=True)
        with pytest.raises(LeavesRoot, match="'out' is a symbolic link"):
            root.open_folder("out/made", shown="out/made", create=True)
    assert sorted(p.name for p in (tree / "outside").iterdir()) == ["a"]


def test_a_held_folder_takes_only_single_names(tree: Path) -> None:
    with open_root(tree / "root") as root, root.open_folder("a", shown="a") as a:
        for name in ("b/data.jsonl", "..", ""):
            with pytest.raises(WalkError, match="is not a file name"):
                a.stat(name)


def test_a_path_is_walked_from_the_deepest_root_that_holds_it(tree: Path) -> None:
    # Given two roots, one inside the other, the inner one a link an administrator made
    (tree / "inner").symlink_to(tree / "root" / "a", target_is_directory=True)
    roots = Roots([tree / "root", tree / "inner"])
    inner = str(tree / "root" / "a")
    assert roots.beneath(str(tree / "root" / "a" / "b" / "data.jsonl")) == (
        inner,
        "b/data.jsonl",
    )
    assert roots.beneath(str(tree / "root" / "x")) == (str(tree / "root"), "x")
    # A path below no root (a command-line run's) is walked from / on
    assert roots.beneath(str(tree / "outside" / "x")) == ("/", str(tree / "outside" / "x")[1:])
    assert read(roots.open_file(str(tree / "outside" / "a" / "b" / "data.jsonl"))) == b"secret\n"
    # And the root folders are held from their first use: a component above the deepest
    # root swapped since is not walked again
    assert read(roots.open_file(inner + "/b/data.jsonl")) == b"inside\n"
    swap_for_link(tree / "root" / "a", tree / "outside" / "a")
    assert read(roots.open_file(inner + "/b/data.jsonl")) == b"inside\n"
    roots.close()
    # While a walk from the outer root finds the link
    outer = Roots([tree / "root"])
    with pytest.raises(LeavesRoot, match=r"data\.jsonl: 'a' is a symbolic link"):
        outer.open_file(inner + "/b/data.jsonl")
    outer.close()
    with pytest.raises(WalkError, match="not an absolute path"):
        roots.open_file("relative/path")
