"""Segment files: immutable files under the data directory, in the format their suffix
names (``.jsonl``, ``.csv`` with its header line, ``.parquet``)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

COPY_STEP = 8 * 1024 * 1024
# A CSV header line longer than this is refused by the source: every segment repeats it.
MAX_HEADER_BYTES = 1 << 20
# copy_file_range cannot copy between these (another file system on older kernels, or
# one that does not support it): the bytes then go through user space.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


class SourceFileError(OSError):
    """The input file is no longer what was measured: shorter than its size then."""


def write_atomic(path: Path, body: bytes) -> int:
    """Write ``body`` to ``path`` all or nothing (temp file, fsync, rename).

    An empty body is not synced: the file has no data to flush, and its name is as
    durable either way (the rename is not synced). A batch of a stage's siblings in one
    job leaves every output but one empty, and the 63 fsyncs of a 64-segment batch took
    0.05 s of its worker, with both cores idle (docs/benchmarks.md, "the time between
    a run's Spark jobs")."""
    with _atomic(path, sync=bool(body)) as handle:
        handle.write(body)
    return len(body)


def link_atomic(path: Path, source_fd: int, size: int, link: Callable[[Path], None]) -> bool:
    """Make the file open at ``source_fd``, which must hold exactly ``size`` bytes, the
    file at ``path`` without copying it: a hard link (``link`` makes one to the input's
    path at the name it is given), put in place by a rename and synced to disk as a copy
    would be. False, and nothing new at ``path``, when the file system cannot link it,
    the file no longer has the size it was measured with, or what was linked is not the
    file the descriptor holds (the input's name swapped since it was opened, for a
    symbolic link or another file): the caller copies from the descriptor."""
    opened = os.fstat(source_fd)
    if opened.st_size != size:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)  # left by a process of this pid that died here
    try:
        link(tmp)
    except OSError:  # cannot link here, or the path no longer leads to a file: copy
        return False
    try:
        linked = tmp.lstat()
        if (linked.st_dev, linked.st_ino) != (opened.st_dev, opened.st_ino):
            return False
        os.fsync(source_fd)  # the linked file's own pages, which a copy would have synced
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def copy_atomic(
    path: Path, source_fd: int, offset: int, length: int, *, newline: bool, head: bytes = b""
) -> int:
    """Copy ``length`` bytes of the file open at ``source_fd`` from ``offset`` to
    ``path`` all or nothing, after ``head`` (a CSV header line) and before a final
    newline when ``newline``; the kernel copies, nothing passes through Python where the
    file system allows it. The caller opened the source (never through a symbolic
    link: the input was checked as a file, and one swapped for a link would name
    another) and closes it."""
    with _atomic(path) as handle:
        handle.write(head)
        handle.flush()  # the kernel copies to the descriptor's position, after the head
        done = _kernel_copy(source_fd, handle.fileno(), offset, length)
        handle.seek(len(head) + done)
        while done < length:
            data = os.pread(source_fd, min(COPY_STEP, length - done), offset + done)
            if not data:
                raise SourceFileError(errno.EIO, f"ended {length - done} bytes early")
            handle.write(data)
            done += len(data)
        if newline:
            handle.write(b"\n")
    return len(head) + length + newline


def _kernel_copy(src: int, dst: int, offset: int, length: int) -> int:
    """How many bytes from the start the kernel copied: all of them, or fewer when the
    input ended early or the file system cannot (the caller reads the rest)."""
    done = 0
    try:
        while done < length:
            copied = os.copy_file_range(src, dst, length - done, offset + done)
            if copied == 0:
                break
            done += copied
    except AttributeError:  # not Linux
        pass
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
    return done


@contextmanager
def _atomic(path: Path, *, sync: bool = True) -> Iterator[BinaryIO]:
    """A temp file beside ``path``, fsynced (``sync``) and renamed over it on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            yield handle
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
