"""One operator batch on a Spark worker: claim, run the operator, complete.

Runs inside a Celery task on the ``spark`` queue. Everything is idempotent: output ids
and files derive from input ids, so a batch re-run after a crash writes the same files
and inserts no new rows; the completion is refused when the lease was lost meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import DatabaseError, transaction

from balancer.document import DEFAULT_MAX_RATE_MBPS, NodeDocument, OperatorParams, PipelineDocument
from balancer.units import MB
from orchestrator.ledger import failures, ingested, keystate, seen, segments
from orchestrator.models import Adjustment, Run, Segment
from orchestrator.pipeline.graph import RunGraph, pipeline_windows, result_grouping
from orchestrator.pipeline.layout import run_dir, segment_path
from orchestrator.pipeline.reference import job_params
from orchestrator.pipeline.routes import Routes
from orchestrator.rescale import alignment, plan
from orchestrator.worker.lease import LeaseKeeper
from orchestrator.worker.stopwatch import BatchTimeLimitError, StopWatch, cancel_group, job_group
from sparkjobs.catalog import operator_of
from sparkjobs.keygroups import KeyGroup
from sparkjobs.merge import combine_groups
from sparkjobs.schemas import INPUT_SCHEMA, declared_ddl
from sparkjobs.segments import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkjobs.outputs import PartialOutput

log = logging.getLogger(__name__)

MAX_BATCH_SEGMENTS = 64
# A new Spark JVM's or a new pool process's first batch: a new JVM runs interpreted code
# until the JIT has compiled it, so a large batch there is slow (in the chaos suite a
# 64-segment batch took 20 s on a new JVM, 7 s on a warm one, and 4 segments 14 s); a new
# process on the worker's warm JVM (ADR 0007) often re-runs a killed batch, 9 to 10 s at
# 64 segments. A small one puts out results sooner after a restart, and the next batches
# are full size.
NEW_JVM_BATCH_SEGMENTS = 4


@dataclass(frozen=True)
class BatchReport:
    node: str
    segments: int
    bytes: int
    malformed: int = 0
    aligned: alignment.Aligned | None = None
    failure: str = ""
    fused: tuple[str, ...] = ()  # siblings whose data the batch took with its own

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "segments": self.segments,
            "bytes": self.bytes,
            "malformed": self.malformed,
            "failure": self.failure,
            "fused": list(self.fused),
            "aligned": None if self.aligned is None else self.aligned.version,
        }


def output_id(input_id: str, node: str) -> str:
    return f"{input_id}.{node}"


def worker_identity(task_id: str = "") -> str:
    """The owner written on a batch's lease. It names the Celery task, so the batch is
    freed at once (``segments.release_task``) when the driver sees the task fail (its
    process died: ``WorkerLostError``) or the task's next attempt starts, instead of
    after the lease."""
    task = f"task={task_id}:" if task_id else ""
    return f"{socket.gethostname()}:{os.getpid()}:{task}{uuid.uuid4().hex[:8]}"


def process_batch(
    run_id: int,
    node_name: str,
    routes_json: Mapping[str, object] | None,
    *,
    task_id: str = "",
    siblings: Mapping[str, Mapping[str, object]] | None = None,
    max_bytes: int | None = None,
) -> BatchReport:
    """A batch of ``node_name``'s arrived data; with it, up to the batch's bounds, what
    has arrived at ``siblings`` (stage members the driver placed on any Spark worker,
    each with its routing table) that the graph lets one job run with it. The batch
    takes at most ``BPCONSOLE_BATCH_MB``, and at most ``max_bytes`` where the driver
    bounds it: the balancer's bound (balancer/queued.py, ``batch_bounds``), half the
    pool of an instance placed on a worker of its own (balancer/runtime.py)."""
    run = Run.objects.get(pk=run_id)
    if not run.is_active:
        return BatchReport(node_name, 0, 0)  # queued before the run stopped or failed
    owner = worker_identity(task_id)
    if task_id:
        # A retry of this task (its last attempt gave up on an unreachable database):
        # what that attempt still held is free at once, not after its lease.
        segments.release_task(run_id, task_id)
    node = _node_at(run, node_name)
    max_segments, limit = MAX_BATCH_SEGMENTS, int(settings.BPCONSOLE_BATCH_MB * MB)
    if max_bytes is not None:
        limit = min(limit, max_bytes)
    # Spark first, then the batch: a new worker's JVM takes seconds to start, and while a
    # batch is claimed its node cannot align for an adjustment.
    if node["kind"] != "sink" and not _spark_ready():
        max_segments = NEW_JVM_BATCH_SEGMENTS
    claim = alignment.claim_batch(
        run_id,
        node_name,
        owner,
        max_segments=max_segments,
        max_bytes=limit,
        lease_s=settings.BPCONSOLE_LEASE_S,
        rate_mbps=float(node.get("max_rate_mbps", DEFAULT_MAX_RATE_MBPS)),
    )
    aligned = claim.aligned
    if not claim:
        return BatchReport(node_name, 0, 0, aligned=aligned)
    # Read again: an adjustment may have begun between reading the run and the claim,
    # and the batch must route with the graph its claim aligned to.
    run.refresh_from_db(fields=["topology", "config_version"])
    doc = plan.topology_at(run, claim.config, node_name)
    # The run's graph now, or the one before an adjustment this node has not aligned
    # with yet (the graph of the claim's configuration): made once per configuration.
    graph = RunGraph.at(run.pk, run.config_version if doc is run.topology else claim.config, doc)
    routes = {node_name: Routes.from_json(routes_json)}
    batch = list(claim.segments)
    if node["kind"] != "sink" and aligned is None and siblings:
        batch += _claim_siblings(
            run_id,
            graph,
            node_name,
            owner=owner,
            claim=claim,
            siblings=siblings,
            routes=routes,
            max_segments=max_segments - len(batch),
            max_bytes=limit - sum(s.bytes for s in batch),
        )
    size = sum(s.bytes for s in batch)
    keeper = LeaseKeeper(
        [s.pk for s in batch],
        owner,
        lease_s=settings.BPCONSOLE_LEASE_S,
        max_hold_s=settings.BPCONSOLE_BATCH_MAX_S,
    )
    with keeper:
        if node["kind"] == "sink":
            _merge(run, node_name, owner, claim.segments)
            return BatchReport(node_name, len(claim), size, aligned=aligned)
        try:
            malformed = _operate(
                run,
                graph=graph,
                node=node,
                owner=owner,
                batch=batch,
                config=claim.config,
                routes=routes,
            )
        except (segments.LeaseLostError, DatabaseError):
            raise  # not the operator's failure: the task's retry policy and the lease
        except Exception as error:  # noqa: BLE001 - any operator error is this batch's
            if _spark_died(error):
                out_of_memory = _out_of_memory()
                if out_of_memory is not None:
                    # This batch may have exhausted the JVM: counted as its failure,
                    # so it cannot take every new JVM down with it.
                    failure = _failed(run, node_name, owner, batch, out_of_memory)
                    return BatchReport(
                        node_name, len(batch), size, aligned=aligned, failure=failure
                    )
                # The engine failed, not the operator: the batch goes back to its pool
                # unprocessed and uncounted; the next one starts a new session.
                segments.release(owner, batch)
                log.warning(
                    "run %s node %s: Spark died under the batch: %s", run.pk, node_name, error
                )
                return BatchReport(node_name, 0, 0, aligned=aligned, failure="spark died")
            failure = _failed(run, node_name, owner, batch, error)
            return BatchReport(node_name, len(batch), size, aligned=aligned, failure=failure)
    return BatchReport(
        node_name, len(batch), size, malformed, aligned=aligned, fused=_fused(node_name, batch)
    )


def _claim_siblings(
    run_id: int,
    graph: RunGraph,
    node: str,
    *,
    owner: str,
    claim: alignment.AlignedClaim,
    siblings: Mapping[str, Mapping[str, object]],
    routes: dict[str, Routes],
    max_segments: int,
    max_bytes: int,
) -> list[Segment]:
    """What has arrived at ``node``'s fusable siblings, claimed under the batch's owner
    and lease while the batch has room: one Spark job instead of one per sibling (the
    fixed cost of a job, and every job's own partial sets of a key's values; docs/
    benchmarks.md, "siblings in one job"). Each sibling's routing table goes into
    ``routes``. A claim the batch cannot take with its own (another configuration,
    another key-group part, a file already in the batch) goes back at once."""
    taken: list[Segment] = []
    files = {Path(s.path).stem for s in claim.segments}
    first = claim.segments[0]
    for sibling in graph.fusable_with(node):
        if sibling not in siblings or max_segments <= 0 or max_bytes <= 0:
            continue
        # While the batch holds less than its bytes: the segment that crosses them is
        # taken, as by a batch's own claim.
        got = alignment.claim_sibling(
            run_id,
            sibling,
            owner,
            config=claim.config,
            max_segments=max_segments,
            max_bytes=max_bytes,
            lease_s=settings.BPCONSOLE_LEASE_S,
        )
        if not got:
            continue
        stems = {Path(s.path).stem for s in got.segments}
        if (
            got.config != claim.config
            or (got.segments[0].slots_from, got.segments[0].slots_to)
            != (first.slots_from, first.slots_to)
            or stems & files
        ):
            segments.release(owner, got.segments)
            continue
        routes[sibling] = Routes.from_json(siblings[sibling])
        taken += got.segments
        files |= stems
        max_segments -= len(got.segments)
        max_bytes -= sum(s.bytes for s in got.segments)
    return taken


def _fused(node: str, batch: list[Segment]) -> tuple[str, ...]:
    """The siblings whose data a batch of ``node`` took."""
    return tuple(sorted({s.node for s in batch} - {node}))


def _spark_ready() -> bool:
    """This worker's Spark session, a new one when the JVM of the last has died; whether
    its JVM has run a batch already."""
    from orchestrator.services import heartbeat
    from sparkjobs.session import has_collected, operator_session, restart_if_dead

    code = restart_if_dead()
    if code is not None:
        log.warning("the Spark JVM of this worker had exited with code %s; new session", code)
    operator_session()
    heartbeat.start()
    return has_collected()


def _spark_died(error: Exception) -> bool:
    """Did the batch fail because this worker's Spark JVM went away (killed, out of
    memory), rather than because of its operator or data?"""
    from py4j.protocol import Py4JNetworkError

    from sparkjobs.session import jvm_exit_code

    return isinstance(error, Py4JNetworkError | ConnectionError) or jvm_exit_code() is not None


# How long a JVM whose gateway is gone may take to end, before it is taken to have
# died of something other than its memory.
JVM_EXIT_WAIT_S = 5.0


class JvmOutOfMemoryError(Exception):
    """The worker's Spark JVM ran out of memory, and ended, under a batch."""


def _out_of_memory() -> JvmOutOfMemoryError | None:
    """Why the worker's JVM that just died ended, when it ran out of memory."""
    from sparkjobs.session import OUT_OF_MEMORY_EXIT_CODES, jvm_exit_code

    # The gateway's connection closes as the JVM ends, a moment before its exit code.
    deadline = time.monotonic() + JVM_EXIT_WAIT_S
    code = jvm_exit_code()
    while code is None and time.monotonic() < deadline:
        time.sleep(0.05)
        code = jvm_exit_code()
    if code not in OUT_OF_MEMORY_EXIT_CODES:
        return None
    return JvmOutOfMemoryError(
        f"the Spark JVM ran out of memory under this batch (exit code {code}); "
        "the worker starts a new one for its next batch"
    )


def _failed(run: Run, node: str, owner: str, batch: list[Segment], error: Exception) -> str:
    """Record an operator's failure (retry, or fail the run); a batch of a run that was
    stopped meanwhile was cancelled, not failed, and goes back to its pool."""
    from sparkjobs.expressions import ExpressionRefused

    if not Run.objects.filter(pk=run.pk, status__in=Run.ACTIVE).exists():
        segments.release(owner, batch)
        return f"cancelled: run {run.pk} is no longer active"
    text = failures.describe(error)
    outcome = failures.record_failure(
        run.pk,
        node,
        owner,
        batch,
        text,
        max_attempts=int(run.policy.get("max_batch_attempts", 3)),
        retryable=not isinstance(error, ExpressionRefused),
    )
    log.warning(
        "run %s node %s: batch failed (attempt %s%s): %s",
        run.pk,
        node,
        outcome.attempt,
        ", run failed" if outcome.run_failed else "",
        text,
    )
    return text


def _node_at(run: Run, name: str) -> NodeDocument:
    """The node's document, also for an instance a running adjustment is removing."""
    for doc in _documents(run):
        graph = RunGraph.of(doc)
        if name in graph.nodes:
            return graph.node(name)
    raise ValueError(f"run {run.pk} has no node {name!r}")


def _documents(run: Run) -> Iterator[PipelineDocument]:
    """The run's graph now, then each graph before an adjustment, newest first."""
    yield cast("PipelineDocument", run.topology)
    for adjustment in Adjustment.objects.filter(run=run).order_by("-version"):
        yield cast("PipelineDocument", adjustment.before)


def _operate(
    run: Run,
    *,
    graph: RunGraph,
    node: NodeDocument,
    owner: str,
    batch: list[Segment],
    config: int,
    routes: Mapping[str, Routes],
) -> int:
    """``node``'s operator over ``batch``: its own segments and any its siblings' (each
    routed, named and accounted as its own node's), in one job, completed in one
    transaction."""
    from sparkjobs.session import claim_jvm, operator_session

    name = node["name"]
    stage = graph.stage_of[name]
    # Keyed by file name: a segment broadcast to a keyed stage shares its file with the
    # copies for the other key groups, and operators name their results by file.
    by_file = {Path(s.path).stem: s for s in batch}
    spark = operator_session([s.bytes for s in by_file.values()])
    inputs = {stem: Path(s.path) for stem, s in by_file.items()}
    params = _with_input_schema(
        job_params(node, _joined_copies(run, node, stage, batch)), graph, batch
    )
    slots = KeyGroup(batch[0].slots_from, batch[0].slots_to)
    spec = operator_of(node)
    copies = {
        stem: plan.targets(
            graph.document,
            s.node,
            output_id(s.pk, s.node),
            tag=s.tag,
            routes=routes[s.node],
            slots=slots,
        )
        for stem, s in by_file.items()
    }
    together = _together(copies) if spec.partials and pipeline_windows(run.topology) is None else {}
    outputs = _output_paths(run.pk, by_file, together)
    group = job_group(run.pk)
    spark.sparkContext.setJobGroup(group, f"run {run.pk} node {name}", interruptOnCancel=True)
    claim_jvm(spark)
    max_s = settings.BPCONSOLE_BATCH_MAX_S
    with StopWatch(run.pk, cancel_group(spark, group), max_s=max_s) as watch:
        try:
            produced = _run_operator(
                spark,
                node=node,
                params=params,
                inputs=inputs,
                outputs=outputs,
                slots=slots,
                highs={stem: s.high_before_us for stem, s in by_file.items()},
                together=together,
            )
        except Exception as error:
            if watch.expired:
                raise BatchTimeLimitError(max_s) from error
            raise
        finally:
            # The group may be cancelled with its future jobs: this thread's next jobs
            # (another batch's, a merge's) must not be in it.
            spark.sparkContext._jsc.clearJobGroup()
    _quarantine(run.pk, {by_file[stem].pk: out.quarantined for stem, out in produced.items()})
    _quarantine(
        run.pk,
        {by_file[stem].pk: out.late_lines for stem, out in produced.items()},
        kind="late",
    )
    malformed = {by_file[stem].pk: out.malformed for stem, out in produced.items()}
    late = {by_file[stem].pk: out.late for stem, out in produced.items()}
    records = {by_file[stem].pk: out.records + out.malformed for stem, out in produced.items()}
    fold = None
    if spec.stateful:
        grouping = keystate.state_grouping(params)
        paths = [out.path for out in produced.values()]
        deltas = keystate.group_deltas(combine_groups(grouping, paths))

        def fold() -> None:
            keystate.fold(run.pk, stage, name, grouping, deltas)

    # A deduplicate batch keeps its identities and drops from its outputs those kept
    # first elsewhere in the transaction that completes it: a crash before the commit
    # keeps nothing, and a batch keeping one of them meanwhile is waited for.
    with transaction.atomic():
        if spec.name == "deduplicate":
            _drop_kept(run.pk, stage, produced)
        new = _new_segments(graph, by_file, produced, copies, config)
        segments.complete_batch(
            run.pk, owner, batch, new, malformed, fold=fold, late=late, records=records
        )
    return sum(malformed.values())


def _new_segments(
    graph: RunGraph,
    by_file: Mapping[str, Segment],
    produced: Mapping[str, PartialOutput],
    copies: Mapping[str, Copies],
    config: int,
) -> list[segments.NewSegment]:
    """The segments a batch's outputs make: each input's output, to each place the
    plan sends it."""
    new = []
    for stem, seg in by_file.items():
        out = produced[stem]
        new_id = output_id(seg.pk, seg.node)
        for target, migrated_from, part in copies[stem]:
            new.append(
                segments.NewSegment(
                    id=plan.copy_id(new_id, target, part, len(copies[stem])),
                    chunk=seg.chunk,
                    origin_file=seg.origin_file,
                    origin_offset=seg.origin_offset,
                    origin_length=seg.origin_length,
                    node=target,
                    upstream=seg.node,
                    tag=seg.tag,
                    path=str(out.path),
                    bytes=out.bytes,
                    migrated_from=migrated_from,
                    link_mbps=graph.bandwidth(seg.node, target),
                    config=config,
                    slots_from=part.low,
                    slots_to=part.high,
                    high_before_us=seg.high_before_us,
                    high_us=seg.high_us,
                )
            )
    return new


def _joined_copies(
    run: Run, node: NodeDocument, stage: str, batch: list[Segment]
) -> dict[str, str]:
    """For a join whose table is refreshed: the copy each segment's records join, by
    the segment's file name, as its landing file was bound to it when taken in, or its
    stream chunk emitted after the copy was read (a retry, a migrated batch, the plain
    job over the run: all the same copy)."""
    if "refresh_s" not in (node.get("params") or {}):
        return {}
    if (run.input_spec or {}).get("kind") == "stream":
        chunks = ingested.streamed_copies(run.pk, stage, {s.chunk for s in batch})
        return {Path(s.path).name: chunks[s.chunk] for s in batch if s.chunk in chunks}
    copies = ingested.joined_copies(run.pk, stage, {s.origin_file for s in batch})
    return {Path(s.path).name: copies[s.origin_file] for s in batch if s.origin_file in copies}


def _with_input_schema(
    params: Mapping[str, Any], graph: RunGraph, batch: list[Segment]
) -> Mapping[str, Any]:
    """A batch read straight from the source's chunks reads its records with the
    source's declared schema, if it has one (sparkjobs/records.py, ``read_rows``)."""
    source = graph.node(graph.source).get("params") or {}
    ddl = declared_ddl(source.get("schema")) if "schema" in source else None
    if ddl is None or any(s.upstream != graph.source for s in batch):
        return params
    return {**params, INPUT_SCHEMA: ddl}


def _run_operator(
    spark: SparkSession,
    *,
    node: NodeDocument,
    params: OperatorParams,
    inputs: dict[str, Path],
    outputs: dict[str, Path],
    slots: KeyGroup,
    highs: Mapping[str, int | None],
    together: Mapping[str, str],
) -> Mapping[str, PartialOutput]:
    """The node's operator on this batch: the job the catalog names for it."""
    spec = operator_of(node)
    job = spec.job()
    return job(
        spark,
        spec.name,
        params,
        inputs,
        outputs,
        key_group=None if slots.whole else slots,
        highs=highs,
        together=together,
    )


def _drop_kept(run_id: int, stage: str, produced: Mapping[str, PartialOutput]) -> None:
    """Keep a deduplicate batch's identities, in the caller's transaction, and rewrite
    its outputs without the records whose identity the stage had kept already
    (orchestrator/ledger/seen.py)."""
    identities = [d for out in produced.values() for d in out.identities]
    kept = seen.keep_first(run_id, stage, identities)
    for out in produced.values():
        if not kept.issuperset(out.identities):
            lines = out.path.read_bytes().splitlines(keepends=True)
            left = [ln for ln, d in zip(lines, out.identities, strict=True) if d in kept]
            out.bytes = write_atomic(out.path, b"".join(left))


Copies = list[tuple[str, str, KeyGroup]]


def _together(copies: Mapping[str, Copies]) -> dict[str, str]:
    """Segments (file stems) whose outputs go to the same places, each to the first of
    them, whose output holds all their partials.

    The sink (or a keyed stage) folds partials per key whichever segment's output holds
    them, so a batch sent to one place needs one partial per key, not one per segment
    and key: the job builds a fraction of the groups (a 160 MB batch of 20 segments
    made 20 times its keys' sets), and the sink reads and folds one file instead of
    twenty (docs/benchmarks.md, "one partial per batch"). The others' outputs are empty
    and still go, so every chunk is merged once and the run's coverage stays exact.
    Not for event-time windows: a chunk's output carries its own watermark marks.
    """
    first: dict[tuple[tuple[str, str, int, int], ...], str] = {}
    together = {}
    for stem in sorted(copies):
        places = tuple((node, origin, part.low, part.high) for node, origin, part in copies[stem])
        together[stem] = first.setdefault(places, stem)
    return together


def _output_paths(
    run_id: int, by_file: Mapping[str, Segment], together: Mapping[str, str]
) -> dict[str, Path]:
    """Where each segment's output goes. A segment's own output is a function of its
    input alone, so a batch run again after a crash writes the same bytes. An output
    shared by segments (``_together``) depends on which ones a batch claimed, and a
    later batch may claim them differently (a worker whose lease expired, still running,
    beside the one that took its segments over): such outputs, the holder's and the
    empty ones, are named for the segments they share, so two claims never write one
    file."""
    members: dict[str, list[str]] = {}
    for stem, holder in together.items():
        members.setdefault(holder, []).append(by_file[stem].pk)
    paths = {}
    for stem, seg in by_file.items():
        own = output_id(seg.pk, seg.node)
        shared = sorted(members.get(together.get(stem, stem), []))
        if len(shared) > 1:
            digest = hashlib.blake2b("\n".join(shared).encode(), digest_size=8).hexdigest()
            own = f"{own}.{digest}"
        paths[stem] = segment_path(run_id, own)
    return paths


def _merge(run: Run, sink: str, owner: str, batch: list[Segment]) -> None:
    pending = list(batch)
    windows = pipeline_windows(run.topology)
    grouping = result_grouping(run.topology)
    while pending:
        rows: dict[Path, int] = {}
        paths = [Path(s.path) for s in pending]
        groups = combine_groups(grouping, paths, rows)
        records = {s.pk: rows.get(Path(s.path), 0) for s in pending}
        try:
            segments.complete_sink_batch(
                run.pk,
                sink,
                owner,
                pending,
                groups,
                grouping=grouping,
                windows=windows,
                records=records,
            )
            return
        except segments.AlreadyMergedError as err:
            # Delivered twice: those chunk parts are in the result already. Merge the
            # rest, and mark the duplicates done without touching the result.
            duplicates = [s for s in pending if (s.chunk, s.slots_from) in err.parts]
            segments.complete_batch(run.pk, owner, duplicates, [], {})
            pending = [s for s in pending if (s.chunk, s.slots_from) not in err.parts]


def _quarantine(run_id: int, lines: Mapping[str, list[str]], kind: str = "") -> None:
    """Malformed records' lines (``kind`` "") or late ones' ("late"), per segment."""
    folder = run_dir(run_id) / "quarantine"
    for seg, bad in lines.items():
        if bad:
            body = "".join(line + "\n" for line in bad).encode()
            write_atomic((folder / kind if kind else folder) / f"{seg}.jsonl", body)
