"""One operator batch on a Spark worker: claim, run the operator, complete.

Runs inside a Celery task on the ``spark`` queue. Everything is idempotent: output ids
and files derive from input ids, so a batch re-run after a crash writes the same files
and inserts no new rows; the completion is refused when the lease was lost meanwhile.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from orchestrator import ledger
from orchestrator.models import Run, Segment
from orchestrator.routing import Routes, route

MAX_BATCH_SEGMENTS = 64
MAX_BATCH_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class BatchReport:
    node: str
    segments: int
    bytes: int
    malformed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "segments": self.segments, "bytes": self.bytes,
                "malformed": self.malformed}  # fmt: skip


def run_dir(run_id: int) -> Path:
    return Path(settings.DATA_DIR) / "runs" / str(run_id)


def segment_path(run_id: int, segment_id: str) -> Path:
    return run_dir(run_id) / "segments" / f"{segment_id}.jsonl"


def output_id(input_id: str, node: str) -> str:
    return f"{input_id}.{node}"


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _node(topology: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(n for n in topology["nodes"] if n["name"] == name)


def downstreams_of(topology: Mapping[str, Any], name: str) -> list[str]:
    return [e["to"] for e in topology["edges"] if e["from"] == name]


def bandwidth(topology: Mapping[str, Any], src: str, dst: str) -> float:
    for edge in topology["edges"]:
        if edge["from"] == src and edge["to"] == dst:
            return float(edge.get("bandwidth_mbps", 0.0))
    return 0.0


def process_batch(
    run_id: int, node_name: str, routes_json: Mapping[str, Any] | None
) -> BatchReport:
    run = Run.objects.get(pk=run_id)
    node = _node(run.topology, node_name)
    owner = worker_identity()
    batch = ledger.claim_batch(
        run_id,
        node_name,
        owner,
        max_segments=MAX_BATCH_SEGMENTS,
        max_bytes=MAX_BATCH_BYTES,
        lease_s=settings.BPCONSOLE_LEASE_S,
        rate_mbps=float(node.get("max_rate_mbps", 0.0)),
    )
    if not batch:
        return BatchReport(node_name, 0, 0)
    size = sum(s.bytes for s in batch)
    if node["kind"] == "sink":
        _merge(run, node_name, owner, batch)
        return BatchReport(node_name, len(batch), size)
    malformed = _operate(run, node, owner, batch, Routes.from_json(routes_json))
    return BatchReport(node_name, len(batch), size, malformed)


def _operate(
    run: Run, node: Mapping[str, Any], owner: str, batch: list[Segment], routes: Routes
) -> int:
    from sparkjobs.aggregate import AggregateParams, partial_aggregate
    from sparkjobs.session import spark_session
    from sparkjobs.transform import transform

    name = node["name"]
    spark = spark_session()
    inputs = {s.pk: Path(s.path) for s in batch}
    outputs = {s.pk: segment_path(run.pk, output_id(s.pk, name)) for s in batch}
    params = node.get("params") or {}
    if node["operator"] == "aggregate":
        produced = partial_aggregate(spark, inputs, outputs, AggregateParams.from_params(params))
    else:
        produced = transform(spark, node["operator"], params, inputs, outputs)
    _quarantine(run.pk, {seg: out.quarantined for seg, out in produced.items()})
    downstreams = downstreams_of(run.topology, name)
    new = []
    for seg in batch:
        out = produced[seg.pk]
        new_id = output_id(seg.pk, name)
        target, migrated_from = route(new_id, seg.tag, downstreams, routes)
        new.append(
            ledger.NewSegment(
                id=new_id, chunk=seg.chunk, origin_file=seg.origin_file,
                origin_offset=seg.origin_offset, origin_length=seg.origin_length,
                node=target, upstream=name, tag=seg.tag, path=str(out.path), bytes=out.bytes,
                records=out.records, migrated_from=migrated_from,
                link_mbps=bandwidth(run.topology, name, target),
            )
        )  # fmt: skip
    malformed = {seg: out.malformed for seg, out in produced.items()}
    ledger.complete_batch(run.pk, owner, batch, new, malformed)
    return sum(malformed.values())


def _merge(run: Run, sink: str, owner: str, batch: list[Segment]) -> None:
    from sparkjobs.merge import combine_partials
    from sparkjobs.session import spark_session

    spark = spark_session()
    pending = list(batch)
    while pending:
        merged = combine_partials(spark, [Path(s.path) for s in pending])
        deltas = [ledger.KeyDelta(m.key, m.count, m.sum, m.min, m.max, m.distinct) for m in merged]
        try:
            ledger.complete_sink_batch(run.pk, sink, owner, pending, deltas)
            return
        except ledger.AlreadyMergedError as err:
            # Delivered twice: those chunks are in the result already. Merge the rest,
            # and mark the duplicates done without touching the result.
            duplicates = [s for s in pending if s.chunk in err.chunks]
            ledger.complete_batch(run.pk, owner, duplicates, [], {})
            pending = [s for s in pending if s.chunk not in err.chunks]


def _quarantine(run_id: int, lines: Mapping[str, list[str]]) -> None:
    from sparkjobs.segments import write_atomic

    for seg, bad in lines.items():
        if bad:
            body = "".join(line + "\n" for line in bad).encode()
            write_atomic(run_dir(run_id) / "quarantine" / f"{seg}.jsonl", body)
