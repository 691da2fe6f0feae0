"""Starting and steering runs: what the console and the command line call."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from balancer.document import PipelineDocument
from balancer.policy import Policy
from orchestrator.ledger.events import record_event
from orchestrator.ledger.sink_owners import claim, owner_problem, reader_problem
from orchestrator.models import PolicyLab, Run
from orchestrator.pipeline.generator import GeneratorFields, GeneratorSpec
from orchestrator.pipeline.graph import operator_problems, pipeline_sink
from orchestrator.pipeline.inputs import InputError, input_record, resolve_inputs
from orchestrator.pipeline.layout import run_dir
from orchestrator.pipeline.reference import columns_of, snapshot_columns, snapshot_tables
from orchestrator.pipeline.sample import read_sample, unread_fields
from orchestrator.pipeline.schemas import TableColumns
from orchestrator.run.publisher import forget_snapshot, last_snapshot
from orchestrator.run.snapshot import Snapshot, build_snapshot
from orchestrator.run.wakeups import announce
from orchestrator.sink.layout import layout_of
from orchestrator.sink.targets import SinkError, sink_of
from orchestrator.source.spec import LandingSpec, StreamSpec, UnboundedSpec, is_unbounded
from orchestrator.source.stream import answers, group_name
from orchestrator.zk.control_plane import ControlPlane
from sparkjobs.catalog import operator_name
from sparkjobs.schemas import Schema, table_problems

READERS_LOCK = 0x62_70_72_64  # "bprd": the advisory lock of run creation's checks


class RunError(ValueError):
    """A run cannot start or change as asked; nothing was changed."""


class RunQuotaExceeded(RunError):
    """The user has as many runs not over yet as their quota allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"you have {limit} runs not over yet, the most an operator may have at once "
            "(the operator quota an admin sets); stop or cancel one first"
        )
        self.limit = limit


def create_run(
    *,
    topology: PipelineDocument,
    policy: Mapping[str, object],
    pipeline_id: int | None = None,
    input_path: str | list[str] | None = None,
    generator: str | GeneratorFields | None = None,
    source: UnboundedSpec | None = None,
    user: Any = None,
    lab: PolicyLab | None = None,
    lab_arm: str = "",
    max_active: int | None = None,
) -> Run:
    """Validate the input and create the run (pending). Raises :class:`RunError`
    (:class:`RunQuotaExceeded` when ``user`` already has ``max_active`` runs not over;
    None: no quota, as for the command line or an exempt admin).

    The input is one of: files (a path or glob), the generator, or an unbounded
    ``source`` (a landing folder or a Redis stream, checked by orchestrator.source.spec),
    which the run reads until an operator stops it. A run started from a policy lab
    names it and the lab's policy it runs (``lab_arm``).

    Nothing here grows with the input: files are only checked and measured, and a
    generator spec is only checked against its bounds (``BPCONSOLE_GENERATOR_MAX_MB``);
    the run's driver writes a generated input (orchestrator/run/generation.py).
    """
    Policy.from_mapping(policy)  # a snapshot that no longer validates must not run
    refused = operator_problems(topology)
    if refused:
        raise RunError("the pipeline cannot run as stored: " + "; ".join(refused))
    sink = _checked_sink(topology)
    source_node = next(n for n in topology["nodes"] if n["kind"] == "source")
    params = source_node.get("params") or {}
    fmt = params.get("format", "jsonl")
    if [input_path, generator, source].count(None) != 2:
        raise RunError(
            "give exactly one of an input path (or glob), a generator spec and an unbounded "
            "source (a landing folder or a stream)"
        )
    spec = GeneratorSpec.parse(generator) if generator is not None else None
    if source is not None:
        if source.format != fmt:
            raise RunError(
                f"the source node reads {fmt}; the {source.to_json()['kind']} was given as "
                f"{source.format}"
            )
        if isinstance(source, StreamSpec) and fmt != "jsonl":
            raise RunError("a stream's entries are JSON records: the source must read jsonl")
        input_spec: dict[str, Any] = source.to_json()
        if isinstance(source, StreamSpec):
            url = source.url or settings.REDIS_URL
            why = answers(url)
            if why:
                raise RunError(f"the stream's Redis does not answer ({why}); nothing was created")
        what = (
            f"run created over the landing folder {source.folder} ({source.pattern})"
            if not isinstance(source, StreamSpec)
            else f"run created over the Redis stream {source.stream}"
            + (
                f" in {source.partitions} partitions ({source.stream}:0 to "
                f"{source.stream}:{source.partitions - 1})"
                if source.partitions > 1
                else ""
            )
        )
    elif spec is not None:
        if fmt != "jsonl":
            raise RunError("the generator writes JSON lines; the source must read jsonl")
        input_spec = {"format": fmt, "generator": spec.to_json()}
        what = (
            f"run created; its generated input ({spec.volume_mb:g} MB, seed {spec.seed}) "
            "is written by the run's driver"
        )
    else:
        files = resolve_inputs(input_path, fmt)  # type: ignore[arg-type]
        _check_fields_read(topology, files[0].path, fmt)
        input_spec = {**input_record(files), "format": fmt, "generator": None}
        what = f"run created over {len(files)} input file(s)"
    topology = _with_tables(topology)
    with transaction.atomic():
        # The sink's table or folder becomes this pipeline's with its first run, in the
        # run's transaction: refused, nothing of the run exists.
        owned = claim(topology["name"], sink)
        if owned:
            raise RunError(owned)
        _others_allow(source, user, max_active)
        run = Run.objects.create(
            pipeline_id=pipeline_id,
            pipeline_name=topology["name"],
            topology=dict(topology),
            policy=dict(policy),
            input_spec=input_spec,
            created_by=user if getattr(user, "is_authenticated", False) else None,
            lab=lab,
            lab_arm=lab_arm,
        )
        # The id is new, so anything in its folder or under its znode is left from a
        # database that was reset: an old run's flags, routes or epoch must not leak in,
        # nor its ask for elastic Spark workers (the new run would start holding them).
        shutil.rmtree(run_dir(run.pk), ignore_errors=True)
        with ControlPlane.connect(settings.ZK_HOSTS) as control:
            control.delete_run(str(run.pk))
            control.ask_spark_workers(str(run.pk), 0, "a new run with this id")
        forget_snapshot(run.pk)
        if isinstance(source, StreamSpec):
            what += f" (consumer group {group_name(run.pk, source)})"
        record_event(
            run.pk,
            "run_created",
            what,
            user=user if getattr(user, "is_authenticated", False) else None,
        )
    return run


def _checked_sink(topology: PipelineDocument) -> Mapping[str, object]:
    """The pipeline's sink parameters, once its target is checked: another pipeline's
    table or folder, a table whose columns do not fit, a folder that cannot be written
    are refused before anything exists, rather than failing at the first closed window."""
    sink = pipeline_sink(topology)
    owned = owner_problem(topology["name"], sink)
    if owned:
        raise RunError(owned)
    try:
        sink_of(sink, layout_of(topology)).check()
    except SinkError as exc:
        raise RunError(f"the sink cannot be written: {exc}") from exc
    return sink


def _one_reader_at_a_time(source: UnboundedSpec) -> None:
    """A consumer group or a landing folder read without a checkpoint is one position in
    the source: one run at a time may move it, or two runs would split (or repeat) its
    data between them, and one could delete or archive the files the other reads. Two
    runs may read one folder only if each keeps its files and has a checkpoint of its
    own. Called under the lock of ``_others_allow``, so two runs created at once cannot
    both pass. The refusal names the run holding it and its pipeline, nothing
    more of another operator's run."""
    busy: Run | None
    if isinstance(source, StreamSpec):
        if not source.group:
            return  # the run's own group, which no other run may name
        busy = Run.objects.filter(
            status__in=Run.ACTIVE,
            input_spec__kind="stream",
            input_spec__stream=source.stream,
            input_spec__group=source.group,
        ).first()
        what = f"stream {source.stream!r} as consumer group {source.group!r}; one run per group"
    else:
        busy = next(
            (
                run
                for run in Run.objects.filter(status__in=Run.ACTIVE, input_spec__kind="folder")
                if _shares_folder(source, run.input_spec)
            ),
            None,
        )
        what = (
            f"the landing folder {source.folder} (or archives into it); one run per "
            "folder, unless each keeps its files (clean: keep) with a checkpoint of its own"
        )
    if busy is not None:
        raise RunError(
            f"run {busy.pk} of pipeline {busy.pipeline_name!r} is reading {what} (stop it first)"
        )


def _shares_folder(source: LandingSpec, other: Mapping[str, Any]) -> bool:
    """Would ``source`` and the active landing run ``other`` read or clean one folder?"""
    mine = {source.folder, source.archive} - {""}
    theirs = {str(other.get("folder") or ""), str(other.get("archive") or "")} - {""}
    if not mine & theirs:
        return False
    if str(other.get("folder")) != source.folder:
        return True  # one's landing folder is the other's archive
    return not (
        source.clean == "keep"
        and other.get("clean", "keep") == "keep"
        and source.checkpoint
        and other.get("checkpoint")
        and other.get("checkpoint") != source.checkpoint
    )


def _others_allow(source: UnboundedSpec | None, user: Any, max_active: int | None) -> None:
    """The checks of run creation that count other runs: readers of the source and the
    user's quota, under a lock held until the caller's transaction ends, so two runs
    created at once cannot both pass."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [READERS_LOCK])
    if source is not None:
        _one_reader_at_a_time(source)
    if max_active is not None and getattr(user, "is_authenticated", False):
        mine = Run.objects.filter(created_by=user, status__in=Run.ACTIVE)
        if mine.count() >= max_active:
            raise RunQuotaExceeded(max_active)


def reference_columns(pipeline: str) -> TableColumns:
    """Reads the columns of a join's reference table, as pipeline ``pipeline`` may read
    it (orchestrator/pipeline/reference.py, ``columns_of``): never a table another
    pipeline's sink writes."""

    def columns(params: Mapping[str, Any]) -> Schema | None:
        owned = reader_problem(pipeline, params)
        if owned:
            raise InputError(owned)
        return columns_of(params)

    return columns


def _with_tables(topology: PipelineDocument) -> PipelineDocument:
    """The run's graph: ``topology`` with its joins' reference tables snapshotted
    (orchestrator/pipeline/reference.py), each copy having the columns its join names.
    A join may not read a table another pipeline's sink writes (nor its commit log):
    that is the other pipeline's data."""
    joins = [n for n in topology["nodes"] if operator_name(n) == "join"]
    for node in joins:
        owned = reader_problem(topology["name"], node.get("params") or {})
        if owned:
            raise RunError(f"node {node['name']}: {owned}; nothing was created")
    try:
        graph = snapshot_tables(topology)
    except InputError as exc:
        raise RunError(f"{exc}; nothing was created") from None
    for node in graph["nodes"]:
        if operator_name(node) != "join":
            continue
        table = snapshot_columns(str(node.get("reference_file")))
        said = [] if table is None else table_problems(node.get("params") or {}, table)
        if said:
            raise RunError(
                f"node {node['name']}: "
                + "; ".join(p.message for p in said)
                + "; nothing was created"
            )
    return graph


def _check_fields_read(topology: PipelineDocument, path: str, fmt: str) -> None:
    """Refuse a run whose every record would be quarantined: the first input file's
    first records lack a field an aggregating node reads (orchestrator/pipeline/sample.py,
    ``unread_fields``)."""
    try:
        missing = unread_fields(topology, read_sample(path, fmt))
    except InputError as exc:
        raise RunError(f"the input could not be read: {exc}") from None
    if missing:
        raise RunError(
            "every record would be quarantined: "
            + "; ".join(missing)
            + " (a field named otherwise in the data, or a misspelt parameter); nothing "
            "was created"
        )


def set_status(run_id: int, status: str, *, user: Any = None, reason: str = "") -> Run:
    """Pause, resume, stop or cancel a run; raises :class:`RunError` changing nothing.

    ``stopping`` is how an unbounded run ends: its source reads nothing new, and the
    run completes once what it took in is merged (exactly once, as any run). A bounded
    run asked to stop is cancelled, and so is one still pending: it took nothing in.
    Both are decided under the run's lock, so a driver starting the run meanwhile
    cannot turn a stop into a cancel of what it took in.
    """
    allowed: dict[str, set[str]] = {
        Run.Status.PAUSED: {Run.Status.RUNNING, Run.Status.PENDING},
        Run.Status.RUNNING: {Run.Status.PAUSED},
        Run.Status.STOPPING: {Run.Status.RUNNING, Run.Status.PAUSED},
        Run.Status.CANCELLED: {
            Run.Status.RUNNING,
            Run.Status.PAUSED,
            Run.Status.PENDING,
            Run.Status.STOPPING,
        },
    }
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if status == Run.Status.STOPPING and (
            run.status == Run.Status.PENDING or not is_unbounded(run.input_spec or {})
        ):
            status = Run.Status.CANCELLED  # nothing taken in, or nothing to drain
        if status not in allowed or run.status not in allowed[status]:
            raise RunError(f"run {run_id} is {run.status}; it cannot become {status}")
        run.status = status
        if status == Run.Status.CANCELLED:
            run.finished_at = timezone.now()
        run.save(update_fields=["status", "finished_at"])
        announce(run_id)  # its driver acts now, not at its next tick
        verb = {
            "paused": "paused",
            "running": "resumed",
            "stopping": "stopping",
            "cancelled": "stopped",
        }[status]
        record_event(
            run_id,
            f"run_{verb}",
            reason or f"run {verb}",
            user=user if getattr(user, "is_authenticated", False) else None,
        )
    return run


def snapshot(run_id: int) -> Snapshot:
    """The run's current state for a viewer that just connected.

    While the run has a driver, the snapshot its reporter published last (kept in
    Redis, orchestrator/run/publisher.py); otherwise (pending, finished, or its driver
    not there yet) one built from PostgreSQL alone, without node levels or routes. No
    ZooKeeper session: the web process never assembles the live view itself.
    """
    run = Run.objects.get(pk=run_id)
    kept = last_snapshot(run_id)
    if kept is not None and _still_current(kept, run):
        return kept
    return build_snapshot(run, node_states={}, routes={}, final=not run.is_active)


def _still_current(kept: Snapshot, run: Run) -> bool:
    """A kept snapshot shows the run as it is: the same status, and final once the run
    has ended (a driver that died between ticks leaves its last tick, not the end)."""
    shown = kept.get("run") or {}
    return shown.get("status") == run.status and (run.is_active or bool(kept.get("final")))


def request_migration(run_id: int, node: str, *, stop: bool = False, user: Any = None) -> None:
    """An operator's "migrate this branch's data now" (or "stop migrating") for ``node``.

    Checked here (the run is active, the node exists) and recorded with the user's
    name; the run's driver carries it out on its next tick.
    """
    run = Run.objects.get(pk=run_id)
    names = [n["name"] for n in run.topology["nodes"]]
    if node not in names:
        raise RunError(f"run {run_id} has no node {node!r} (nodes: {', '.join(names)})")
    if not run.is_active:
        raise RunError(f"run {run_id} is {run.status}; nothing to migrate")
    command = "stop_migrating" if stop else "migrate"
    who = user.get_username() if getattr(user, "is_authenticated", False) else "an operator"
    record_event(
        run_id,
        f"operator_{command}",
        f"{who} asked to {'stop migrating from' if stop else 'migrate the data of'} {node}",
        node=node,
        user=user if getattr(user, "is_authenticated", False) else None,
    )
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        control.put_command(str(run_id), {"command": command, "node": node, "user": who})


ADJUSTMENTS = {
    "hot_migrate": "hot-migrate {node} to {where}",
    "add_instance": "add an instance to stage {stage} on {where}",
    "remove_instance": "remove instance {node}",
}


def live_workers() -> dict[str, dict[str, Any]]:
    """Spark workers alive in ZooKeeper (liveness znodes), by name."""
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        workers = control.live_workers()
    return {k: v for k, v in sorted(workers.items()) if "spark" in v.get("queues", [])}


def request_adjustment(
    run_id: int,
    command: str,
    *,
    node: str = "",
    stage: str = "",
    worker: str = "",
    user: Any = None,
) -> str:
    """An operator's hot migration or rescale (docs/spec/hot-rescale.md).

    Checked here (the run is active, the instance, stage and worker exist) and recorded
    with the user's name; the run's driver plans and carries it out on its next tick.
    Raises :class:`RunError` changing nothing.
    """
    if command not in ADJUSTMENTS:
        raise RunError(f"unknown adjustment {command!r}; use {', '.join(ADJUSTMENTS)}")
    run = Run.objects.get(pk=run_id)
    if not run.is_active:
        raise RunError(f"run {run_id} is {run.status}; nothing to adjust")
    nodes = {n["name"]: n for n in run.topology["nodes"]}
    operators = sorted(name for name, n in nodes.items() if n["kind"] == "operator")
    if command in ("hot_migrate", "remove_instance") and node not in operators:
        raise RunError(
            f"run {run_id} has no operator instance {node!r} (instances: {', '.join(operators)})"
        )
    stages = sorted({nodes[name].get("stage") or name for name in operators})
    if command == "add_instance" and stage not in stages:
        raise RunError(
            f"run {run_id} has no operator stage {stage!r} (stages: {', '.join(stages)})"
        )
    if worker:
        live = live_workers()
        if worker not in live:
            raise RunError(
                f"worker {worker!r} is not a live Spark worker (live: {', '.join(live) or 'none'})"
            )
    who = user.get_username() if getattr(user, "is_authenticated", False) else "an operator"
    what = ADJUSTMENTS[command].format(node=node, stage=stage, where=worker or "any worker")
    record_event(
        run_id,
        f"operator_{command}",
        f"{who} asked to {what}",
        node=node or stage,
        user=user if getattr(user, "is_authenticated", False) else None,
        data={"command": command, "node": node, "stage": stage, "worker": worker},
    )
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        control.put_command(
            str(run_id),
            {"command": command, "node": node, "stage": stage, "worker": worker, "user": who},
        )
    return f"asked to {what}; the run's driver starts it on its next tick"
