"""Who owns a sink's table or Parquet folder: the pipeline that first started a run
writing it. Another pipeline naming the same table (in the same database), or a Parquet
folder that is, holds or lies inside one another pipeline owns, is refused when it is
saved and when a run of it is created, saying whose it is. The claim is made in the
transaction that creates the run, under a lock on the owners' table, so two pipelines
starting at once cannot both take one target.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

from orchestrator.models import SinkOwner


@dataclass(frozen=True)
class SinkTarget:
    """A sink's table or folder, as ownership knows it."""

    kind: str  # postgres or parquet
    database: str  # a table's database; "" for a folder
    target: str  # the table, or the folder below the sink root, resolved

    def text(self) -> str:
        if self.kind == "postgres":
            return f"table {self.target!r} in database {self.database!r}"
        return f"Parquet path {self.target!r}"

    def overlaps(self, other: SinkOwner) -> bool:
        if other.kind != self.kind or other.database != self.database:
            return False
        if self.kind == "postgres":
            return other.target == self.target
        mine, theirs = Path(self.target), Path(other.target)
        return mine == theirs or theirs in mine.parents or mine in theirs.parents


def sink_target(params: Mapping[str, object]) -> SinkTarget | None:
    """The table or folder a sink node's parameters write, or None for the run's own
    result table (or a folder that leaves the sink root: its own check refuses it)."""
    kind = params.get("sink", "results")
    if kind == "postgres":
        return SinkTarget("postgres", str(params.get("database", "console")), str(params["table"]))
    if kind == "parquet":
        root = Path(os.path.realpath(settings.BPCONSOLE_SINK_ROOT))
        folder = Path(os.path.realpath(root / str(params["path"])))
        if folder != root and root not in folder.parents:
            return None
        return SinkTarget("parquet", "", str(folder.relative_to(root)))
    return None


def owner_problem(pipeline: str, params: Mapping[str, object]) -> str:
    """Why pipeline ``pipeline`` may not write the sink ``params`` names, or ""."""
    target = sink_target(params)
    if target is None:
        return ""
    return _problem(pipeline, target)


def reader_problem(pipeline: str, params: Mapping[str, object]) -> str:
    """Why pipeline ``pipeline``'s join may not read the reference table its ``params``
    name (a table another pipeline's sink writes, or its commit log), or ""."""
    if "table" not in params:
        return ""
    table, database = str(params["table"]), str(params.get("database", ""))
    for written in sorted({table, table.removesuffix("_commits")}):
        sink = {"sink": "postgres", "table": written, "database": database}
        owned = owner_problem(pipeline, sink)
        if owned:
            return f"a join may not read another pipeline's sink: {owned}"
    return ""


def claim(pipeline: str, params: Mapping[str, object]) -> str:
    """Make ``pipeline`` the owner of its sink's target unless it or one overlapping it
    is another pipeline's; returns why not, or "" (owned by ``pipeline`` now)."""
    target = sink_target(params)
    if target is None:
        return ""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {SinkOwner._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        problem = _problem(pipeline, target)
        if problem:
            return problem
        SinkOwner.objects.get_or_create(
            kind=target.kind,
            database=target.database,
            target=target.target,
            defaults={"pipeline_name": pipeline},
        )
    return ""


def _problem(pipeline: str, target: SinkTarget) -> str:
    rows = SinkOwner.objects.filter(kind=target.kind, database=target.database).exclude(
        pipeline_name=pipeline
    )
    if target.kind == "postgres":
        rows = rows.filter(target=target.target)
    owner = next((row for row in rows.order_by("pk") if target.overlaps(row)), None)
    if owner is None:
        return ""
    same = owner.target == target.target
    where = target.text() if same else f"{target.text()} (overlapping {owner.target!r})"
    return (
        f"the sink's {where} belongs to pipeline {owner.pipeline_name!r}, which first wrote "
        "it; name another"
    )
