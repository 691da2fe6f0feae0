"""A bounded run settles as soon as its last merge is in, not at the balancer's next
tick."""

from __future__ import annotations

import pytest
from django.db.models import Max

from orchestrator.models import Segment
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_run_completes_within_a_moment_of_its_last_merge_whatever_its_tick(workers) -> None:
    # Given a run whose balancer ticks every 30 s, far longer than the run takes
    run = start(
        skewed_reference(slow_mbps=50),
        policy(tick_ms=30_000, migration="off", throttling="none"),
        generator="seed=7,volume_mb=2",
    )
    # When it ends
    run = wait_until_done(run)
    # Then it completed exact, moments after its sink merged the last chunk
    assert run.status == "completed", run.error
    last_merge = Segment.objects.filter(run=run, node="output").aggregate(last=Max("done_at"))
    assert run.finished_at is not None and last_merge["last"] is not None
    assert (run.finished_at - last_merge["last"]).total_seconds() < 2.0
