"""A run of a shipped topology that no driver takes, for tests that move its data by hand."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.models import Run
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
