"""A run's topology document: as the balancer's :class:`~balancer.topology.Topology`,
and the few questions the runtime asks of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from balancer.topology import LinkSpec, NodeSpec, Topology
from orchestrator.pipeline.inputs import InputFile
from sparkjobs.catalog import OPERATORS, validate_params

MB = 1024 * 1024
MEGABIT_BYTES = 1_000_000 / 8


def balancer_topology(doc: Mapping[str, Any]) -> Topology:
    nodes = [
        NodeSpec(
            id=n["name"],
            kind=n["kind"],
            stage=n.get("stage") or n["name"],
            capacity_bytes=float(n.get("buffer_mb", 64.0)) * MB,
            mergeable=OPERATORS[n.get("operator") or _default(n["kind"])].mergeable,
            max_rate_bps=float(n.get("max_rate_mbps", 0.0)) * MEGABIT_BYTES,
        )
        for n in doc["nodes"]
    ]
    links = [
        LinkSpec(e["from"], e["to"], float(e.get("bandwidth_mbps", 0.0)) * MEGABIT_BYTES)
        for e in doc["edges"]
    ]
    return Topology.build(nodes, links)


def _default(kind: str) -> str:
    return {"source": "read", "sink": "merge"}.get(kind, "aggregate")


def input_extent(files: Sequence[InputFile]) -> list[tuple[int, int]]:
    """Each input file's (data start, end): what the merged chunks must tile."""
    return [(f.data_start, f.size) for f in files]


def downstreams_of(topology: Mapping[str, Any], name: str) -> list[str]:
    return [e["to"] for e in topology["edges"] if e["from"] == name]


def bandwidth(topology: Mapping[str, Any], src: str, dst: str) -> float:
    for edge in topology["edges"]:
        if edge["from"] == src and edge["to"] == dst:
            return float(edge.get("bandwidth_mbps", 0.0))
    return 0.0


def operator_problems(doc: Mapping[str, Any]) -> list[str]:
    """Why a stored pipeline's nodes may not run as they are, one line per problem.

    The console checks a document when it is saved; a run checks it again when it
    starts, because what is admitted may have narrowed since (expressions, say).
    """
    return [
        f"node {node['name']}: {problem}"
        for node in doc["nodes"]
        for problem in validate_params(
            node.get("operator") or _default(node["kind"]), node["kind"], node.get("params") or {}
        )
    ]
