"""Refused actions are audited without letting the refused user flood the timeline: one
event per user, action and run, counted; a refused request's body is never read, so
nothing of it is recorded."""

from __future__ import annotations

import random
import string
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from orchestrator import service
from orchestrator.models import Event
from orchestrator.run.snapshot import RECENT_EVENTS
from tests.webapp.console.factories import client_for, make_run, make_user

pytestmark = [pytest.mark.integration]


ALPHABET = string.ascii_letters + string.punctuation + " é✓\n"


def random_text(rng: random.Random) -> str:
    return "".join(rng.choices(ALPHABET, k=rng.randint(1, 300)))


@pytest.mark.django_db
def test_a_hundred_refused_migrations_with_random_node_text_are_one_counted_event() -> None:
    # Given a run (its run_created event is a real event) and a viewer
    run = make_run()
    nodes = {n["name"] for n in run.topology["nodes"]}
    client, vera = client_for("vera", "viewer")
    rng = random.Random(20)
    # When the viewer sends 100 migrations of made-up nodes, as fast as it can
    for _ in range(100):
        response = client.post(
            f"/api/runs/{run.pk}/migrate/",
            {"node": random_text(rng)},
            content_type="application/json",
        )
        assert response.status_code == 403
    # Then they are one action_refused event of that user and run, counted 100 times
    refusals = list(Event.objects.filter(run=run, kind="action_refused", user=vera))
    assert len(refusals) == 1
    refusal = refusals[0]
    assert refusal.data["action"] == "migrate"
    assert refusal.data["count"] == 100
    assert timezone.now() - timezone.datetime.fromisoformat(refusal.data["last"]) < timedelta(
        minutes=1
    )
    assert "100 attempts" in refusal.reason
    # no event names a node the run does not have; the text is only a short marked mention
    assert set(Event.objects.filter(run=run).exclude(node="").values_list("node", flat=True)) <= (
        nodes
    )
    assert refusal.node == ""
    assert set(refusal.data) == {"action", "count", "last"}
    # and the run's real events are still in the live view's window
    events = client.get(f"/api/runs/{run.pk}/events/?limit={RECENT_EVENTS}").json()
    assert "run_created" in [e["kind"] for e in events]
    assert [e["kind"] for e in events].count("action_refused") == 1


@pytest.mark.django_db
def test_a_refusal_records_what_the_url_names_and_nothing_of_the_body() -> None:
    run = make_run()
    client, vera = client_for("vera", "viewer")
    client.post(f"/api/runs/{run.pk}/migrate/", {"node": "task2"}, content_type="application/json")
    refusal = Event.objects.get(run=run, kind="action_refused", user=vera)
    assert refusal.node == ""
    assert refusal.data == {"action": "migrate"}  # once: no count yet


@pytest.mark.django_db
def test_refusals_further_apart_than_the_window_or_of_other_users_or_actions_are_new() -> None:
    run = make_run()
    vera_client, vera = client_for("vera", "viewer")
    victor_client, victor = client_for("victor", "viewer")

    def migrate(client: object) -> None:
        client.post(  # type: ignore[attr-defined]
            f"/api/runs/{run.pk}/migrate/", {"node": "task1"}, content_type="application/json"
        )

    migrate(vera_client)
    migrate(vera_client)
    # Another user's refusals, and another action of the same user, are their own events
    migrate(victor_client)
    vera_client.post(f"/api/runs/{run.pk}/pause/")
    assert Event.objects.filter(run=run, kind="action_refused", user=victor).count() == 1
    vera_actions = Event.objects.filter(run=run, kind="action_refused", user=vera)
    assert sorted(e.data["action"] for e in vera_actions) == ["migrate", "pause_run"]
    # When the last refusal is older than the window, the next one starts a new event
    first = vera_actions.get(data__action="migrate")
    assert first.data["count"] == 2
    before = timezone.now() - timedelta(seconds=settings.BPCONSOLE_REFUSAL_WINDOW_S + 1)
    first.data["last"] = before.isoformat()
    first.save(update_fields=["data"])
    migrate(vera_client)
    migrations = vera_actions.filter(data__action="migrate").order_by("id")
    assert [e.data.get("count", 1) for e in migrations] == [2, 1]


@pytest.mark.django_db(transaction=True)
def test_concurrent_refusals_do_not_write_duplicates() -> None:
    # Given a run and a viewer whose refusals arrive from 8 requests at the same moment
    run = make_run()
    vera = make_user("vera", "viewer")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def refuse_five() -> None:
        try:
            start.wait()
            for _ in range(5):
                service.record_refusal(
                    run_id=run.pk,
                    action="migrate",
                    user=vera,
                    reason="vera (viewer) tried to migrate",
                    data={"node": "task1"},
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=refuse_five) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then there is one event, counted 40 times
    assert errors == []
    refusal = Event.objects.get(run=run, kind="action_refused", user=vera)
    assert refusal.data["count"] == 40
