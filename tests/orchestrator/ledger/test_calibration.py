"""A finished run, read back from the ledger as a replay for the simulator: its batches'
cost (a placed run's per operator), its operators' reductions, and its input's chunks in
order."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from balancer.sim.cli import main as simulate
from balancer.units import MB
from orchestrator.ledger.calibration import CalibrationError, batches, replay_of
from orchestrator.models import Segment
from tests.orchestrator.runs import (
    BRANCHES,
    PLACED_BATCHES,
    finished_run,
    pending_run,
    placed_run,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_the_batches_cost_is_fitted_with_the_gap_between_them() -> None:
    runtime = replay_of(finished_run()).runtime

    assert runtime.batch_fixed_s == pytest.approx(0.5 + 0.1)
    assert runtime.batch_bytes_per_s == pytest.approx(10 * MB)
    assert runtime.sink_batch_fixed_s == pytest.approx(0.05)


def test_a_batch_that_took_its_siblings_data_is_one_batch() -> None:
    # task2's batch took task3's three chunks with its own (one owner, one job).
    run = finished_run()
    Segment.objects.filter(run=run, node__in=["task2", "task3"], upstream="source").update(
        lease_owner="w:fused", claimed_at=run.started_at, done_at=run.finished_at
    )

    assert sorted(sample.bytes for sample in batches(run)) == [2 * MB, 4 * MB]


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


def test_a_placed_run_s_operators_each_cost_what_their_own_batches_took_on_their_worker() -> None:
    placed = replay_of(placed_run()).runtime.placed

    assert {n: c.worker for n, c in placed.items()} == {
        "task1": "spark@h",
        "task2": "spark-2@h",
        "task3": "spark-3@h",
    }
    assert {n: c.fixed_s for n, c in placed.items()} == pytest.approx(
        dict.fromkeys(BRANCHES, 0.2 + 0.1)
    )
    assert {n: c.bytes_per_s for n, c in placed.items()} == pytest.approx(
        {"task1": 4 * MB, "task2": MB, "task3": 2 * MB}
    )


def test_a_pooled_run_places_no_operator() -> None:
    assert replay_of(finished_run()).runtime.placed == {}


def test_a_placed_operator_whose_batches_show_no_fixed_cost_runs_at_its_throughput() -> None:
    one_batch = PLACED_BATCHES | {"task3": ("spark-3@h", [([9, 10, 11], 1.0, 2.5)])}

    cost = replay_of(placed_run(one_batch)).runtime.placed["task3"]

    assert (cost.fixed_s, cost.bytes_per_s, cost.worker) == (
        0.0,
        pytest.approx(2 * MB),
        "spark-3@h",
    )


def test_a_placed_operator_that_ran_no_batch_is_named() -> None:
    idle = PLACED_BATCHES | {"task3": ("spark-3@h", [])}

    with pytest.raises(CalibrationError, match="task3's own cost cannot be fitted: 0 batches"):
        replay_of(placed_run(idle))


def test_the_command_says_what_it_fitted_per_placed_operator_and_the_replay_runs_so(
    tmp_path: Path,
) -> None:
    run = placed_run()
    path = tmp_path / "replay.json"
    said = io.StringIO()
    call_command("calibrate_sim", str(run.pk), "--out", str(path), stdout=said)

    out = io.StringIO()
    with redirect_stdout(out):
        code = simulate(["--replay", str(path), "--json"])

    assert "placed task2 on spark-2@h: its batches cost 0.3 s + their MB at 1.0 MB/s" in (
        said.getvalue()
    )
    assert code == 0
    report = json.loads(out.getvalue())
    assert report["runtime"]["placed"]["task1"]["batch_mb_per_s"] == pytest.approx(4.0)
    # The twelve chunks are in the pools at once and each worker's first batch takes
    # all of its branch's: task2's three on its 1 MB/s worker (0.3 + 3 s) end the run
    # whatever the policy, since no rate is measured before a batch ends and nothing
    # is left waiting for a move by then.
    completion = {name: p["completion_s"] for name, p in report["policies"].items()}
    assert completion["credit"] >= 0.3 + 3.0
    assert completion["ours"] == pytest.approx(completion["credit"], rel=0.01)
