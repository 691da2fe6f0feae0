"""The state of a run as the console shows it: nodes, links, migrations, progress, events.

Built by the driver every tick, published to the run's Channels group and kept for
viewers who connect later (orchestrator/run/publisher.py); for a run without a driver
(pending, finished), built from PostgreSQL alone, without node states or routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from django.db.models import F, Sum
from django.utils import timezone

from balancer.document import (
    DEFAULT_BANDWIDTH_MBPS,
    EdgeDocument,
    NodeDocument,
    emulated,
    stage_of,
)
from balancer.model import NodeState
from balancer.topology import NodeSpec
from orchestrator.ledger.coalesce import first_unfinished
from orchestrator.ledger.window_view import WindowsView, windows_view
from orchestrator.models import Adjustment, Event, Instance, MergedChunk, Run, Segment, SourceFile
from orchestrator.pipeline.graph import pipeline_windows
from orchestrator.run.generation import Preparing, preparing
from orchestrator.source.base import LagJson
from sparkjobs.keygroups import KEY_SLOTS

RECENT_EVENTS = 30


class InstanceView(TypedDict):
    worker: str
    status: str  # active / joining / retiring
    aligning: bool


class NodeView(TypedDict):
    name: str
    kind: str
    stage: str
    capacity_bytes: int
    state: NodeState | Mapping[str, object]  # at the driver's last tick; {} before one
    instance: InstanceView


class LinkView(TypedDict):
    source: str
    target: str
    bandwidth_mbps: float
    share: float | None
    migrating: bool
    migrated_from: str | None
    closing: bool  # a connection of an instance being removed: it carries data until
    # the adjustment's marker passes


class Progress(TypedDict):
    merged_chunks: int
    chunks_total: int | None
    completed_fraction: float
    migrated_segments: int
    input_bytes: int
    # The input's size once it exists (a generated one is written by the driver), and
    # meanwhile how far its writing is: {"written", "total", "fraction"} or None.
    input_total: int
    preparing: Preparing | None


class RunView(Progress):
    id: int
    pipeline: str
    status: str
    epoch: int
    started_at: str | None
    elapsed_s: float
    policy: dict[str, str | None]  # throttling, routing, migration, placement
    # Whether the pipeline sets emulation knobs (balancer.document.emulated).
    emulated: bool
    error: str


class AdjustmentView(TypedDict):
    version: int
    kind: str
    status: str
    reason: str
    started_at: str
    finished_at: str | None
    subgraph: list[str]
    sources: list[str]
    tails: list[str]
    added: list[str]
    removed: list[str]
    outcome: dict[str, Any]
    aligned: list[str]
    markers: list[dict[str, str]]  # {"from": upstream, "to": node}


class SourceView(TypedDict):
    kind: str  # files, generator, folder, stream
    unbounded: bool
    what: str  # the folder and pattern, or the stream, or the number of files
    # What waits outside an unbounded source (files or entries, bytes, oldest's age),
    # at the driver's last tick; None for a bounded input or without a driver.
    lag: LagJson | None
    # Everything up to here is merged exactly once: the results are exact up to it
    # (a position in the input, or "nothing merged yet").
    exact_up_to: str


# What a snapshot shows of the run row (the topology and policy never change mid-run).
SNAPSHOT_FIELDS = [
    "merged_prefix",
    "status",
    "epoch",
    "chunks_total",
    "input_bytes",
    "started_at",
    "finished_at",
    "error",
    "source_position",
    "windows_closed",
]


class Snapshot(TypedDict):
    type: Literal["snapshot"]
    time: str
    final: bool
    run: RunView
    nodes: list[NodeView]
    links: list[LinkView]
    events: list[dict[str, Any]]  # Event.to_json(), newest first
    adjustment: AdjustmentView | None
    source: SourceView
    # A windowed run's event time: watermarks, each node's lag, open windows (null
    # for a pipeline without windows).
    windows: WindowsView | None


def _links(
    edges: list[EdgeDocument], routes: dict[str, dict[str, Any]], closing: set[str]
) -> list[LinkView]:
    links: list[LinkView] = []
    for edge in edges:
        src, dst = edge["from"], edge["to"]
        table = routes.get(src) or {}
        shares = table.get("shares")
        migrations: dict[str, dict[str, float]] = table.get("migrations") or {}
        migrated_from = next((heavy for heavy, moves in migrations.items() if dst in moves), None)
        links.append(
            LinkView(
                source=src,
                target=dst,
                bandwidth_mbps=float(edge.get("bandwidth_mbps", DEFAULT_BANDWIDTH_MBPS)),
                share=None if not shares else float(shares.get(dst, 0.0)),
                migrating=migrated_from is not None or dst in migrations,
                migrated_from=migrated_from,
                closing=src in closing or dst in closing,
            )
        )
    return links


def progress(run: Run) -> Progress:
    # A keyed stage merges a chunk in parts, one per key group, each naming the whole
    # chunk's bytes: a part counts for its share of the key slots.
    slots = F("slots_to") - F("slots_from")
    merged = MergedChunk.objects.filter(run=run).aggregate(
        length=Sum(F("origin_length") * slots), slots=Sum(slots)
    )
    total = int(run.input_spec.get("extent_total") or 0)
    done = int(merged["length"] or 0) // KEY_SLOTS
    folded = int((run.merged_prefix or {}).get("chunk", 0))  # coalesced chunks
    return Progress(
        merged_chunks=int(merged["slots"] or 0) // KEY_SLOTS + folded,
        chunks_total=run.chunks_total,
        completed_fraction=(done / total) if total else 0.0,
        migrated_segments=Segment.objects.filter(run=run).exclude(migrated_from="").count(),
        input_bytes=run.input_bytes,
        input_total=total,
        preparing=preparing(run.input_spec),
    )


def build_snapshot(
    run: Run,
    *,
    node_states: Mapping[str, NodeState],
    routes: dict[str, dict[str, Any]],
    final: bool = False,
    lag: LagJson | None = None,
) -> Snapshot:
    now = timezone.now()
    started = run.started_at
    ended = run.finished_at or now
    instances = {i.name: i for i in Instance.objects.filter(run=run)}
    adjustment = Adjustment.objects.filter(run=run).order_by("-version").first()
    docs: list[NodeDocument] = list(run.topology["nodes"])
    edges: list[EdgeDocument] = list(run.topology["edges"])
    closing: set[str] = set()
    if adjustment is not None and adjustment.status == Adjustment.Status.RUNNING:
        # Instances being removed stay on the view until the marker has passed them.
        closing = set(adjustment.plan["removed"])
        docs += [n for n in adjustment.before["nodes"] if n["name"] in closing]
        edges += [e for e in adjustment.before["edges"] if {e["from"], e["to"]} & closing]
    nodes = [
        NodeView(
            name=n["name"],
            kind=n["kind"],
            stage=stage_of(n),
            capacity_bytes=int(NodeSpec.from_document(n).capacity_bytes),
            state=node_states.get(n["name"], {}),
            instance=_instance(instances.get(n["name"])),
        )
        for n in docs
    ]
    events = [
        e.to_json() for e in Event.objects.filter(run=run).select_related("user")[:RECENT_EVENTS]
    ]
    return Snapshot(
        type="snapshot",
        time=now.isoformat(),
        final=final,
        run=RunView(
            id=run.pk,
            pipeline=run.pipeline_name,
            status=run.status,
            epoch=run.epoch,
            started_at=started.isoformat() if started else None,
            elapsed_s=(ended - started).total_seconds() if started else 0.0,
            policy={
                k: run.policy.get(k) for k in ("throttling", "routing", "migration", "placement")
            },
            emulated=emulated(run.topology),
            error=run.error,
            **progress(run),
        ),
        nodes=nodes,
        links=_links(edges, routes, closing),
        events=events,
        adjustment=_adjustment(adjustment, instances),
        source=source_view(run, lag),
        windows=_windows(run),
    )


def _windows(run: Run) -> WindowsView | None:
    spec = pipeline_windows(run.topology)
    # The results panel polls the closed windows' rows; the live view needs none.
    return None if spec is None else windows_view(run, spec, sample=False)


def source_view(run: Run, lag: LagJson | None) -> SourceView:
    spec = run.input_spec or {}
    kind = str(spec.get("kind") or ("generator" if spec.get("generator") else "files"))
    if kind == "folder":
        what = f"{spec.get('folder')}/{spec.get('pattern')}"
    elif kind == "stream":
        what = f"Redis stream {spec.get('stream')}"
        if int(spec.get("partitions") or 1) > 1:
            what += f" in {spec['partitions']} partitions"
    else:
        what = f"{len(spec.get('paths') or [])} file(s)"
    return SourceView(
        kind=kind,
        unbounded=kind in ("folder", "stream"),
        what=what,
        lag=lag,
        exact_up_to=exact_up_to(run),
    )


def exact_up_to(run: Run) -> str:
    """Where the data merged exactly once ends: every chunk before the first one still
    unfinished (or not yet emitted) is merged, so the results are exact up to it."""
    through = first_unfinished(run) - 1
    prefix = run.merged_prefix or {}
    if prefix and through == int(prefix["chunk"]) - 1:  # its row was coalesced
        file_index, end = int(prefix["file"]), int(prefix["offset"])
    else:
        last = (
            MergedChunk.objects.filter(run=run, chunk=through)
            .values_list("origin_file", "origin_offset", "origin_length")
            .first()
        )
        if last is None:
            return "nothing merged yet"
        file_index, end = last[0], last[1] + last[2]
    spec = run.input_spec or {}
    if spec.get("kind") == "stream":
        return f"{end:,} entries"
    paths = spec.get("paths") or []
    path = (
        paths[file_index]
        if file_index < len(paths)
        else SourceFile.objects.filter(run=run, index=file_index)
        .values_list("path", flat=True)
        .first()
    )
    name = path.rsplit("/", 1)[-1] if path else f"file {file_index}"
    return f"{name} byte {end:,}"


def _instance(instance: Instance | None) -> InstanceView:
    if instance is None:
        return InstanceView(worker="", status="active", aligning=False)
    return InstanceView(worker=instance.worker, status=instance.status, aligning=instance.aligning)


def _adjustment(
    adjustment: Adjustment | None, instances: dict[str, Instance]
) -> AdjustmentView | None:
    """The latest adjustment: its plan and, while it runs, where the markers are."""
    if adjustment is None:
        return None
    plan = adjustment.plan
    view = AdjustmentView(
        version=adjustment.version,
        kind=adjustment.kind,
        status=adjustment.status,
        reason=adjustment.reason,
        started_at=adjustment.started_at.isoformat(),
        finished_at=adjustment.finished_at.isoformat() if adjustment.finished_at else None,
        subgraph=plan["subgraph"],
        sources=plan["sources"],
        tails=plan["tails"],
        added=plan["added"],
        removed=plan["removed"],
        outcome=adjustment.outcome,
        aligned=[],
        markers=[],
    )
    if adjustment.status == Adjustment.Status.RUNNING:
        view["aligned"] = sorted(
            name
            for name in plan["subgraph"]
            if name in instances and instances[name].config >= adjustment.version
        )
        view["markers"] = [
            {"from": upstream, "to": node}
            for upstream, node in Segment.objects.filter(
                run_id=adjustment.run_id,
                marker=True,
                config=adjustment.version,
                state=Segment.State.QUEUED,
            ).values_list("upstream", "node")
        ]
    return view
