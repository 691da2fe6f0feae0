"""A batch the balancer bounds (balancer/queued.py, ``batch_bounds``) claims at most its
bound, the segment that crosses it included, and leaves the rest of its pool waiting,
where a move to a sibling can take it. On the real PostgreSQL and Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Segment
from orchestrator.worker.batch import process_batch
from tests.orchestrator.runs import pending_run, queue_segments, records_file

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_bounded_batch_takes_up_to_its_bound_and_the_rest_waits(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path / "data"
    run = pending_run("reference")
    paths = [records_file(tmp_path / f"in{n}.jsonl", range(n * 10, n * 10 + 10)) for n in range(4)]
    queue_segments(run, paths, "task1")
    first = Segment.objects.filter(run=run, node="task1").order_by("chunk").first()
    assert first is not None

    # A bound of one byte less than two chunks: the second chunk crosses it and is taken.
    bounded = process_batch(run.pk, "task1", None, max_bytes=2 * first.bytes - 1)

    assert bounded.segments == 2
    states = dict(Segment.objects.filter(run=run, node="task1").values_list("chunk", "state"))
    assert states == {0: "done", 1: "done", 2: "queued", 3: "queued"}
    # Unbounded, the next batch takes all that waits.
    assert process_batch(run.pk, "task1", None).segments == 2
