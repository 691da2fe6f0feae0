"""The driver rides out PostgreSQL dropping every connection (as a restart does): it
keeps the run, waits for the database, resumes from the ledger, and the result is exact."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from orchestrator.models import Event, Run, Segment
from tests.orchestrator.run.scenarios import (
    completes_like_the_batch_job,
    policy,
    skewed_reference,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def _drop_every_other_connection() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (dropped,) = cursor.fetchone()
    return int(dropped)


def _takeovers(run: Run) -> list[str]:
    return list(
        Event.objects.filter(run=run, kind="driver").order_by("pk").values_list("reason", flat=True)
    )


def test_the_driver_keeps_its_run_through_the_database_dropping_its_connections(
    workers,
) -> None:
    run = start(
        skewed_reference(),
        policy(),
        generator="seed=31,volume_mb=3,dominance=0.85,skew_mean_s=1000",
    )
    deadline = time.monotonic() + 120
    while not Segment.objects.filter(run=run, state="done").exclude(node="source").exists():
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.05)
    first = _takeovers(run)
    assert len(first) == 1
    identity = first[0].split()[1]
    # When PostgreSQL drops every connection of the console under the driver six times,
    # one more than a Celery task's retries
    for _ in range(6):
        resumed = len(_takeovers(run))
        assert _drop_every_other_connection() > 0
        deadline = time.monotonic() + 60
        while len(_takeovers(run)) == resumed:
            assert time.monotonic() < deadline, "the driver did not resume"
            time.sleep(0.1)
    # Then the same driver resumed the run each time (a new epoch, no other driver), and
    # the result equals the batch job's
    completes_like_the_batch_job(run)
    takeovers = _takeovers(run)
    assert len(takeovers) >= 7, takeovers
    assert all(t.split()[1] == identity for t in takeovers), takeovers
