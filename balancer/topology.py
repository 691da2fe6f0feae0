"""The pipeline graph as the balancer sees it: nodes, links, stages.

Built once per run (or per hot-rescale epoch) and shared by every decision, so the
adjacency is computed up front: decisions over 1,000 nodes must stay in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from balancer.document import (
    DEFAULT_BANDWIDTH_MBPS,
    DEFAULT_BUFFER_MB,
    DEFAULT_KIND,
    DEFAULT_LATENCY_MS,
    DEFAULT_MAX_RATE_MBPS,
    EdgeDocument,
    NodeDocument,
    NodeKind,
    PipelineDocument,
)
from balancer.units import MB, MEGABIT


@dataclass(frozen=True)
class NodeSpec:
    """A node of the pipeline (one operator instance)."""

    id: str
    kind: NodeKind = "operator"
    stage: str = ""
    capacity_bytes: float = DEFAULT_BUFFER_MB * MB
    mergeable: bool = True
    max_rate_bps: float = 0.0  # bytes per second; 0 means unlimited
    # Bytes it sends on per byte it takes in: an aggregation sends on a few per cent.
    # Not in a document: measured while a run goes (1 until then), so that a capacity
    # after the node counts what it carries of the node's input.
    reduction: float = 1.0

    @property
    def stage_name(self) -> str:
        return self.stage or self.id

    @classmethod
    def from_document(
        cls, node: NodeDocument, *, megabit: float = MEGABIT, mergeable: bool = True
    ) -> NodeSpec:
        """A node of a pipeline document, its optional fields at their defaults."""
        return cls(
            id=str(node["name"]),
            kind=node.get("kind", DEFAULT_KIND),
            stage=str(node.get("stage") or ""),
            capacity_bytes=float(node.get("buffer_mb", DEFAULT_BUFFER_MB)) * MB,
            mergeable=mergeable,
            max_rate_bps=float(node.get("max_rate_mbps", DEFAULT_MAX_RATE_MBPS)) * megabit,
        )


def check_reductions(reductions: Mapping[str, float]) -> None:
    """Raise ValueError naming every reduction that is not finite and >= 0."""
    bad = {n: r for n, r in reductions.items() if not (r >= 0 and math.isfinite(r))}
    if bad:
        raise ValueError(f"reductions must be finite and >= 0: {bad}")


@dataclass(frozen=True)
class LinkSpec:
    """A directed link; bandwidth in bytes per second, 0 means unlimited."""

    src: str
    dst: str
    bandwidth_bps: float = 0.0
    latency_s: float = 0.0  # one-way propagation delay, added after serialisation

    @classmethod
    def from_document(cls, edge: EdgeDocument, *, megabit: float = MEGABIT) -> LinkSpec:
        """An edge of a pipeline document, its optional fields at their defaults."""
        return cls(
            src=str(edge["from"]),
            dst=str(edge["to"]),
            bandwidth_bps=float(edge.get("bandwidth_mbps", DEFAULT_BANDWIDTH_MBPS)) * megabit,
            latency_s=float(edge.get("latency_ms", DEFAULT_LATENCY_MS)) / 1000,
        )


@dataclass(frozen=True)
class Topology:
    """An acyclic graph of nodes and links (validated where it is built)."""

    nodes: tuple[NodeSpec, ...]
    links: tuple[LinkSpec, ...]
    _by_id: Mapping[str, NodeSpec] = field(init=False, repr=False, compare=False)
    _up: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _down: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _links: Mapping[tuple[str, str], LinkSpec] = field(init=False, repr=False, compare=False)
    _stages: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _order: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {n.id: n for n in self.nodes}
        up: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        down: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for link in self.links:
            down[link.src].append(link.dst)
            up[link.dst].append(link.src)
        stages: dict[str, list[str]] = {}
        for node in self.nodes:
            stages.setdefault(node.stage_name, []).append(node.id)
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_up", {k: tuple(v) for k, v in up.items()})
        object.__setattr__(self, "_down", {k: tuple(v) for k, v in down.items()})
        object.__setattr__(self, "_links", {(lk.src, lk.dst): lk for lk in self.links})
        object.__setattr__(self, "_stages", {k: tuple(v) for k, v in stages.items()})
        object.__setattr__(self, "_order", _topological_order(self.nodes, down, up))

    @classmethod
    def build(cls, nodes: Iterable[NodeSpec], links: Iterable[LinkSpec]) -> Topology:
        return cls(nodes=tuple(nodes), links=tuple(links))

    @classmethod
    def from_document(
        cls,
        doc: PipelineDocument,
        *,
        megabit: float = MEGABIT,
        mergeable: Callable[[NodeDocument], bool] | None = None,
    ) -> Topology:
        """The balancer's view of a pipeline document (balancer/document.py).

        The one place a document becomes a topology, for live runs, hot rescales and
        the simulator alike; every optional field takes its default from
        balancer/document.py. ``megabit`` is how many bytes per second one of the
        document's Mb/s is (the runtime's :data:`~balancer.units.MEGABIT`; the
        simulator's replay of the published experiment reads its own unit).
        ``mergeable`` says whether a node's data may be shifted or migrated between
        its stage's instances, which depends on its operator: the balancer does not
        know operators, so the caller that does passes the catalog's answer; without
        it every node is mergeable. Raises ``ValueError`` on a cycle.
        """
        nodes = [
            NodeSpec.from_document(
                node, megabit=megabit, mergeable=True if mergeable is None else mergeable(node)
            )
            for node in doc["nodes"]
        ]
        links = [LinkSpec.from_document(edge, megabit=megabit) for edge in doc.get("edges", [])]
        return cls.build(nodes, links)

    def with_reductions(self, reductions: Mapping[str, float]) -> Topology:
        """The same graph with ``reductions[n]`` as node ``n``'s reduction (the others
        unchanged); raises ValueError for one that is not finite and >= 0."""
        check_reductions(reductions)
        nodes = [
            replace(spec, reduction=float(reductions[spec.id])) if spec.id in reductions else spec
            for spec in self.nodes
        ]
        return Topology.build(nodes, self.links)

    def node(self, node_id: str) -> NodeSpec:
        return self._by_id[node_id]

    def has_node(self, node_id: str) -> bool:
        return node_id in self._by_id

    def upstreams(self, node_id: str) -> tuple[str, ...]:
        return self._up[node_id]

    def downstreams(self, node_id: str) -> tuple[str, ...]:
        return self._down[node_id]

    def link(self, src: str, dst: str) -> LinkSpec:
        return self._links[(src, dst)]

    @cached_property
    def source_shares(self) -> tuple[Mapping[str, float], Mapping[str, float]]:
        """Per node, the bytes of its input and of its output per byte the sources
        emitted, each node sending on its ``reduction`` of what it takes in. Where paths
        into a node differ, the smallest is taken (a capacity counted in source bytes is
        then overstated, never understated)."""
        shares_in: dict[str, float] = {}
        shares_out: dict[str, float] = {}
        for node_id in self._order:
            shares_in[node_id] = min((shares_out[u] for u in self._up[node_id]), default=1.0)
            shares_out[node_id] = shares_in[node_id] * self._by_id[node_id].reduction
        return shares_in, shares_out

    @cached_property
    def downstreams_by_stage(self) -> Mapping[str, Mapping[str, tuple[str, ...]]]:
        """Each node's direct downstreams grouped by stage, stages in link order.

        Computed on first use (once per topology): per-tick decisions that look at the
        stages an upstream feeds would otherwise walk every link on every tick.
        """
        grouped: dict[str, Mapping[str, tuple[str, ...]]] = {}
        for node_id, downs in self._down.items():
            by_stage: dict[str, list[str]] = {}
            for down in downs:
                by_stage.setdefault(self._by_id[down].stage_name, []).append(down)
            grouped[node_id] = {stage: tuple(members) for stage, members in by_stage.items()}
        return grouped

    def stage_members(self, stage: str) -> tuple[str, ...]:
        return self._stages.get(stage, ())

    @property
    def stages(self) -> Mapping[str, tuple[str, ...]]:
        return self._stages

    @property
    def order(self) -> tuple[str, ...]:
        """Node ids in topological order (sources first); ties keep declaration order."""
        return self._order

    def sources(self) -> tuple[str, ...]:
        return tuple(n for n in self._order if not self._up[n])

    def sinks(self) -> tuple[str, ...]:
        return tuple(n for n in self._order if not self._down[n])


def _topological_order(
    nodes: tuple[NodeSpec, ...],
    down: Mapping[str, list[str]],
    up: Mapping[str, list[str]],
) -> tuple[str, ...]:
    indegree = {n.id: len(up[n.id]) for n in nodes}
    ready = [n.id for n in nodes if indegree[n.id] == 0]
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for nxt in down[current]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if len(order) != len(nodes):
        stuck = sorted(n for n, d in indegree.items() if d > 0)
        raise ValueError(f"topology has a cycle through {', '.join(stuck)}")
    return tuple(order)
