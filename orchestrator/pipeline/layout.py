"""Where a run's files live under the data directory: one folder per run, its segment
files in ``segments/``. Here, not with the worker that writes them, because the ledger
deletes them too (``orchestrator.ledger.retention``) and may not import the worker."""

from __future__ import annotations

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
