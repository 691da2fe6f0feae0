"""The published experiment's setting, and topologies read from files.

Units: the spec quotes 5 GB at 125 Mb/s as "about 328 s", which is
``5 * 1024 MB * 8 / 125`` with the same M in MB and Mb; so one Mb/s here is
``MB / 8`` bytes per second with ``MB = 2**20`` (:data:`MBIT`, defined with the other
units in balancer/units.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from balancer.document import PipelineDocument
from balancer.sim.workload import WorkloadSpec
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import GB, KB, MB, SPEC_MEGABIT

MBIT = SPEC_MEGABIT  # bytes per second in one of the experiment's Mb/s

# Queues of the product's reference topology (webapp/console/topologies/reference.yaml).
REFERENCE_QUEUE_BYTES = 64 * MB
REFERENCE_LATENCY_S = 0.002
# The spec's reading of the published figure: (src, dst, Mb/s).
REFERENCE_LINKS = (
    ("0", "1", 50),
    ("0", "2", 50),
    ("0", "3", 100),
    ("1", "4", 25),
    ("2", "4", 25),
    ("3", "4", 75),
)

# Workload calibration (docs/simulation.md, "Calibration"): chosen once so that the
# credit-based baseline lands near the published credit times at all four volumes, then
# frozen for every policy. Every packet is 1 MB as published; tags are equally likely
# outside skew; the source averages 150 Mb/s (above the 125 Mb/s max flow, so the
# pipeline, not the source, sets the pace) and jumps between 75 and 225 Mb/s.
REFERENCE_WORKLOAD: dict[str, float] = {
    "mean_rate_bps": 150 * MBIT,
    "burst_ratio": 3.0,
    "burst_mean_s": 10.0,
    "dominance": 0.5,
    "skew_mean_s": 15.0,
}
REFERENCE_VOLUMES: tuple[tuple[str, float], ...] = (
    ("500MB", 500 * MB),
    ("1GB", GB),
    ("2GB", 2 * GB),
    ("5GB", 5 * GB),
)


def reference_topology() -> Topology:
    """Node 0 the source, 1-3 the branches (one mergeable stage), 4 the output node."""
    nodes = [
        NodeSpec("0", kind="source", capacity_bytes=REFERENCE_QUEUE_BYTES),
        *(NodeSpec(n, stage="agg", capacity_bytes=REFERENCE_QUEUE_BYTES) for n in ("1", "2", "3")),
        NodeSpec("4", kind="sink", capacity_bytes=REFERENCE_QUEUE_BYTES),
    ]
    links = [
        LinkSpec(src, dst, mbps * MBIT, REFERENCE_LATENCY_S) for src, dst, mbps in REFERENCE_LINKS
    ]
    return Topology.build(nodes, links)


def reference_workload(volume_bytes: float, **overrides: Any) -> WorkloadSpec:
    return WorkloadSpec(volume_bytes=volume_bytes, **{**REFERENCE_WORKLOAD, **overrides})


def parse_volume(text: str) -> float:
    """``"500MB"``, ``"5GB"``, ``"1.5 GB"`` -> bytes (binary units, as the spec's figures)."""
    units = {"GB": GB, "MB": MB, "KB": KB, "B": 1}
    cleaned = text.strip().upper().replace(" ", "")
    for suffix, factor in units.items():
        if cleaned.endswith(suffix):
            number = cleaned[: -len(suffix)]
            try:
                return float(number) * factor
            except ValueError:
                break
    raise ValueError(f"not a volume: {text!r} (use e.g. 500MB or 5GB)")


def load_topology(path: Path) -> Topology:
    """A topology document (docs/topology-format.md) from a YAML or JSON file.

    Nodes: ``name``, ``kind`` (source/operator/sink), optional ``stage``,
    ``buffer_mb`` (default 64), ``max_rate_mbps`` (0 = unlimited); edges: ``from``,
    ``to``, ``bandwidth_mbps`` (0 = unlimited) and, for the simulator only,
    ``latency_ms``; the defaults are those of balancer/document.py. Other keys
    (operators, params, policy) are not read here.
    """
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in {".yaml", ".yml"}:
        # PyYAML is a project dependency; imported here only, so the simulator itself
        # stays standard library and numpy.
        import yaml

        document = yaml.safe_load(text)
    else:
        document = json.loads(text)
    return topology_from_document(document)


def topology_from_document(document: Any) -> Topology:
    """A topology document read from a file, as :meth:`Topology.from_document` reads
    any, with the experiment's Mb/s (:data:`MBIT`). Operators are not the simulator's
    concern: every node is taken as mergeable."""
    if not isinstance(document, dict) or not document.get("nodes"):
        raise ValueError("a topology document needs a list of nodes (and edges)")
    topology = Topology.from_document(cast("PipelineDocument", document), megabit=MBIT)
    if len(topology.sources()) != 1:
        raise ValueError("the simulator needs exactly one source node")
    return topology
