"""The watchdog withdraws the elastic pool's asks of runs that ended without a driver to
withdraw them, on the real ZooKeeper and database."""

from __future__ import annotations

import pytest
from django.conf import settings

from orchestrator import tasks
from orchestrator.models import Run
from orchestrator.services.launcher import Endpoints
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.runs import pending_run

# Committed: the session's beat runs the watchdog too, every few seconds, and one that
# could not see the runs would withdraw every ask as a deleted run's.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NOT_A_RUN = "watchdog-test-asker"


def test_asks_of_runs_that_ended_or_are_gone_are_withdrawn_and_no_other(
    services: Endpoints,
) -> None:
    # Given a run cancelled while it asked for two workers (its driver dead, so nobody
    # withdrew the ask), a deleted run's ask, a pending run's, and an ask no run made
    cancelled = pending_run("reference")
    Run.objects.filter(pk=cancelled.pk).update(status=Run.Status.CANCELLED)
    going = pending_run("reference")
    gone = pending_run("reference")
    gone_id = gone.pk
    gone.delete()
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        control.ask_spark_workers(str(cancelled.pk), 2, "test: a stage needs two more")
        control.ask_spark_workers(str(going.pk), 1, "test: a stage needs one more")
        control.ask_spark_workers(str(gone_id), 1, "test: a stage needs one more")
        control.ask_spark_workers(NOT_A_RUN, 1, "test: not a run's")
        try:
            # When the watchdog passes (this one, or the session's beat just before it)
            report = tasks.watchdog()
            # Then the ended and the deleted run ask for nothing; the others still do
            assert set(report["asks_withdrawn"]) <= {cancelled.pk, gone_id}
            asked = control.spark_workers_asked()
            assert str(cancelled.pk) not in asked and str(gone_id) not in asked
            assert asked[str(going.pk)] == 1 and asked[NOT_A_RUN] == 1
            # and a second pass has nothing left to withdraw
            assert tasks.watchdog()["asks_withdrawn"] == []
        finally:
            for key in (str(going.pk), NOT_A_RUN):
                control.ask_spark_workers(key, 0, "test: done")
