"""Paths opened beneath a root by descriptor, never through a symbolic link.

A check by path (``realpath``, ``is_symlink``) says what a path named when it was
looked at; a folder on it swapped for a link afterwards sends the next open elsewhere,
and ``O_NOFOLLOW`` guards only a path's last component. Here a path is walked from a
root's descriptor one component at a time (``openat`` with ``O_DIRECTORY |
O_NOFOLLOW``; a file's last component with ``O_NOFOLLOW`` alone), refusing ``..``, an
absolute path and a link at every step, and a :class:`Folder` held open keeps naming
the inode it was opened on whatever happens to its path since: listing, stat, open,
create, rename and unlink go relative to it (docs/adr/0012).

Errors name the path as its caller gave it and the component, counted from the root,
that was refused: never a path outside the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO put where a file was would otherwise block the open until a writer
# came; on a regular file it changes nothing.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
Identity = tuple[int, int]  # (st_dev, st_ino)


class WalkError(OSError):
    """A path cannot be opened beneath its root; ``strerror`` names it and why."""

    def __str__(self) -> str:
        return str(self.strerror)


class LeavesRoot(WalkError):
    """A component of the path is a symbolic link, ``..`` or absolute: following it
    could leave the root."""


def components(relative: str, shown: str) -> list[str]:
    """The names of a path inside a root, ``.`` and empty ones dropped."""
    if "\x00" in relative:
        raise WalkError(errno.EINVAL, f"{shown}: a path holds no NUL character")
    if relative.startswith("/"):
        raise LeavesRoot(errno.EINVAL, f"{shown}: an absolute path where one inside a root is")
    names = [name for name in relative.split("/") if name not in ("", ".")]
    if ".." in names:
        raise LeavesRoot(errno.EINVAL, f"{shown}: '..' is never followed")
    return names


def _name(name: str, shown: str) -> str:
    """``name`` when it is one entry of a folder (no ``/``, not ``.`` or ``..``)."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise WalkError(errno.EINVAL, f"{shown}: {name!r} is not a file name")
    return name


def _refused(exc: OSError, parent: int, name: str, where: str, shown: str) -> WalkError:
    """Why ``name`` (at ``where`` inside the root) could not be opened, in words."""
    code = exc.errno or errno.EIO
    if code in (errno.ELOOP, errno.ENOTDIR):
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            return LeavesRoot(
                errno.ELOOP, f"{shown}: {where!r} is a symbolic link, which is never followed"
            )
        if code == errno.ENOTDIR:
            return WalkError(code, f"{shown}: {where!r} is not a folder")
    return WalkError(code, f"{shown}: {where!r}: {os.strerror(code)}")


class Folder:
    """A folder held open by its descriptor: what it names stays the inode it was
    opened on, whatever is renamed or linked in its path's place since."""

    def __init__(self, fd: int, shown: str) -> None:
        self.fd = fd
        self.shown = shown
        info = os.fstat(fd)
        self.identity: Identity = (info.st_dev, info.st_ino)

    def __enter__(self) -> Folder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _walk(self, names: Sequence[str], shown: str, *, create: bool) -> int:
        """A new descriptor of the folder ``names`` lead to from this one, each opened
        with ``O_NOFOLLOW`` relative to the one before (made when ``create``)."""
        fd = os.dup(self.fd)
        for depth, name in enumerate(names):
            where = "/".join(names[: depth + 1])
            try:
                try:
                    child = os.open(name, FOLDER_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    # One made meanwhile is opened below as any other, without following.
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                    child = os.open(name, FOLDER_FLAGS, dir_fd=fd)
            except OSError as exc:
                error = _refused(exc, fd, name, where, shown)
                os.close(fd)
                raise error from None
            os.close(fd)
            fd = child
        return fd

    def open_folder(self, relative: str, *, shown: str, create: bool = False) -> Folder:
        """The folder at ``relative`` below this one, walked without following a link
        (missing folders made when ``create``)."""
        return Folder(self._walk(components(relative, shown), shown, create=create), shown)

    def open_file(self, relative: str, *, shown: str) -> int:
        """A read-only descriptor of the regular file at ``relative`` below this one,
        no component of it followed if it is a link."""
        names = components(relative, shown)
        if not names:
            raise WalkError(errno.EISDIR, f"{shown}: a folder, not a file")
        parent = self._walk(names[:-1], shown, create=False) if len(names) > 1 else self.fd
        try:
            fd = os.open(names[-1], FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _refused(exc, parent, names[-1], "/".join(names), shown) from None
        finally:
            if parent != self.fd:
                os.close(parent)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise WalkError(errno.EINVAL, f"{shown}: not a regular file")
        return fd

    def scandir(self) -> Iterator[os.DirEntry[str]]:
        """The folder's entries; each ``stat`` of one is relative to this folder."""
        with os.scandir(self.fd) as entries:
            yield from entries

    def stat(self, name: str) -> os.stat_result:
        """The entry ``name`` itself (a link is not followed)."""
        return os.stat(_name(name, self.shown), dir_fd=self.fd, follow_symlinks=False)

    def create(self, name: str, mode: int = 0o600) -> int:
        """A write descriptor of the new file ``name``; refused if anything has it."""
        return os.open(_name(name, self.shown), NEW_FILE_FLAGS, mode, dir_fd=self.fd)

    def link(self, relative: str, target: Path, *, shown: str) -> None:
        """A hard link at ``target`` to the entry at ``relative`` below this folder,
        walked without following a link; the entry itself is linked, a symbolic link
        as such (the caller compares the result with the file it opened)."""
        names = components(relative, shown)
        if not names:
            raise WalkError(errno.EISDIR, f"{shown}: a folder, not a file")
        parent = self._walk(names[:-1], shown, create=False) if len(names) > 1 else self.fd
        try:
            os.link(names[-1], target, src_dir_fd=parent, follow_symlinks=False)
        finally:
            if parent != self.fd:
                os.close(parent)

    def unlink(self, name: str) -> None:
        os.unlink(_name(name, self.shown), dir_fd=self.fd)

    def rename(self, name: str, to: Folder, new_name: str) -> None:
        """``name`` here becomes ``new_name`` in ``to``, replacing what is there."""
        os.rename(
            _name(name, self.shown),
            _name(new_name, to.shown),
            src_dir_fd=self.fd,
            dst_dir_fd=to.fd,
        )

    def sync(self) -> None:
        os.fsync(self.fd)


def open_root(root: str | Path, *, create: bool = False) -> Folder:
    """A root folder, opened as its path names it now (links followed: the root is
    what an administrator configured), made first when ``create``."""
    if create:
        Path(root).mkdir(parents=True, exist_ok=True)
    return Folder(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), str(root))


class Roots:
    """Root folders, each opened once when first needed and held until :meth:`close`;
    a path is walked from the deepest root that holds it, or from ``/`` when none does
    (a run started from the command line, which may read anywhere its user may).
    ``held``: folders already open (walked by the caller), roots for what is below
    them, closed with the others."""

    def __init__(
        self, roots: Sequence[str | Path], *, held: Mapping[str, Folder] | None = None
    ) -> None:
        self.held: dict[str, Folder] = dict(held or {})
        real = {os.path.realpath(root) for root in roots} | {"/"} | set(self.held)
        self.paths = sorted(real, key=len, reverse=True)

    def __enter__(self) -> Roots:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def beneath(self, path: str) -> tuple[str, str]:
        """(the root holding the absolute ``path``, ``path`` relative to it)."""
        if not path.startswith("/"):
            raise WalkError(errno.EINVAL, f"{path}: not an absolute path")
        for root in self.paths:
            if root == "/":
                return root, path[1:]
            if path == root or path.startswith(root + "/"):
                return root, path[len(root) + 1 :]
        raise AssertionError("/ holds every absolute path")

    def _root(self, root: str) -> Folder:
        held = self.held.get(root)
        if held is None:
            try:
                held = self.held[root] = open_root(root)
            except OSError as exc:
                raise WalkError(exc.errno or errno.EIO, f"{root}: {exc.strerror}") from None
        return held

    def open_file(self, path: str) -> int:
        """A read-only descriptor of the regular file at absolute ``path``."""
        root, relative = self.beneath(path)
        return self._root(root).open_file(relative, shown=path)

    def link_file(self, path: str, target: Path) -> None:
        """A hard link at ``target`` to the entry at absolute ``path`` (see
        :meth:`Folder.link`)."""
        root, relative = self.beneath(path)
        self._root(root).link(relative, target, shown=path)

    def open_folder(self, path: str, *, create: bool = False) -> Folder:
        """The folder at absolute ``path``, held by the caller (who closes it)."""
        root, relative = self.beneath(path)
        return self._root(root).open_folder(relative, shown=path, create=create)

    def close(self) -> None:
        for held in self.held.values():
            held.close()
        self.held.clear()


class Opener(Protocol):
    """How a source opens its input files (absolute paths, as the run recorded them)."""

    def open_file(self, path: str) -> int: ...

    def link_file(self, path: str, target: Path) -> None: ...


class FromTop:
    """Files opened (and linked) by a walk from ``/`` each time, no component of them a
    symbolic link: for paths just resolved, before a run holds its roots."""

    def open_file(self, path: str) -> int:
        with Roots(()) as roots:
            return roots.open_file(path)

    def link_file(self, path: str, target: Path) -> None:
        with Roots(()) as roots:
            roots.link_file(path, target)


FROM_TOP = FromTop()
