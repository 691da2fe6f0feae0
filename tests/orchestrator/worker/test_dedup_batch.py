"""A deduplicate stage's batch on the real PostgreSQL and Spark: a record another batch
is keeping while this one completes is waited for and, once that batch commits, left
out of this one's output; the others go on once."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.ledger import seen
from orchestrator.models import Run, SeenRecord, Segment
from orchestrator.rescale.start import ensure_instances
from orchestrator.worker.batch import process_batch
from tests.orchestrator.ledger.locks import second_waits_on_first
from tests.orchestrator.run.scenarios import deduplicated_flights
from tests.orchestrator.runs import queue_segments

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_record_another_batch_keeps_meanwhile_is_left_out_and_the_rest_go_on_once(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path / "data"
    doc = deduplicated_flights()
    run = Run.objects.create(
        pipeline_name=doc["name"], topology=doc, policy={}, input_spec={}, status="pending", epoch=1
    )
    ensure_instances(run)
    flights = tmp_path / "flights.jsonl"
    flights.write_text(
        "".join(
            json.dumps({"id": f"F{i}", "carrier": "UA", "origin": "JFK", "delay": i}) + "\n"
            for i in (1, 2, 3, 2)
        )
    )
    queue_segments(run, [flights], node="once")
    # Given another batch that keeps F1 and has not committed yet, when this batch
    # completes (waiting for the other's commit to know F1's fate)
    f1 = hashlib.sha256(b'{"id":"F1"}').hexdigest()[:32]
    reports: list[Any] = []
    second_waits_on_first(
        lambda: seen.keep_first(run.pk, "once", [f1]),
        lambda: reports.append(process_batch(run.pk, "once", None)),
        waiting="the batch waiting on the other's F1",
    )
    # Then its output holds F2 and F3, once each, and the stage kept all three once
    assert [r.segments for r in reports] == [1]
    (output,) = Segment.objects.filter(run=run, node="agg")
    ids = sorted(json.loads(line)["id"] for line in Path(output.path).read_text().splitlines())
    assert ids == ["F2", "F3"]
    assert SeenRecord.objects.filter(run=run).count() == 3
