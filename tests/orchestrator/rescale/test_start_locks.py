"""Starting an adjustment beside a worker's claim (orchestrator/rescale/start.py): the
adjustment locks the run, then the instances it changes; a claim holds its instance and,
when it commits, its new rows check the run they reference. The run's lock must let that
check through, or each waits for the other (PostgreSQL: "deadlock detected") and the
operator's adjustment is lost."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from orchestrator.models import Adjustment, Instance, Segment
from orchestrator.rescale.plan import Change
from orchestrator.rescale.start import begin
from tests.orchestrator.runs import pending_run
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def waiting_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        (count,) = cursor.fetchone()
    return int(count)


def test_an_adjustment_starting_while_a_claim_commits_rows_of_the_run_does_not_deadlock() -> None:
    run = pending_run("reference")
    claim_held = threading.Event()
    failures: list[BaseException] = []

    def claim() -> None:
        # A worker's claim: its instance row locked, a row of the run written, and the
        # commit (with the row's check of the run) only once the adjustment waits for it.
        try:
            with transaction.atomic():
                list(Instance.objects.select_for_update().filter(run=run, name="task2"))
                Segment.objects.create(
                    id="out-1",
                    run=run,
                    chunk=0,
                    origin_file=0,
                    origin_offset=0,
                    origin_length=1,
                    node="output",
                    upstream="task2",
                    path="/nowhere/out-1",
                    bytes=1,
                    available_at=timezone.now(),
                )
                claim_held.set()
                wait_for("the adjustment waiting for the claim's instance", waiting_locks, 30)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failures.append(error)
        finally:
            connections.close_all()

    worker = threading.Thread(target=claim)
    worker.start()
    assert claim_held.wait(30), "the claim never took its instance"
    try:
        adjustment = begin(run.pk, Change("scale_in", removed=("task2",)), epoch=1, source="source")
    finally:
        worker.join(60)
    assert not worker.is_alive(), "the claim never committed"
    assert failures == []
    assert adjustment.status == Adjustment.Status.RUNNING
    assert Segment.objects.filter(pk="out-1").exists()
