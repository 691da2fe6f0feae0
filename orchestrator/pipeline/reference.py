"""A join's reference table, snapshotted when a run starts.

A ``join`` node names a file below the input folders (``params.reference``). When a run
is created, the file is found there as any input is (``confined_files``: inside a root,
no link out unless links are allowed, not a console folder), opened beneath its root,
and copied into the snapshot store, ``DATA_DIR/reference/<sha256><suffix>``, its bytes
bounded by ``BPCONSOLE_REFERENCE_MAX_MB``. The run's graph names the copy on the node
(``reference_file``), and every batch of the run, every retry and the run's plain job
read that copy: a table changed or removed meanwhile changes nothing the run computes.
The store is content-addressed, so runs over the same table share one copy, and a
snapshot written half-way is never taken for one (written aside, then renamed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from balancer.document import NodeDocument, PipelineDocument
from orchestrator.pipeline.beneath import Roots, WalkError
from orchestrator.pipeline.inputs import InputError, confined_files
from sparkjobs.catalog import operator_name
from sparkjobs.reference import REFERENCE_PATH

CHUNK = 1 << 20


def store() -> Path:
    return Path(settings.DATA_DIR) / "reference"


def snapshot(reference: str) -> str:
    """Copy the table ``reference`` names into the store; the copy's file name. Raises
    :class:`InputError` saying what is wrong with it."""
    limit = int(settings.BPCONSOLE_REFERENCE_MAX_MB * 2**20)
    (path,) = _one_file(reference)
    folder = store()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    digest = hashlib.sha256()
    aside = folder / f".{os.getpid()}-{os.urandom(6).hex()}"
    size = 0
    try:
        with Roots(settings.INPUT_ROOTS) as roots:
            fd = roots.open_file(path)
        made = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "rb") as source, os.fdopen(made, "wb") as copy:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise InputError(
                        f"the reference table {reference!r} is over "
                        f"{settings.BPCONSOLE_REFERENCE_MAX_MB:g} MB "
                        "(BPCONSOLE_REFERENCE_MAX_MB)"
                    )
                digest.update(chunk)
                copy.write(chunk)
            copy.flush()
            os.fsync(copy.fileno())
        name = digest.hexdigest() + Path(path).suffix.lower()
        aside.replace(folder / name)
        return name
    except WalkError as exc:
        raise InputError(f"the reference table {reference!r} cannot be read ({exc})") from None
    finally:
        aside.unlink(missing_ok=True)


def _one_file(reference: str) -> list[str]:
    roots = [Path(r) for r in settings.INPUT_ROOTS]
    try:
        files = confined_files(reference, roots, follow_symlinks=settings.INPUT_FOLLOW_SYMLINKS)
    except InputError as exc:
        raise InputError(f"the reference table {reference!r}: {exc}") from None
    if len(files) != 1:
        raise InputError(f"the reference table {reference!r} names {len(files)} files, not one")
    return files


def snapshot_tables(doc: PipelineDocument) -> PipelineDocument:
    """``doc`` with each join node's table snapshotted (``reference_file``), for a run's
    graph. Raises :class:`InputError` naming the node."""
    nodes: list[NodeDocument] = []
    for node in doc["nodes"]:
        taken = node
        if operator_name(node) == "join" and "reference_file" not in node:
            reference = str((node.get("params") or {}).get("reference", ""))
            try:
                taken = {**node, "reference_file": snapshot(reference)}
            except InputError as exc:
                raise InputError(f"node {node['name']}: {exc}") from None
        nodes.append(taken)
    return {**doc, "nodes": nodes}


def job_params(node: NodeDocument) -> Mapping[str, Any]:
    """The parameters ``node``'s Spark job runs with: its own, and for a join the file
    of its table's snapshot (taken now when the graph has none, as for a plain job
    over a pipeline that never ran)."""
    params: Mapping[str, Any] = node.get("params") or {}
    if operator_name(node) != "join":
        return params
    name = node.get("reference_file") or snapshot(str(params.get("reference", "")))
    return {**params, REFERENCE_PATH: str(store() / Path(str(name)).name)}
