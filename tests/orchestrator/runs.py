"""A run of a shipped topology that no driver takes, for tests that move its data by hand,
and segment rows written as the runtime would have left them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from django.utils import timezone

from balancer.units import MB
from orchestrator.ledger import segments
from orchestrator.models import Instance, Run, Segment
from orchestrator.pipeline.routes import tagged_target
from orchestrator.rescale.start import ensure_instances
from sparkjobs.measures import Grouping
from sparkjobs.merge import combine_groups

TOPOLOGIES = Path(__file__).resolve().parents[2] / "webapp/console/topologies"


def pending_run(name: str) -> Run:
    doc = yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text())
    # Pending: the watchdog of a test session's workers gives a run no driver has taken
    # one only after an hour (tests/conftest.py), so it stays a bare row.
    run = Run.objects.create(
        pipeline_name=doc["name"],
        topology=doc,
        policy={},
        input_spec={},
        status="pending",
        epoch=1,
    )
    ensure_instances(run)
    return run


def segment_row(
    run: Run, seg_id: str, *, node: str, upstream: str, size: int, chunk: int = 0, **fields: Any
) -> Segment:
    """A segment of ``size`` bytes at ``node`` from ``upstream`` (its file is nowhere:
    for tests of the ledger's rows only); ``fields`` set any other column."""
    values: dict[str, Any] = {
        "origin_file": 0,
        "origin_offset": 0,
        "origin_length": size,
        "path": f"/nowhere/{seg_id}",
        "available_at": timezone.now(),
        **fields,
    }
    return Segment.objects.create(
        id=seg_id, run=run, chunk=chunk, node=node, upstream=upstream, bytes=size, **values
    )


BRANCHES = ("task1", "task2", "task3")


def key_for(branch: str) -> str:
    """A key the source routes to ``branch``."""
    return next(k for k in (f"k{i}" for i in range(100)) if tagged_target(k, BRANCHES) == branch)


class Ledger:
    """Writes a run's segments as its source, operators and sink would have left them."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.start = timezone.now() - dt.timedelta(minutes=5)

    def at(self, seconds: float) -> dt.datetime:
        return self.start + dt.timedelta(seconds=seconds)

    def segment(
        self, seg_id: str, chunk: int, node: str, upstream: str, size: int, **fields: Any
    ) -> None:
        segment_row(
            self.run,
            f"{self.run.pk}.{seg_id}",  # ids are unique across runs
            node=node,
            upstream=upstream,
            size=size,
            chunk=chunk,
            origin_offset=chunk * MB,
            origin_length=MB,
            available_at=self.start,
            state=Segment.State.DONE,
            **fields,
        )

    def batch(self, node: str, chunks: list[int], began: float, done: float) -> None:
        """An operator batch over ``chunks`` (already emitted to ``node``), and its outputs:
        a twentieth of the bytes, sent to the sink."""
        Segment.objects.filter(run=self.run, node=node, chunk__in=chunks).update(
            lease_owner=f"w:{node}:{began}", claimed_at=self.at(began), done_at=self.at(done)
        )
        for chunk in chunks:
            self.segment(f"c{chunk}.{node}", chunk, "output", node, MB // 20)


def finished_run(**fields: Any) -> Run:
    """A completed run of the reference topology as its ledger would hold it: six chunks
    of 1 MB, three operator batches, a sink batch; ``fields`` set any other column."""
    run = pending_run("reference")
    ledger = Ledger(run)
    # Six chunks of 1 MB: two for each branch by key; chunk 5 was meant for task2 and
    # migrated to task3.
    meant = ["task1", "task1", "task2", "task3", "task3", "task2"]
    for chunk, branch in enumerate(meant):
        at = "task3" if chunk == 5 else branch
        moved = {"migrated_from": branch} if chunk == 5 else {}
        ledger.segment(f"c{chunk}", chunk, at, "source", MB, tag=key_for(branch), **moved)
    # Batches cost 0.5 s plus 0.1 s per MB, and start 0.1 s after the one before.
    ledger.batch("task1", [0, 1], 1.0, 1.7)
    ledger.batch("task2", [2], 1.8, 2.4)
    ledger.batch("task3", [3, 4, 5], 2.5, 3.3)
    Segment.objects.filter(run=run, node="output").update(
        lease_owner="sink", claimed_at=ledger.at(3.4), done_at=ledger.at(3.45)
    )
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.COMPLETED,
        started_at=ledger.start,
        finished_at=ledger.at(3.5),
        **fields,
    )
    run.refresh_from_db()
    return run


# Placed: each branch's batches on a worker of its own, each worker at its own speed
# (0.2 s a batch plus 4, 1 and 2 MB/s), a batch starting 0.1 s after its node's last.
PLACED_BATCHES: dict[str, tuple[str, list[tuple[list[int], float, float]]]] = {
    "task1": ("spark@h", [([0], 1.0, 1.45), ([1, 2], 1.55, 2.25), ([3, 4, 5], 2.35, 3.3)]),
    "task2": ("spark-2@h", [([6], 1.0, 2.2), ([7, 8], 2.3, 4.5)]),
    "task3": ("spark-3@h", [([9], 1.0, 1.7), ([10, 11], 1.8, 3.0)]),
}


def placed_run(
    batches_of: dict[str, tuple[str, list[tuple[list[int], float, float]]]] = PLACED_BATCHES,
    **fields: Any,
) -> Run:
    """A completed run in ``placement = placed`` with these operators' workers and
    batches (chunks, claimed, done), each chunk 1 MB for the branch it ran at, and a sink
    batch after them; ``fields`` set any other column."""
    run = pending_run("reference")
    ledger = Ledger(run)
    for node, (worker, own) in batches_of.items():
        Instance.objects.filter(run=run, name=node).update(worker=worker)
        for chunks, began, done in own:
            for chunk in chunks:
                ledger.segment(f"c{chunk}", chunk, node, "source", MB, tag=key_for(node))
            ledger.batch(node, chunks, began, done)
    Segment.objects.filter(run=run, node="output").update(
        lease_owner="sink", claimed_at=ledger.at(4.6), done_at=ledger.at(4.7)
    )
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.COMPLETED,
        policy={"placement": "placed"},
        started_at=ledger.start,
        finished_at=ledger.at(4.8),
        **fields,
    )
    run.refresh_from_db()
    return run


def queue_segments(
    run: Run, paths: Sequence[Path | str], node: str = "task1", *, first: int = 0
) -> list[str]:
    """Segments of these files queued at ``node`` as the source would have sent them,
    one chunk each from chunk ``first`` on; their ids."""
    items = [
        segments.NewSegment(
            id=f"s{n}",
            chunk=n,
            origin_file=0,
            origin_offset=n,
            origin_length=1,
            node=node,
            upstream="source",
            tag="",
            path=str(path),
            bytes=Path(path).stat().st_size if Path(path).is_file() else 1,
        )
        for n, path in enumerate(paths, start=first)
    ]
    segments.complete_batch(run.pk, "nobody", [], items, {})
    return [item.id for item in items]


def records_file(path: Path, keys: range) -> Path:
    """A segment file of one record per key (value the key's number, user one of three)
    and a malformed line."""
    lines = [json.dumps({"key": f"k{k}", "value": k, "user": f"u{k % 3}"}) for k in keys]
    path.write_text("\n".join([*lines, "not json"]) + "\n")
    return path


def merged_partials(outputs: Sequence[Segment]) -> dict[str, tuple[int, int, tuple[str, ...]]]:
    """Per key, the (count, sum, distinct values) the sink would merge from ``outputs``:
    partials of the key form's measures (sparkjobs/key_form.py)."""
    grouping = Grouping.of({}) or pytest.fail("the key form names no grouping")
    return {
        str(p.group[0]): (
            int(str(p.states["count"])),
            int(Decimal(str(p.states["sum"]))),
            tuple(cast("list[str]", p.states["distinct_users"])),
        )
        for p in combine_groups(grouping, [Path(s.path) for s in outputs])
    }
