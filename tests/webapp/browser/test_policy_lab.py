"""The policy lab in the browser: an operator simulates every policy on a workload,
picks one from the predicted curves, starts a live run with it and watches its curve
drawn over the prediction; then replays that run's recorded input, calibrated by it
(real Chromium, ASGI server, Celery workers and Spark)."""

from __future__ import annotations

import re

import pytest

from orchestrator.models import PolicyLab, Run
from tests.webapp.browser.test_console import login, shoot, wait_until_workers_are_idle
from tests.webapp.console.factories import make_user, reference

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
]

ARMS = 8  # the pipeline's own policy and the benchmark's seven


def test_an_operator_picks_a_policy_in_the_lab_and_its_live_run_is_drawn_over_it(
    asgi_server, workers, chromium, artifacts
) -> None:
    # Given an operator on the reference pipeline's page, which has never run
    reference()
    make_user("otto", "operator")
    page = login(chromium, asgi_server, "otto")
    page.click('a[href="/pipelines/reference/"]')
    # When they simulate every policy on a generated workload
    page.fill("#id_lab_generator", "seed=5,volume_mb=6,dominance=0.8")
    page.click("#lab-button")
    page.wait_for_url(re.compile(r"/labs/\d+/$"))
    # Then the lab finishes in a worker, and draws every policy's curve and the bound
    page.wait_for_selector("#lab-status[data-status=done]", timeout=60_000)
    assert page.locator("#lab-arms tbody tr").count() == ARMS
    assert page.locator("#lab-chart path.series").count() == ARMS
    assert page.locator("#lab-chart line.mark").count() == 1
    assert "not calibrated" in (page.text_content("#lab-calibration") or "")
    # When they pick "ours" from the table, and start a live run with it
    page.click('#lab-arms tr[data-arm="ours"]')
    assert page.input_value("#id_lab_policy") == "ours"
    assert page.locator('#lab-arms tr.chosen[data-arm="ours"]').count() == 1
    shoot(page, artifacts, "policy-lab", full_page=True)
    page.click("#lab-start-button")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    assert run.lab_arm == "ours" and run.lab == PolicyLab.objects.get()
    # Then the run page draws the prediction, dashed, with the bound, and the live curve
    # over it as the run goes, to the end
    assert "for ours (proportional)" in (page.text_content("#chart-prediction") or "")
    page.wait_for_selector("#chart-completion path.series-predicted.dashed")
    page.wait_for_selector("#chart-completion line.mark", state="attached")  # 0 px wide
    page.wait_for_selector("#run-status[data-status=completed]", timeout=120_000)
    page.wait_for_selector("#chart-completion path.series-completion")
    shoot(page, artifacts, "policy-lab-live-run", full_page=True)
    # When they replay that run's recorded input in a new lab
    page.goto(f"{asgi_server.url}/pipelines/reference/")
    page.check("input[name=workload][value=run]")
    page.select_option("#id_lab_run", str(run.pk))
    page.click("#lab-button")
    page.wait_for_url(re.compile(r"/labs/\d+/$"))
    page.wait_for_selector("#lab-status[data-status=done]", timeout=60_000)
    # Then it is calibrated by the run: its batches' cost and its operators' reductions
    assert (page.text_content("#lab-calibration") or "").startswith(f"calibrated from run {run.pk}")
    assert f"the recorded input of run {run.pk}" in (page.text_content("#lab-workload") or "")
    assert page.locator("#lab-chart path.series").count() == ARMS
    shoot(page, artifacts, "policy-lab-calibrated", full_page=True)
    wait_until_workers_are_idle()
    assert page.js_errors == []
    page.context.close()
