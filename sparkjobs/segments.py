"""Segment files: immutable files under the data directory, in the format their suffix
names (``.jsonl``, ``.csv`` with its header line, ``.parquet``)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

COPY_STEP = 8 * 1024 * 1024
# A CSV header line longer than this is refused by the source: every segment repeats it.
MAX_HEADER_BYTES = 1 << 20
# copy_file_range cannot copy between these (another file system on older kernels, or
# one that does not support it): the bytes then go through user space.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def write_atomic(path: Path, body: bytes) -> int:
    """Write ``body`` to ``path`` all or nothing (temp file, fsync, rename)."""
    with _atomic(path) as handle:
        handle.write(body)
    return len(body)


def copy_atomic(
    path: Path, source: str, offset: int, length: int, *, newline: bool, head: bytes = b""
) -> int:
    """Copy ``length`` bytes of ``source`` from ``offset`` to ``path`` all or nothing,
    after ``head`` (a CSV header line) and before a final newline when ``newline``; the
    kernel copies, nothing passes through Python where the file system allows it."""
    with _atomic(path) as handle, open(source, "rb") as src:  # noqa: PTH123 - a raw descriptor
        handle.write(head)
        handle.flush()  # the kernel copies to the descriptor's position, after the head
        done = _kernel_copy(src.fileno(), handle.fileno(), offset, length)
        handle.seek(len(head) + done)
        while done < length:
            data = os.pread(src.fileno(), min(COPY_STEP, length - done), offset + done)
            if not data:
                raise OSError(errno.EIO, f"input ended {length - done} bytes early")
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
def _atomic(path: Path) -> Iterator[BinaryIO]:
    """A temp file beside ``path``, fsynced and renamed over it on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
