"""What a batch job produced from each input segment: the contract between every
operator's Spark job and the orchestrator that commits it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PartialOutput:
    """What one input segment produced: ``records``, the good records its operator took
    from it (malformed ones are counted apart)."""

    segment: str
    path: Path
    records: int = 0
    malformed: int = 0
    late: int = 0  # (record, window) pairs whose window had closed (windowed only)
    keys: int = 0
    bytes: int = 0
    quarantined: list[str] = field(default_factory=list)
    late_lines: list[str] = field(default_factory=list)
    # A deduplicate job's: the identity (sparkjobs/identity.py) of each line of its
    # output, in order, for the worker to drop those the run kept already.
    identities: list[str] = field(default_factory=list)
