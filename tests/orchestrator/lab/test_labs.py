"""The policy lab on real PostgreSQL: what a lab may simulate, the runtime it is fitted
to, and its simulation in a process of its own (every policy, its curve, the bound)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from balancer.sim.control import BENCHMARK_POLICIES
from balancer.units import MB
from orchestrator.lab import labs
from orchestrator.lab.labs import ACTIVE_PER_PIPELINE, LabRefused, create_lab, lab_json
from orchestrator.lab.simulation import PIPELINE_ARM, arm_policy, simulate
from orchestrator.models import PolicyLab, Run
from orchestrator.tasks import watchdog
from tests.orchestrator.runs import finished_run, placed_run
from tests.webapp.console.factories import reference
from webapp.console.topology_io import export_document

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GENERATED = "seed=3,volume_mb=24,dominance=0.8"


def lab_of(pipeline, **workload):  # type: ignore[no-untyped-def]
    return create_lab(
        pipeline_id=pipeline.pk,
        topology=export_document(pipeline),
        policy=pipeline.effective_policy_values(),
        **workload,
    )


def completed_run_of(pipeline, **fields) -> Run:  # type: ignore[no-untyped-def]
    return finished_run(
        pipeline_id=pipeline.pk,
        input_spec={"format": "jsonl", "generator": {"seed": 3}},
        **fields,
    )


def test_a_generated_workload_before_any_run_simulates_links_only_and_says_so() -> None:
    pipeline = reference()

    lab = lab_of(pipeline, generator=GENERATED)

    assert lab.status == "pending"
    assert lab.runtime is None and lab.calibrated_from is None
    assert "not calibrated" in lab_json(lab)["calibration"]
    assert lab.workload == {
        "kind": "generator",
        "generator": {
            "seed": 3,
            "volume_mb": 24.0,
            "dominance": 0.8,
            "skew_mean_s": 20.0,
            "keys_per_branch": 16,
            "users": 400,
            "malformed_every": 0,
        },
    }


def test_a_generated_workload_is_fitted_to_the_pipeline_s_latest_completed_run() -> None:
    pipeline = reference()
    run = completed_run_of(pipeline)

    lab = lab_of(pipeline, generator=GENERATED)

    assert lab.calibrated_from == run
    assert lab.runtime is not None
    assert lab.runtime["batch_fixed_s"] == pytest.approx(0.6)
    assert lab_json(lab)["calibration"].startswith(f"calibrated from run {run.pk}")


def test_a_generated_workload_is_fitted_to_the_run_closest_to_it_in_size() -> None:
    pipeline = reference()
    large = completed_run_of(pipeline, input_bytes=30 * MB)
    small = completed_run_of(pipeline, input_bytes=6 * MB)  # the latest

    near_large = lab_of(pipeline, generator="seed=3,volume_mb=24")
    near_small = lab_of(pipeline, generator="seed=3,volume_mb=4")

    assert near_large.calibrated_from == large
    assert near_small.calibrated_from == small
    assert lab_json(near_large)["calibration"].startswith(f"calibrated from run {large.pk} (30 MB)")


def test_a_lab_simulates_every_policy_and_the_pipeline_s_own_against_the_bound() -> None:
    pipeline = reference()
    completed_run_of(pipeline)
    lab = lab_of(pipeline, generator=GENERATED)

    assert simulate(lab.pk) == "done"

    lab.refresh_from_db()
    assert lab.finished_at is not None and lab.error == ""
    names = [arm["name"] for arm in lab.result["arms"]]
    assert names == [PIPELINE_ARM, *BENCHMARK_POLICIES]
    bound = lab.result["bound_s"]
    assert bound > 0
    for arm in lab.result["arms"]:
        assert arm["problem"] == ""
        # No policy beats the bound; each curve rises to the whole input when it ends.
        assert arm["completion_s"] >= bound * 0.999
        assert arm["ratio_to_bound"] == pytest.approx(arm["completion_s"] / bound, rel=1e-3)
        fractions = [f for _, f in arm["curve"]]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
        assert len(arm["curve"]) <= 130
    best = lab_json(lab)["best"]
    assert best is not None
    assert best["completion_s"] == min(a["completion_s"] for a in lab.result["arms"])
    # A second delivery of the task changes nothing.
    assert simulate(lab.pk) == "done"


def test_a_completed_run_s_recorded_input_is_replayed_with_its_own_runtime() -> None:
    pipeline = reference()
    run = completed_run_of(pipeline)

    lab = lab_of(pipeline, run_id=run.pk)
    assert simulate(lab.pk) == "done"

    lab.refresh_from_db()
    assert lab.workload == {"kind": "run", "run": run.pk}
    assert lab.calibrated_from == run
    assert lab_json(lab)["workload"] == f"the recorded input of run {run.pk}"
    assert all(arm["completion_s"] for arm in lab.result["arms"])


def test_each_arm_s_policy_is_the_one_it_was_simulated_with() -> None:
    pipeline = reference()
    lab = lab_of(pipeline, generator=GENERATED)

    assert arm_policy(lab, "ours") == BENCHMARK_POLICIES["ours"].policy().to_dict()
    assert (
        arm_policy(lab, PIPELINE_ARM)["throttling"]
        == pipeline.effective_policy_values()["throttling"]
    )
    assert arm_policy(lab, "nonsense") is None


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"generator": "seed=1,volume_mb=999999"}, "volume_mb"),
        ({"generator": "seed=1,frobnicate=2"}, "unknown generator field"),
        ({"run_id": 424242}, "this pipeline has no run 424242"),
        ({}, "exactly one workload"),
        ({"generator": GENERATED, "run_id": 1}, "exactly one workload"),
    ],
)
def test_a_workload_that_cannot_be_simulated_is_refused_and_nothing_is_created(
    workload: dict[str, object], message: str
) -> None:
    pipeline = reference()

    with pytest.raises(LabRefused, match=message):
        lab_of(pipeline, **workload)

    assert not PolicyLab.objects.exists()


def test_runs_that_cannot_be_replayed_are_refused_with_the_reason() -> None:
    pipeline = reference()
    running = completed_run_of(pipeline)
    Run.objects.filter(pk=running.pk).update(status="running")
    landing = completed_run_of(pipeline)
    Run.objects.filter(pk=landing.pk).update(input_spec={"kind": "folder", "folder": "/x"})
    other = finished_run(input_spec={"generator": {"seed": 1}})  # no pipeline: another's

    with pytest.raises(LabRefused, match=f"run {running.pk} is running"):
        lab_of(pipeline, run_id=running.pk)
    with pytest.raises(LabRefused, match="a continuous source"):
        lab_of(pipeline, run_id=landing.pk)
    with pytest.raises(LabRefused, match=f"no run {other.pk}"):
        lab_of(pipeline, run_id=other.pk)
    assert not PolicyLab.objects.exists()


def test_a_pipeline_has_at_most_a_few_labs_waiting_at_once() -> None:
    pipeline = reference()
    for _ in range(ACTIVE_PER_PIPELINE):
        lab_of(pipeline, generator=GENERATED)

    with pytest.raises(LabRefused, match="wait for one to finish"):
        lab_of(pipeline, generator=GENERATED)

    simulate(PolicyLab.objects.order_by("pk").first().pk)
    lab_of(pipeline, generator=GENERATED)  # one finished: room for one more


def test_a_simulation_past_its_time_limit_fails_the_lab_with_the_reason(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BPCONSOLE_LAB_TIMEOUT_S = 0.01
    lab = lab_of(reference(), generator=GENERATED)

    assert simulate(lab.pk) == "failed"

    lab.refresh_from_db()
    assert "longer than 0.01 s (BPCONSOLE_LAB_TIMEOUT_S)" in lab.error
    assert lab.result is None


def test_a_simulation_out_of_memory_fails_the_lab_not_the_worker(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BPCONSOLE_LAB_MEMORY_MB = 64  # below what Python and numpy need to start
    lab = lab_of(reference(), generator=GENERATED)

    assert simulate(lab.pk) == "failed"

    lab.refresh_from_db()
    assert "the simulation failed" in lab.error


def test_the_watchdog_fails_a_lab_whose_worker_stopped_mid_simulation(services) -> None:  # type: ignore[no-untyped-def]
    lab = lab_of(reference(), generator=GENERATED)
    PolicyLab.objects.filter(pk=lab.pk).update(
        status="running", created_at=timezone.now() - dt.timedelta(hours=1)
    )
    fresh = lab_of(reference(), generator=GENERATED)

    watchdog()

    lab.refresh_from_db()
    fresh.refresh_from_db()
    assert lab.status == "failed" and "start the lab again" in lab.error
    assert fresh.status == "pending"


def test_only_a_pipeline_s_latest_labs_are_kept_and_none_still_running_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(labs, "KEPT_PER_PIPELINE", 2)
    pipeline = reference()
    first = lab_of(pipeline, generator=GENERATED)
    PolicyLab.objects.filter(pk=first.pk).update(status="done")
    second = lab_of(pipeline, generator=GENERATED)

    third = lab_of(pipeline, generator=GENERATED)  # the first, done, is the third newest
    fourth = lab_of(pipeline, generator=GENERATED)  # the second is pending: it stays

    kept = set(PolicyLab.objects.values_list("pk", flat=True))
    assert kept == {second.pk, third.pk, fourth.pk}


def test_a_lab_over_a_placed_run_replays_each_operator_at_its_own_worker_s_cost() -> None:
    pipeline = reference()
    run = placed_run(
        pipeline_id=pipeline.pk, input_spec={"format": "jsonl", "generator": {"seed": 3}}
    )

    lab = lab_of(pipeline, run_id=run.pk)

    assert lab.runtime is not None
    assert lab.runtime["placed"]["task2"]["batch_mb_per_s"] == pytest.approx(1.0)
    assert (
        "task2 on spark-2@h, a batch costs 0.30 s + its MB at 1 MB/s"
        in (lab_json(lab)["calibration"])
    )
    assert simulate(lab.pk) == "done"
