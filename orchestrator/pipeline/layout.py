"""Where a run's files live under the data directory: one folder per run, its segment
files in ``segments/``. Here, not with the worker that writes them, because the ledger
deletes them too (``orchestrator.ledger.retention``) and may not import the worker.

The data folder and the sink root are the console's own: no input of a run started
from the console may lie in them (``console_folder``), whatever input roots an
administrator listed, or a landing run with ``clean: delete`` over another run's
``segments`` folder (or another pipeline's Parquet folder) would delete its files."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


def run_dir(run_id: int) -> Path:
    return Path(settings.DATA_DIR) / "runs" / str(run_id)


def segments_dir(run_id: int) -> Path:
    return run_dir(run_id) / "segments"


def segment_path(run_id: int, segment_id: str, kind: str = "jsonl") -> Path:
    """A segment's file, named for its format (``kind``): operators read it by its
    suffix. Operators write JSON lines; the source writes its input's format."""
    return segments_dir(run_id) / f"{segment_id}.{kind}"


def console_folder(path: Path) -> str:
    """The setting naming the console's own folder that ``path`` (resolved) lies in or
    is, or "" when it lies in neither."""
    real = Path(os.path.realpath(path))
    for name, folder in (
        ("BPCONSOLE_DATA_DIR", settings.DATA_DIR),
        ("BPCONSOLE_SINK_ROOT", settings.BPCONSOLE_SINK_ROOT),
    ):
        own = Path(os.path.realpath(folder))
        if real == own or own in real.parents:
            return name
    return ""
