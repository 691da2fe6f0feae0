"""A finished run, read back from the ledger as a replay for the simulator: its batches'
cost, its operators' reductions, and its input's chunks in order."""

from __future__ import annotations

import datetime as dt
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from balancer.sim.cli import main as simulate
from balancer.units import MB
from orchestrator.ledger.calibration import replay_of
from orchestrator.models import Run, Segment
from orchestrator.pipeline.routes import tagged_target
from tests.orchestrator.runs import pending_run, segment_row

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

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
            seg_id,
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


def finished_run() -> Run:
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
        status=Run.Status.COMPLETED, started_at=ledger.start, finished_at=ledger.at(3.5)
    )
    run.refresh_from_db()
    return run


def test_the_batches_cost_is_fitted_with_the_gap_between_them() -> None:
    runtime = replay_of(finished_run()).runtime

    assert runtime.batch_fixed_s == pytest.approx(0.5 + 0.1)
    assert runtime.batch_bytes_per_s == pytest.approx(10 * MB)
    assert runtime.sink_batch_fixed_s == pytest.approx(0.05)


def test_each_operator_s_reduction_is_its_bytes_out_per_byte_in() -> None:
    reductions = replay_of(finished_run()).runtime.reductions

    assert reductions == pytest.approx({b: (MB // 20) / MB for b in BRANCHES})


def test_the_input_is_every_chunk_once_tagged_with_the_branch_it_was_meant_for() -> None:
    workload = replay_of(finished_run()).workload

    meant = [workload.tags[i] for i in workload.tag_index]
    assert meant == ["task1", "task1", "task2", "task3", "task3", "task2"]
    assert workload.packet_bytes == MB
    assert workload.volume_bytes == 6 * MB


def test_the_command_writes_a_replay_every_policy_then_runs_on(tmp_path: Path) -> None:
    run = finished_run()
    path = tmp_path / "replay.json"
    call_command("calibrate_sim", str(run.pk), "--out", str(path), stdout=io.StringIO())

    out = io.StringIO()
    with redirect_stdout(out):
        code = simulate(["--replay", str(path), "--json"])

    assert code == 0
    report = json.loads(out.getvalue())
    # 6 MB through the branches' 200 Mb/s of input links (their outputs, shrunk to a
    # twentieth, never bind).
    assert report["live_bound_s"] == pytest.approx(6 * MB / (200 * 125_000), abs=1e-3)
    assert len(report["policies"]) == 7
    for name, outcome in report["policies"].items():
        assert outcome["completion_s"] >= report["live_bound_s"], name


def test_a_run_that_has_not_completed_is_not_calibrated() -> None:
    run = pending_run("reference")

    with pytest.raises(CommandError, match="only a completed run"):
        call_command("calibrate_sim", str(run.pk), stdout=io.StringIO())


def test_an_unknown_run_is_named() -> None:
    with pytest.raises(CommandError, match="no run 987654"):
        call_command("calibrate_sim", "987654", stdout=io.StringIO())
