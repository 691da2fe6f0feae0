"""A pipeline document: the topology format (docs/topology-format.md) as data.

The console validates and stores it, a run keeps a copy (and one per hot-rescale
version), the runtime routes by it and the simulator reads it from a file. Its shape is
written down here once, with the defaults of every optional field; what the balancer
makes of it is :meth:`balancer.topology.Topology.from_document`.

A document is plain JSON data (a ``dict``): these types say what it holds, they do not
check it. The console's validation (webapp/console/validation.py) does, before a document
is saved or run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

NodeKind = Literal["source", "operator", "sink"]

# The defaults of a document's optional fields, for everything that reads one.
DEFAULT_KIND: NodeKind = "operator"
# A node's data-pool capacity. A placed instance's batch takes half its pool (ADR 19),
# and each batch pays a fixed cost on top of its bytes (ADR 26): 128 MB gives 64 MB
# batches, in which that cost is a fifth of a batch on one core.
DEFAULT_BUFFER_MB = 128.0
DEFAULT_MAX_RATE_MBPS = 0.0  # a node's emulated processing rate; 0 = unlimited
DEFAULT_BANDWIDTH_MBPS = 0.0  # a link's emulated bandwidth; 0 = unlimited
DEFAULT_LATENCY_MS = 0.0  # a link's one-way delay (the simulator only)

# An operator's parameters: JSON values whose names and types depend on the operator,
# declared and checked by the operator catalog (sparkjobs/catalog.py).
OperatorParams = Mapping[str, Any]


class NodeDocument(TypedDict):
    """One entry of ``nodes``."""

    name: str
    kind: NodeKind
    stage: NotRequired[str]  # absent or "": a stage of its own (its name)
    operator: NotRequired[str]  # absent: the kind's default operator (the catalog's)
    params: NotRequired[OperatorParams]
    buffer_mb: NotRequired[float]
    max_rate_mbps: NotRequired[float]
    # A keyed member's key slots ``[low, high)`` after a key-group move: set by the
    # orchestrator in a run's graph only, never accepted from a user's document.
    key_slots: NotRequired[list[int]]
    # A join's reference table as the run snapshotted it (orchestrator/pipeline/
    # reference.py): set in a run's graph only, never accepted from a user's document.
    reference_file: NotRequired[str]


# One entry of ``edges`` ("from" is a keyword, hence the functional form).
EdgeDocument = TypedDict(
    "EdgeDocument",
    {
        "from": str,
        "to": str,
        "bandwidth_mbps": NotRequired[float],
        "latency_ms": NotRequired[float],  # read by the simulator only
    },
)


class PipelineDocument(TypedDict):
    """A whole pipeline: what ``Run.topology`` and ``Adjustment.before``/``after`` hold."""

    name: str
    description: NotRequired[str]
    policy: NotRequired[str | None]  # a named policy; absent: the default one
    policy_overrides: NotRequired[Mapping[str, float | int | str]]
    nodes: list[NodeDocument]
    edges: list[EdgeDocument]


def stage_of(node: NodeDocument) -> str:
    """The node's stage: its ``stage``, or its own name when it has none."""
    return node.get("stage") or node["name"]


def emulated(document: PipelineDocument) -> bool:
    """Whether the pipeline sets an emulation knob (a link's ``bandwidth_mbps`` or a
    node's ``max_rate_mbps`` above 0): its balancing then acts on declared limits, not
    on what the machine measured, and says so wherever the run is shown."""
    return any(float(e.get("bandwidth_mbps") or 0) > 0 for e in document["edges"]) or any(
        float(n.get("max_rate_mbps") or 0) > 0 for n in document["nodes"]
    )
