"""Segment files: immutable JSON-lines files under the data directory."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, body: bytes) -> int:
    """Write ``body`` to ``path`` all or nothing (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as handle:
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    return len(body)
