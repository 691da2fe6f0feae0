"""The console in a real Chromium against the real ASGI server, workers and services:
an operator starts a skewed run and watches the balancer act live; an operator
hot-migrates an instance and watches the graph change; a viewer is refused; the editor
shows problems next to their fields. Screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from orchestrator import service
from orchestrator.celery import app as celery_app
from orchestrator.models import Adjustment, Event, Instance, Run, Segment
from tests.orchestrator.run.scenarios import policy, skewed_reference
from tests.webapp.console.factories import make_run, make_user, reference
from webapp.console.models import Pipeline, Policy
from webapp.console.topology_io import save_document

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
]

# Skewed towards the slow branches: they fill up, get flagged, and their data migrates;
# enough of it that the run is still going when the operator stops it.
GENERATOR = "seed=11,volume_mb=24,dominance=0.85,skew_mean_s=1000"
OPERATOR_NODES = ("task1", "task2", "task3")
# More input than the hot migration takes, so the run is still going when it completes.
LONG_GENERATOR = "seed=13,volume_mb=6,dominance=0.85,skew_mean_s=1000"


def login(browser: Any, server: Any, name: str, *, width: int = 1366, height: int = 768) -> Any:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.js_errors = []  # every uncaught script error of the page; a test ends with none
    page.on("pageerror", lambda error: page.js_errors.append(str(error)))
    page.on("console", lambda message: _csp_violation(page, message.text))
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", f"pw-{name}-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/")
    return page


def _csp_violation(page: Any, text: str) -> None:
    """A Content-Security-Policy violation counts as a script error: the console's pages
    need nothing the policy blocks (no inline script, style or handler)."""
    if "Content Security Policy" in text:
        page.js_errors.append(text)


def levels(page: Any) -> dict[str, str]:
    return page.eval_on_selector_all(
        "g.node", "els => Object.fromEntries(els.map(e => [e.dataset.node, e.dataset.level]))"
    )


def shoot(page: Any, artifacts: Any, name: str, *, full_page: bool = False) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=full_page)


def wait_until_workers_are_idle(timeout_s: float = 60.0) -> None:
    """A stopped run's batches already handed to the workers still run and write to the
    ledger: the next test's database flush must not race them (it can deadlock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inspect = celery_app.control.inspect(timeout=1.0)
        replies = [inspect.active() or {}, inspect.reserved() or {}]
        if not any(tasks for reply in replies for tasks in reply.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the workers were still busy after {timeout_s} s")


def test_an_operator_starts_a_skewed_run_and_watches_the_balancer_act(
    asgi_server, workers, chromium, artifacts
) -> None:
    # Given the reference pipeline in its small, fast variant, a fast policy, an operator
    save_document(skewed_reference())
    Policy.objects.create(name="fast-demo", description="200 ms ticks", **policy())
    make_user("otto", "operator")
    page = login(chromium, asgi_server, "otto")
    # When they open the reference pipeline and start a run over a skewed generated input
    page.click('a[href="/pipelines/reference/"]')
    page.fill("#id_generator", GENERATOR)
    page.select_option("#id_policy", "fast-demo")
    page.click("#start-button")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    assert run.created_by.username == "otto"
    page.evaluate("window.sameDocument = true")
    page.wait_for_selector("#connection[data-state=live]")

    # Then the levels change without reloading the page
    seen: dict[str, set[str]] = {n: set() for n in OPERATOR_NODES}
    deadline = time.monotonic() + 60
    while sum(len(v - {""}) for v in seen.values()) < 6 and time.monotonic() < deadline:
        for node, level in levels(page).items():
            if node in seen:
                seen[node].add(level or "")
        page.wait_for_timeout(200)
    assert sum(len(v - {""}) for v in seen.values()) >= 6, seen
    assert page.evaluate("window.sameDocument") is True
    assert page.evaluate("bpConsole.state.messages") > 3
    # ...the run is labelled emulated (its links and two nodes have declared limits),
    # and an operator's node shows its capacity measured from its batches and how busy
    # they kept the Spark workers
    assert page.locator("#run-emulated").is_visible()
    measured = page.wait_for_selector(
        'g.node.kind-operator[data-measured-capacity]:not([data-measured-capacity=""])',
        timeout=60_000,
    )
    assert measured is not None and float(measured.get_attribute("data-measured-capacity")) > 0
    assert "busy" in measured.query_selector("text.sub").text_content()

    # ...a filling node says when it will reach its high water
    full_in, text = page.wait_for_function(
        """() => {
          const g = document.querySelector('g.node[data-full-in]:not([data-full-in=""])');
          const text = g && g.querySelector(".level-text").textContent;
          return g && [Number(g.getAttribute("data-full-in")), text];
        }""",
        timeout=60_000,
    ).json_value()
    assert full_in > 0 and "full in" in text, (full_in, text)

    # ...a flag lights up and the balancer's migration path appears
    page.wait_for_selector("g.node.flagged", timeout=120_000)
    page.wait_for_selector("path.migration-path", state="attached", timeout=120_000)
    assert Event.objects.filter(run=run, kind="set_flag").exists()
    assert Event.objects.filter(run=run, kind="start_migration").exists()

    # Clicking a flag's event shows why: the node as the balancer saw it, its level at or
    # past the high water it was judged by
    page.select_option("#event-filter", "flag")
    # Locators, not element handles: the timeline re-renders as events arrive.
    flag = page.locator('#timeline li[data-kind="set_flag"]').first
    event_id = flag.get_attribute("data-event")
    event = page.locator(f'#timeline li[data-event="{event_id}"]')
    node = event.locator(".node-name").text_content()
    event.click()
    row = (
        f'#timeline li[data-event="{event_id}"][aria-expanded="true"] '
        f'table.observed tr[data-node="{node}"]'
    )
    page.locator(row).wait_for()
    level, high = page.evaluate(
        """(row) => ["level", "high_water"].map((name) =>
          Number(document.querySelector(`${row} td[data-field="${name}"]`).textContent))""",
        row,
    )
    assert level >= high, (level, high)
    # For the screenshot only, in one step: a re-render between finding the row and
    # scrolling to it detached it in a full run.
    page.evaluate("(row) => document.querySelector(row)?.scrollIntoView()", row)
    shoot(page, artifacts, "run-why")
    page.select_option("#event-filter", "all")

    # The pipelines page, while the run goes on: status, last run, health dot
    overview = page.context.new_page()
    overview.goto(f"{asgi_server.url}/")
    assert overview.locator('tr[data-pipeline="reference"] .dot').get_attribute("class") in {
        "dot dot-ok",
        "dot dot-warn",
    }
    shoot(overview, artifacts, "pipelines")
    overview.close()

    # When the operator pauses and resumes the run, the page follows
    page.click("#btn-pause")
    page.wait_for_selector("#run-status[data-status=paused]")
    run.refresh_from_db()
    assert run.status == "paused"
    page.click("#btn-resume")
    page.wait_for_selector("#run-status[data-status=running]")

    # An operator's node action, confirmed, is recorded with their name
    page.click('g.node[data-node="task1"]')
    page.wait_for_selector("#panel-node:not([hidden])")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#btn-migrate")
    page.wait_for_selector("#toast[data-kind=ok]")
    row = page.wait_for_selector('#timeline li[data-kind="operator_migrate"]')
    assert "otto" in row.text_content()
    # its migration stays until stopped: the path is there for the screenshots
    page.wait_for_selector(
        'path.migration-path[data-migration^="task1>"]', state="attached", timeout=30_000
    )
    page.wait_for_timeout(1500)  # a few seconds of sparkline history
    shoot(page, artifacts, "run-1366x768")
    shoot(page, artifacts, "run-1366x768-full", full_page=True)
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(800)
    shoot(page, artifacts, "run-1920x1080")

    # A dropped connection shows "reconnecting", then the page is live again
    page.evaluate("bpConsole.state.socket.close()")
    page.wait_for_selector("#connection[data-state=reconnecting]")
    page.wait_for_selector("#connection[data-state=live]")

    # Stopping (after a confirmation) ends the run
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#btn-stop")
    page.wait_for_selector("#run-status[data-status=cancelled]")
    wait_until_workers_are_idle()
    assert page.js_errors == []
    page.context.close()


def test_an_operator_hot_migrates_an_instance_from_the_run_view_and_sees_it_complete(
    asgi_server, workers, chromium, artifacts
) -> None:
    # Given a run of the reference pipeline under way, and the live Spark worker
    save_document(skewed_reference())
    Policy.objects.create(name="fast-demo", description="200 ms ticks", **policy())
    make_user("otto", "operator")
    worker = next(iter(service.live_workers()))
    page = login(chromium, asgi_server, "otto")
    page.goto(f"{asgi_server.url}/pipelines/reference/")
    page.fill("#id_generator", LONG_GENERATOR)
    page.select_option("#id_policy", "fast-demo")
    page.click("#start-button")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    page.wait_for_selector("#connection[data-state=live]")
    deadline = time.monotonic() + 120
    while not Segment.objects.filter(run=run, state="done", marker=False).exists():
        assert time.monotonic() < deadline, "the run never processed a segment"
        time.sleep(0.2)

    # When the operator hot-migrates task2 to that worker (and confirms)
    page.click('g.node[data-node="task2"]')
    page.wait_for_selector(f'#worker-select option[value="{worker}"]', state="attached")
    page.select_option("#worker-select", worker)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#btn-hot-migrate")
    page.wait_for_selector("#toast[data-kind=ok]")
    row = page.wait_for_selector('#timeline li[data-kind="operator_hot_migrate"]')
    assert "otto" in row.text_content()

    # Then the view follows the adjustment to its end: a new instance of stage agg on
    # that worker has taken task2's place in the drawing
    strip = page.wait_for_selector(
        "#adjustment[data-status=complete], #adjustment[data-status=rolled_back]",
        timeout=90_000,
    )
    adjustment = Adjustment.objects.get(run=run)
    assert adjustment.status == "complete", (
        adjustment.outcome,
        list(Event.objects.filter(run=run).order_by("pk").values_list("time", "kind", "reason")),
    )
    assert "hot migration" in strip.text_content()
    assert "done in" in strip.text_content()
    names = page.eval_on_selector_all("g.node", "els => els.map(e => e.dataset.node)")
    assert "task2" not in names
    added = [n for n in names if n.startswith("agg-")]
    assert len(added) == 1, names
    assert page.get_attribute(f'g.node[data-node="{added[0]}"]', "data-worker") == worker
    assert page.is_visible("#panel-gone")
    assert adjustment.plan["added"] == added and adjustment.plan["removed"] == ["task2"]
    assert Instance.objects.get(run=run, name=added[0]).worker == worker
    page.click(f'g.node[data-node="{added[0]}"]')
    page.wait_for_selector(f'#sel-worker:text("{worker}")')
    shoot(page, artifacts, "run-hot-migration")

    # Stopping (after a confirmation) ends the run, unless it has just completed
    if page.is_enabled("#btn-stop"):
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#btn-stop")
    page.wait_for_selector("#run-status[data-status=cancelled], #run-status[data-status=completed]")
    wait_until_workers_are_idle()
    assert page.js_errors == []
    page.context.close()


def test_a_viewer_trying_an_operator_action_is_refused_and_it_is_recorded(
    asgi_server, chromium, artifacts
) -> None:
    # Given a paused run (a running one may complete before the viewer's second try,
    # and its controls are then disabled) and a viewer watching it
    run = make_run(reference())
    Run.objects.filter(pk=run.pk).update(status="paused")
    vera = make_user("vera", "viewer")
    page = login(chromium, asgi_server, "vera")
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    page.wait_for_selector("#connection[data-state=live]")
    page.wait_for_selector("#run-status[data-status]")
    # When the viewer asks for a migration of task2's data (and confirms)
    page.click('g.node[data-node="task2"]')
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#btn-migrate")
    # Then it is refused (403), said on the page, and the attempt is in the timeline
    toast = page.wait_for_selector("#toast[data-kind=refused]")
    assert "HTTP 403" in toast.text_content()
    assert "operator role" in toast.text_content()
    row = page.wait_for_selector('#timeline li[data-kind="action_refused"]')
    assert "vera" in row.text_content()
    shoot(page, artifacts, "viewer-refused")
    # and a run control is refused the same way
    page.click("#btn-resume")
    # (a function, not an expression: Playwright evaluates an expression with eval(),
    # which the pages' Content-Security-Policy forbids)
    page.wait_for_function(
        "() => document.querySelectorAll('#timeline li[data-kind=\"action_refused\"]').length >= 2"
    )
    refusals = Event.objects.filter(run=run, kind="action_refused", user=vera)
    assert sorted(e.data["action"] for e in refusals) == ["migrate", "resume_run"]
    assert Run.objects.get(pk=run.pk).status == "paused"
    assert not Event.objects.filter(run=run, kind="operator_migrate").exists()
    assert page.js_errors == []
    page.context.close()
    # The watchdog gives this paused run a driver: end it before the database flush.
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    wait_until_workers_are_idle()


def test_the_editor_shows_problems_beside_their_fields_and_saves_only_a_valid_pipeline(
    asgi_server, chromium, artifacts
) -> None:
    reference()
    make_user("otto", "operator")
    page = login(chromium, asgi_server, "otto")
    page.goto(f"{asgi_server.url}/pipelines/reference/edit/")
    # When a buffer size is set to 0 and a new, unconnected node is added
    page.fill('[data-loc="nodes[1].buffer_mb"]', "0")
    error = page.wait_for_selector('[data-error-for="nodes[1].buffer_mb"] div')
    assert "at least" in error.text_content()
    # (what each node writes, from the source's declared fields, is under its parameters)
    schema = "document.querySelector('[data-schema-for=\"nodes[1]\"]')"
    page.wait_for_function(f"() => /^writes /.test({schema}.textContent)")
    writes = page.text_content('[data-schema-for="nodes[1]"]')
    assert writes.startswith("writes key string, count long, sum double")
    # (the reference's stages, saved in the key form, show the measures it means, one a
    # line, and not the form's own parameters)
    measures = '[data-loc="nodes[1].params.measures"]'
    shown = page.input_value(measures)
    assert shown.splitlines() == [
        "count = count()",
        "sum = sum(value)",
        "min = min(value)",
        "max = max(value)",
        "avg = avg(value)",
        "distinct_users = count_distinct(user)",
    ]
    assert page.query_selector('[data-loc="nodes[1].params.value"]') is None
    # and a field the source does not declare is named
    page.fill(measures, shown.replace("sum(value)", "sum(valeu)"))
    unknown = page.wait_for_selector('[data-error-for="nodes[1].params.measures"] div')
    assert "measures[1]: unknown field 'valeu' (did you mean 'value'?)" in unknown.text_content()
    page.click("#add-node")
    page.wait_for_selector('#editor-preview g.node[data-node="node6"]')
    unreachable = page.wait_for_selector('[data-error-for="nodes[5]"] div')
    assert "unreachable" in unreachable.text_content()
    page.evaluate("window.scrollTo(0, 0)")
    shoot(page, artifacts, "editor-problems-full", full_page=True)
    page.evaluate("window.scrollTo(0, document.querySelector('#nodes-table').offsetTop - 40)")
    shoot(page, artifacts, "editor-problems")
    # Then saving brings the page back with the problems, and nothing is saved
    page.click("#save")
    page.wait_for_selector('[data-error-for="nodes[1].buffer_mb"] div')
    pipeline = Pipeline.objects.get(name="reference")
    assert pipeline.nodes.count() == 5
    assert pipeline.nodes.get(name="task1").buffer_mb == 64
    assert pipeline.nodes.get(name="task1").params["measures"][1]["field"] == "value"
    # When the node is linked into the graph, the buffer and the field fixed, it saves
    page.fill('[data-loc="nodes[1].buffer_mb"]', "32")
    page.fill(measures, shown)
    page.click("#add-edge")
    page.select_option('[data-loc="edges[6].from"]', "source")
    page.select_option('[data-loc="edges[6].to"]', "node6")
    page.click("#add-edge")
    page.select_option('[data-loc="edges[7].from"]', "node6")
    page.select_option('[data-loc="edges[7].to"]', "output")
    page.wait_for_selector('#check-state[data-problems="0"]')
    page.click("#save")
    page.wait_for_url(f"{asgi_server.url}/pipelines/reference/")
    assert pipeline.nodes.get(name="task1").buffer_mb == 32
    assert pipeline.edges.filter(target__name="node6").exists()
    assert page.js_errors == []
    page.context.close()


def test_an_operator_writes_grouped_measures_one_a_line_and_sees_their_types(
    asgi_server, chromium, artifacts
) -> None:
    doc = {
        "name": "per-carrier",
        "nodes": [
            {
                "name": "source",
                "kind": "source",
                "params": {
                    "route_by": "carrier",
                    "schema": "carrier string, origin string, delay double",
                },
            },
            {
                "name": "agg",
                "kind": "operator",
                "operator": "aggregate",
                "params": {"group_by": ["carrier"], "measures": [{"name": "n", "fn": "count"}]},
            },
            {"name": "output", "kind": "sink"},
        ],
        "edges": [{"from": "source", "to": "agg"}, {"from": "agg", "to": "output"}],
    }
    save_document(doc)
    make_user("otto", "operator")
    page = login(chromium, asgi_server, "otto")
    page.goto(f"{asgi_server.url}/pipelines/per-carrier/edit/")
    measures = '[data-loc="nodes[1].params.measures"]'
    assert page.input_value(measures) == "n = count()"
    # When a measure is added a line, it is typed in what the node writes
    page.fill(measures, "n = count()\nmean_delay = avg(delay)")
    schema = "document.querySelector('[data-schema-for=\"nodes[1]\"]')"
    page.wait_for_function(f"() => /mean_delay double/.test({schema}.textContent)")
    assert page.text_content('[data-schema-for="nodes[1]"]').startswith(
        "writes carrier string, n long, mean_delay double"
    )
    # ...and one of another form, or of a text field, is refused where it is
    page.fill(measures, "n = count()\nmean_delay = avg(origin)\ntotal")
    error = page.wait_for_selector('[data-error-for="nodes[1].params"] div')
    assert "measures[2] must be a mapping" in error.text_content()
    page.fill(measures, "n = count()\nmean_delay = avg(origin)")
    page.wait_for_function(
        "() => /avg of 'origin', a string/.test("
        "document.querySelector('[data-error-for=\"nodes[1].params.measures\"]').textContent)"
    )
    # Then, fixed, it saves as named measures
    page.fill(measures, "n = count()\nmean_delay = avg(delay)")
    page.wait_for_selector('#check-state[data-problems="0"]')
    page.click("#save")
    page.wait_for_url(f"{asgi_server.url}/pipelines/per-carrier/")
    assert Pipeline.objects.get(name="per-carrier").nodes.get(name="agg").params["measures"] == [
        {"name": "n", "fn": "count"},
        {"name": "mean_delay", "fn": "avg", "field": "delay"},
    ]
    assert page.js_errors == []
    page.context.close()
