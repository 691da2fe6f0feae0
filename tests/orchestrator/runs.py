"""A run of a shipped topology that no driver takes, for tests that move its data by hand,
and segment rows written as the runtime would have left them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.utils import timezone

from orchestrator.models import Run, Segment
from orchestrator.rescale.start import ensure_instances

TOPOLOGIES = Path(__file__).resolve().parents[2] / "webapp/console/topologies"


def pending_run(name: str) -> Run:
    doc = yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text())
    # Pending: the watchdog of a test session's workers must not give it a driver.
    run = Run.objects.create(
        pipeline_name=doc["name"],
        topology=doc,
        policy={},
        input_spec={},
        status="pending",
        epoch=1,
    )
    ensure_instances(run)
    return run


def segment_row(
    run: Run, seg_id: str, *, node: str, upstream: str, size: int, chunk: int = 0, **fields: Any
) -> Segment:
    """A segment of ``size`` bytes at ``node`` from ``upstream`` (its file is nowhere:
    for tests of the ledger's rows only); ``fields`` set any other column."""
    values: dict[str, Any] = {
        "origin_file": 0,
        "origin_offset": 0,
        "origin_length": size,
        "path": f"/nowhere/{seg_id}",
        "available_at": timezone.now(),
        **fields,
    }
    return Segment.objects.create(
        id=seg_id, run=run, chunk=chunk, node=node, upstream=upstream, bytes=size, **values
    )
