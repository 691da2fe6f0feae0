"""A run's generated input, written by the run's driver on a control worker.

The request that creates a run only checks the generator spec against its bounds
(:meth:`GeneratorSpec.parse`, ``BPCONSOLE_GENERATOR_MAX_MB``) and records it: no web
request does work that grows with the volume (docs/security.md, "Bounded generation").
The run's driver writes the input here, before its source opens, records its progress in
``Run.input_spec["generating"]`` (``{"written", "total"}`` bytes, at most every
:data:`PROGRESS_EVERY_S`) for the run page, then the input's ``paths`` and
``extent_total`` and an ``input_generated`` event.

The file's path is fixed by the run (``runs/<id>/input.jsonl``), so every driver of the
run, after any number of crashes, reads the same bytes (the generator is deterministic):
the source's committed offsets and the sink's exactly-once coverage stay valid. It is
written aside and renamed (:func:`write_input_atomically`): a driver killed half-way
leaves only a partial file that no reader takes for the input, which the next driver
deletes before it writes the input again.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypedDict

from django.utils import timezone

from balancer.units import MB
from orchestrator.ledger.events import record_event
from orchestrator.models import Run
from orchestrator.pipeline.generator import (
    GeneratorError,
    GeneratorSpec,
    partial_paths,
    write_input_atomically,
)
from orchestrator.pipeline.graph import downstreams_of
from orchestrator.pipeline.inputs import input_record, resolve_inputs
from orchestrator.pipeline.layout import run_dir
from orchestrator.run.wakeups import announce

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
INPUT_NAME = "input.jsonl"


class Publish(Protocol):
    def __call__(self, *, final: bool) -> None: ...


class Stopped(Exception):
    """The writing stopped: the run ended (cancelled) or another driver owns it now."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def input_path(run_id: int) -> Path:
    """Where a generated run's input lives: the same for every driver of the run."""
    return run_dir(run_id) / INPUT_NAME


def needs_input(run: Run) -> bool:
    """A generated run whose input is not recorded yet."""
    spec = run.input_spec or {}
    return bool(spec.get("generator")) and not spec.get("paths")


class Preparing(TypedDict):
    """How far the writing of a generated input is."""

    written: int
    total: int
    fraction: float


def preparing(input_spec: Mapping[str, Any]) -> Preparing | None:
    """The progress of an input being generated, for the run page; None once it exists
    (or for an input of files)."""
    state = input_spec.get("generating")
    if not state or input_spec.get("paths"):
        return None
    written, total = int(state.get("written", 0)), int(state.get("total", 0))
    # The planned size is an estimate the written size may pass: never show 100% early.
    fraction = min(written / total, 0.99) if total > 0 else 0.0
    return Preparing(written=written, total=total, fraction=round(fraction, 4))


def prepare_input(
    run: Run,
    epoch: int,
    *,
    alive: Callable[[], bool],
    publish: Publish,
) -> str | None:
    """Write ``run``'s generated input unless a former driver did; record it in the run.

    ``epoch`` is the calling driver's: every write to the run is fenced by it. ``alive``
    says whether the driver still owns the run (its ZooKeeper session); ``publish(final=)``
    sends the run's snapshot to its viewers. Returns None when the input is ready, or
    the driver's outcome when the run cannot go on ("cancelled", "failed", ...).
    """
    try:
        # Checked again here: the limit may have been lowered since the run was created.
        spec = GeneratorSpec.parse(run.input_spec["generator"])
    except GeneratorError as exc:
        return _fail(run, epoch, f"the generator spec is refused: {exc}", publish)
    source = next(n for n in run.topology["nodes"] if n["kind"] == "source")
    segment_mb = float((source.get("params") or {}).get("segment_mb", 1.0))
    branches = downstreams_of(run.topology, source["name"])
    path = input_path(run.pk)
    began = time.monotonic()
    try:
        if not path.exists():
            _write(
                run,
                epoch,
                path,
                spec,
                branches=branches,
                segment_mb=segment_mb,
                alive=alive,
                publish=publish,
            )
        record = input_record(resolve_inputs(str(path), "jsonl"))
        size = record["extent_total"]
        _record(run, epoch, **record, generating={"written": size, "total": size})
    except Stopped as stop:
        if stop.outcome == Run.Status.CANCELLED:
            publish(final=True)
        return stop.outcome
    except OSError as exc:  # the disk filled up, the folder is not writable, ...
        return _fail(run, epoch, f"the generated input could not be written: {exc}", publish)
    seconds = time.monotonic() - began
    record_event(
        run.pk,
        "input_generated",
        f"input generated: {size / MB:.1f} MB in {seconds:.1f} s",
        data={"bytes": size, "seconds": round(seconds, 3), "path": str(path)},
    )
    publish(final=False)
    return None


def _write(
    run: Run,
    epoch: int,
    path: Path,
    spec: GeneratorSpec,
    *,
    branches: list[str],
    segment_mb: float,
    alive: Callable[[], bool],
    publish: Publish,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in partial_paths(path):
        # Left by a driver killed half-way; that driver is fenced out by our epoch.
        stale.unlink(missing_ok=True)
    planned = int(spec.volume_mb * MB)
    free = shutil.disk_usage(path.parent).free
    if free < planned:
        raise OSError(
            f"{spec.volume_mb:g} MB do not fit in the {free / MB:.0f} MB free under {path.parent}"
        )
    _record(run, epoch, generating={"written": 0, "total": planned})
    publish(final=False)
    last = time.monotonic()

    def progress(written: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < PROGRESS_EVERY_S:
            return
        last = now
        if not alive():
            raise Stopped("lost")
        _record(run, epoch, generating={"written": written, "total": total})
        publish(final=False)

    def still_owner() -> None:
        # The last progress report may be up to PROGRESS_EVERY_S old: a stopped,
        # superseded or disconnected driver must not put its input in place.
        if not alive():
            raise Stopped("lost")
        _record(run, epoch)  # a fenced write of nothing: raises Stopped when not owner

    write_input_atomically(path, spec, branches, segment_mb, progress, before_rename=still_owner)


def _record(run: Run, epoch: int, **changes: Any) -> None:
    """Merge ``changes`` into the run's input_spec while this driver owns the active run;
    raise :class:`Stopped` otherwise."""
    spec = {**run.input_spec, **changes}
    updated = Run.objects.filter(pk=run.pk, epoch=epoch, status__in=Run.ACTIVE).update(
        input_spec=spec
    )
    if not updated:
        raise Stopped(_why_not(run, epoch))
    run.input_spec = spec


def _why_not(run: Run, epoch: int) -> str:
    """Why a write fenced by ``epoch`` to the active run changed nothing."""
    status, current = Run.objects.values_list("status", "epoch").get(pk=run.pk)
    return str(status) if current == epoch else "superseded by a newer driver"


def _fail(run: Run, epoch: int, error: str, publish: Publish) -> str:
    log.warning("run %s: %s", run.pk, error)
    failed = Run.objects.filter(pk=run.pk, epoch=epoch, status__in=Run.ACTIVE).update(
        status=Run.Status.FAILED, error=error, finished_at=timezone.now()
    )
    if not failed:  # cancelled meanwhile, or another driver owns the run: not ours to end
        return _why_not(run, epoch)
    announce(run.pk)
    record_event(run.pk, "run_failed", f"run failed: {error}")
    publish(final=True)
    return Run.Status.FAILED
