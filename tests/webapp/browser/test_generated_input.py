"""The run page while the run's driver writes its generated input: "preparing input: n%"
goes up live, and Stop stops the writing (real Chromium, ASGI server and workers)."""

from __future__ import annotations

import re
import time

import pytest

from orchestrator.models import Run
from orchestrator.pipeline.generator import partial_paths
from orchestrator.run.generation import input_path
from tests.webapp.browser.test_console import login, shoot, wait_until_workers_are_idle
from tests.webapp.console.factories import make_user, reference

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
]


def test_the_run_page_shows_the_input_being_prepared_and_stop_ends_the_writing(
    asgi_server, workers, chromium, artifacts
) -> None:
    # Given an operator on the reference pipeline's page
    reference()
    make_user("otto", "operator")
    page = login(chromium, asgi_server, "otto")
    page.click('a[href="/pipelines/reference/"]')
    # When they start a run over 400 MB of generated input
    page.fill("#id_generator", "seed=19,volume_mb=400")
    page.click("#start-button")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    # Then the run page says how far the input is, and the figure goes up live
    shown = page.wait_for_selector("#run-preparing:not([hidden])", timeout=60_000)
    first = shown.text_content()
    assert re.fullmatch(r"preparing input: \d+%", first or ""), first
    page.wait_for_function(
        "t => !document.getElementById('run-preparing').hidden"
        " && document.getElementById('run-preparing').textContent !== t",
        arg=first,
        timeout=30_000,
    )
    assert re.fullmatch(r"preparing input: \d+%", page.text_content("#run-preparing") or "")
    shoot(page, artifacts, "run-preparing-input")
    # When they stop the run while its input is written
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#btn-stop")
    page.wait_for_selector("#run-status[data-status=cancelled]")
    # Then the writing stops and leaves no file behind
    deadline = time.monotonic() + 30
    path = input_path(run.pk)
    while partial_paths(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert partial_paths(path) == []
    assert not path.exists()
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert "paths" not in run.input_spec
    wait_until_workers_are_idle()
    assert page.js_errors == []
    page.context.close()
