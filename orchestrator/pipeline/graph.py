"""A run's pipeline document as a frozen graph: built once per configuration, asked often.

The document (balancer/document.py) is what a run stores, one per hot-rescale version;
:class:`RunGraph` is what the runtime asks of it on every segment: a node's downstreams,
a link's bandwidth, a node's stage and its key group, whether it is keyed. It is
computed once when a graph is first asked for and kept (:meth:`RunGraph.of`,
:meth:`RunGraph.at`), so routing a segment costs dictionary lookups, not a walk over
the document.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import cast

from balancer.document import (
    DEFAULT_BANDWIDTH_MBPS,
    NodeDocument,
    PipelineDocument,
    stage_of,
)
from balancer.topology import Topology
from orchestrator.pipeline.inputs import InputFile
from sparkjobs.catalog import OPERATORS, operator_name, validate_params
from sparkjobs.catalog import keyed as is_keyed_node
from sparkjobs.event_time import WindowSpec
from sparkjobs.keygroups import KeyGroup, stage_key_groups
from sparkjobs.measures import Grouping
from sparkjobs.sql_stage import query_of

# Graphs kept per process: a run has one per configuration in use (two while a hot
# rescale is under way), and a process serves a few runs at a time.
CACHED_GRAPHS = 128

# A document as read from a JSON column, not typed yet (``Run.topology``, an
# adjustment's ``before``): what the helpers by document below also take.
StoredDocument = Mapping[str, object]


@dataclass(frozen=True, eq=False)
class RunGraph:
    """The questions the runtime asks of one version of a run's pipeline document.

    The document must not change once a graph is made of it: documents are values (a
    run's new configuration is a new document).
    """

    document: PipelineDocument
    nodes: Mapping[str, NodeDocument]
    downstreams: Mapping[str, tuple[str, ...]]  # in the document's edge order
    bandwidths: Mapping[tuple[str, str], float]  # Mb/s per link; 0 = unlimited
    stages: Mapping[str, tuple[str, ...]]  # stage -> members, in declaration order
    stage_of: Mapping[str, str]
    keyed: frozenset[str]  # nodes whose input splits by key group (sparkjobs.catalog.keyed)
    source: str  # the (first) source node

    @classmethod
    def build(cls, doc: PipelineDocument) -> RunGraph:
        nodes = {n["name"]: n for n in doc["nodes"]}
        downstreams: dict[str, list[str]] = {name: [] for name in nodes}
        bandwidths: dict[tuple[str, str], float] = {}
        for edge in doc.get("edges", []):
            src, dst = edge["from"], edge["to"]
            downstreams.setdefault(src, []).append(dst)
            bandwidths[(src, dst)] = float(edge.get("bandwidth_mbps", DEFAULT_BANDWIDTH_MBPS))
        stages: dict[str, list[str]] = {}
        for node in doc["nodes"]:
            stages.setdefault(stage_of(node), []).append(node["name"])
        keyed = frozenset(name for name, node in nodes.items() if is_keyed_node(node))
        source = next((n["name"] for n in doc["nodes"] if n["kind"] == "source"), "")
        return cls(
            document=doc,
            nodes=nodes,
            downstreams={name: tuple(downs) for name, downs in downstreams.items()},
            bandwidths=bandwidths,
            stages={stage: tuple(members) for stage, members in stages.items()},
            stage_of={name: stage_of(node) for name, node in nodes.items()},
            keyed=keyed,
            source=source,
        )

    # -- kept graphs --------------------------------------------------------------------

    @classmethod
    def of(cls, doc: PipelineDocument) -> RunGraph:
        """The graph of ``doc``, made on the first call for this document object."""
        return _GRAPHS.get(("document", id(doc)), doc)

    @classmethod
    def at(cls, run_id: int, config: int, doc: PipelineDocument) -> RunGraph:
        """The graph of run ``run_id`` at configuration ``config``, whose document is
        ``doc`` (read from the run or its adjustment): made once per configuration, and
        again only when the document differs from the one it was made of (a rolled
        back adjustment leaves the version where it was and restores the graph before).
        """
        graph = _GRAPHS.get(("run", run_id, config), doc)
        # Callers holding the graph's document (routing by it) find it by that too.
        _GRAPHS.put(("document", id(graph.document)), graph)
        return graph

    # -- questions ----------------------------------------------------------------------

    @cached_property
    def topology(self) -> Topology:
        """The balancer's view of this graph: a keyed node's data is not mergeable."""
        return Topology.from_document(self.document, mergeable=lambda node: not is_keyed_node(node))

    def node(self, name: str) -> NodeDocument:
        return self.nodes[name]

    def operator(self, name: str) -> str:
        """The operator node ``name`` runs (its kind's default when it names none)."""
        return operator_name(self.nodes[name])

    def downstreams_of(self, name: str) -> tuple[str, ...]:
        return self.downstreams.get(name, ())

    def bandwidth(self, src: str, dst: str) -> float:
        """The link's emulated bandwidth in Mb/s; 0 when unlimited or not a link."""
        return self.bandwidths.get((src, dst), 0.0)

    def stage_members(self, stage: str) -> tuple[str, ...]:
        return self.stages.get(stage, ())

    def is_keyed(self, name: str) -> bool:
        return name in self.keyed

    def key_groups(self, stage: str) -> Mapping[str, KeyGroup]:
        """Each member's key group (:func:`sparkjobs.keygroups.stage_key_groups`)."""
        return self._key_groups.get(stage, {})

    def fusable_with(self, name: str) -> tuple[str, ...]:
        """The other members of ``name``'s stage whose batches one Spark job may run
        with its own (docs/architecture.md, "siblings in one job"): the same operator
        with the same parameters, stateless, at no emulated rate of its own, in a
        pipeline without event-time windows. Nothing for a source or a sink."""
        return self._fusable.get(name, ())

    @cached_property
    def _fusable(self) -> Mapping[str, tuple[str, ...]]:
        if pipeline_windows(self.document) is not None:
            return {}

        def signature(node: NodeDocument) -> str | None:
            spec = OPERATORS.get(operator_name(node))
            if (
                node["kind"] != "operator"
                or spec is None
                or spec.stateful
                or float(node.get("max_rate_mbps") or 0.0) > 0
            ):
                return None
            return json.dumps([spec.name, node.get("params") or {}], sort_keys=True)

        fusable: dict[str, tuple[str, ...]] = {}
        for members in self.stages.values():
            for name in members:
                own = signature(self.nodes[name])
                if own is not None:
                    fusable[name] = tuple(
                        m for m in members if m != name and signature(self.nodes[m]) == own
                    )
        return fusable

    @cached_property
    def _key_groups(self) -> Mapping[str, Mapping[str, KeyGroup]]:
        return {
            stage: stage_key_groups(
                members,
                {m: self.nodes[m]["key_slots"] for m in members if "key_slots" in self.nodes[m]},
            )
            for stage, members in self.stages.items()
        }


class _Kept:
    """The graphs made last, by key; a key whose document changed is made again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.graphs: OrderedDict[Hashable, RunGraph] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Hashable, doc: PipelineDocument) -> RunGraph:
        with self.lock:
            kept = self.graphs.get(key)
            if kept is not None and (kept.document is doc or kept.document == doc):
                self.graphs.move_to_end(key)
                return kept
        graph = RunGraph.build(doc)
        self.put(key, graph)
        return graph

    def put(self, key: Hashable, graph: RunGraph) -> None:
        with self.lock:
            self.graphs[key] = graph
            self.graphs.move_to_end(key)
            while len(self.graphs) > self.size:
                self.graphs.popitem(last=False)


_GRAPHS = _Kept(CACHED_GRAPHS)


# -- the document's questions, by document (kept for callers holding a document) ---------


def graph_of(doc: PipelineDocument | StoredDocument) -> RunGraph:
    """:meth:`RunGraph.of` for a document as stored (the types say what it holds)."""
    return RunGraph.of(cast("PipelineDocument", doc))


def balancer_topology(doc: PipelineDocument | StoredDocument) -> Topology:
    """The balancer's view of ``doc``: :meth:`balancer.topology.Topology.from_document`,
    a keyed node's data not mergeable (:func:`sparkjobs.catalog.keyed`)."""
    return graph_of(doc).topology


def downstreams_of(doc: PipelineDocument | StoredDocument, name: str) -> list[str]:
    return list(graph_of(doc).downstreams_of(name))


def bandwidth(doc: PipelineDocument | StoredDocument, src: str, dst: str) -> float:
    return graph_of(doc).bandwidth(src, dst)


def input_extent(files: Sequence[InputFile]) -> list[tuple[int, int]]:
    """Each input file's (data start, end): what the merged chunks must tile."""
    return [(f.data_start, f.size) for f in files]


def operator_problems(doc: PipelineDocument) -> list[str]:
    """Why a stored pipeline's nodes may not run as they are, one line per problem.

    The console checks a document when it is saved; a run checks it again when it
    starts, because what is admitted may have narrowed since (expressions, say).
    """
    problems = [
        f"node {node['name']}: {problem}"
        for node in doc["nodes"]
        for problem in validate_params(operator_name(node), node["kind"], node.get("params") or {})
    ]
    return problems or window_problems(doc)


def aggregating_nodes(doc: PipelineDocument | StoredDocument) -> list[NodeDocument]:
    nodes = cast("PipelineDocument", doc)["nodes"]
    return [n for n in nodes if OPERATORS[operator_name(n)].partials]


def window_problems(
    doc: PipelineDocument | StoredDocument, tick_ms: int | None = None
) -> list[str]:
    """Partials meet at the sink, so every aggregating node must window alike: one
    sink merges (window, key) rows, and the source tracks one event-time field. A
    window shorter than the balancer's tick would close between two looks at it."""
    specs = {
        n["name"]: WindowSpec.from_params(n.get("params") or {}) for n in aggregating_nodes(doc)
    }
    sinks = {json.dumps(n.get("params") or {}, sort_keys=True) for n in _sinks(doc)}
    if len(sinks) > 1:
        return ["sink nodes must have the same parameters: closed windows go to one place"]
    groupings = {n["name"]: _grouping(n) for n in aggregating_nodes(doc)}
    if len(set(groupings.values())) > 1:
        named = sorted(name for name, grouping in groupings.items() if grouping is not None)
        return [
            "aggregating nodes must compute the same group_by and measures (their partials "
            f"meet at the sink); {', '.join(named)} differ from the others"
        ]
    grouping = next(iter(groupings.values()), None)
    if grouping is not None and pipeline_sink(doc).get("sink", "results") != "results":
        named = sink_name_problems(grouping)
        if named:
            return named
    kind = pipeline_sink(doc).get("sink", "results")
    if kind != "results" and not any(specs.values()):
        return [
            f"sink {kind} writes closed windows: give the aggregating nodes window_s "
            "(and event_time)"
        ]
    if len(set(specs.values())) <= 1:
        spec = next(iter(specs.values()), None)
        if spec is not None and tick_ms is not None and spec.size_us < tick_ms * 1000:
            return [
                f"window_s ({spec.size_us / 1e6:g} s) must not be shorter than the "
                f"balancer tick (tick_ms {tick_ms})"
            ]
        return []
    shown = "; ".join(
        f"{name}: {'no window' if spec is None else spec.describe()}"
        for name, spec in sorted(specs.items())
    )
    return [f"aggregating nodes must have the same window fields, got {shown}"]


# The columns a sink table or file has besides the stage's own; PostgreSQL keeps
# identifiers of at most 63 bytes (it cuts longer ones).
SINK_OWN_COLUMNS = ("window_start", "window_end", "run_id")
MAX_COLUMN_BYTES = 63


def sink_name_problems(grouping: Grouping) -> list[str]:
    """The group fields and measures a sink table cannot take as its columns' names."""
    said = []
    for name in [*grouping.group_by, *(m.name for m in grouping.measures)]:
        if name in SINK_OWN_COLUMNS:
            said.append(f"{name!r} is a column the sink writes itself: name it otherwise")
        elif len(name.encode()) > MAX_COLUMN_BYTES:
            said.append(
                f"{name[:20]!r}... is longer than a sink column's name may be "
                f"({MAX_COLUMN_BYTES} bytes)"
            )
    return said


def _sinks(doc: PipelineDocument | StoredDocument) -> list[NodeDocument]:
    nodes = cast("PipelineDocument", doc)["nodes"]
    return [n for n in nodes if n["kind"] == "sink"]


def pipeline_sink(doc: PipelineDocument | StoredDocument) -> Mapping[str, object]:
    """The parameters of the pipeline's sink (its sink nodes share them)."""
    sinks = _sinks(doc)
    return dict(sinks[0].get("params") or {}) if sinks else {}


def pipeline_grouping(doc: PipelineDocument | StoredDocument) -> Grouping | None:
    """The grouped measures the pipeline computes (its aggregating nodes share them; the
    key form's as sparkjobs/key_form.py reads it), or None for a pipeline without an
    aggregating stage of valid parameters."""
    for node in aggregating_nodes(doc):
        return _grouping(node)
    return None


def result_grouping(doc: PipelineDocument | StoredDocument) -> Grouping:
    """:func:`pipeline_grouping` of a pipeline that runs: the console saves no pipeline
    without one, so a missing one is a document it never accepted (``ValueError``)."""
    grouping = pipeline_grouping(doc)
    if grouping is None:
        raise ValueError("the pipeline has no aggregating stage of valid parameters")
    return grouping


def _grouping(node: NodeDocument) -> Grouping | None:
    query = query_of(node.get("params") or {})
    return None if query is None else query.grouping


def pipeline_windows(doc: PipelineDocument | StoredDocument) -> WindowSpec | None:
    """The pipeline's event-time windows (its aggregating nodes share them), or None."""
    for node in aggregating_nodes(doc):
        return WindowSpec.from_params(node.get("params") or {})
    return None
