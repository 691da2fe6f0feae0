"""A deduplicate stage's batch on the real PostgreSQL and Spark: when another batch keeps
one of its records between the batch's question to the ledger and its commit, nothing of
it is written and its segments go back at once; run again, it drops that record."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from orchestrator.ledger import seen
from orchestrator.models import Run, SeenRecord, Segment
from orchestrator.rescale.start import ensure_instances
from orchestrator.worker.batch import process_batch
from tests.orchestrator.run.scenarios import deduplicated_flights
from tests.orchestrator.runs import queue_segments

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_batch_whose_record_another_batch_kept_meanwhile_runs_again_without_it(
    spark: Any, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
    (segment,) = queue_segments(run, [flights], node="once")
    # Given another batch that keeps F1 right after this batch asked what was kept
    asked = seen.already_kept

    def then_another_keeps_the_first(run_id: int, stage: str, digests: Sequence[str]) -> set[str]:
        found = asked(run_id, stage, digests)
        first = min(digests)
        with transaction.atomic():
            seen.keep(run_id, stage, [first])
        return found

    monkeypatch.setattr(seen, "already_kept", then_another_keeps_the_first)
    # When the batch commits, it is refused, nothing of it written, its segment back
    with pytest.raises(seen.KeptMeanwhileError, match="1 of the batch's records"):
        process_batch(run.pk, "once", None)
    assert Segment.objects.get(pk=segment).state == Segment.State.QUEUED
    assert not Segment.objects.filter(run=run, node="agg").exists()
    assert SeenRecord.objects.filter(run=run).count() == 1
    # Then run again it lets through the two records not kept, each once
    monkeypatch.setattr(seen, "already_kept", asked)
    report = process_batch(run.pk, "once", None)
    assert report.segments == 1
    (output,) = Segment.objects.filter(run=run, node="agg")
    ids = sorted(json.loads(line)["id"] for line in Path(output.path).read_text().splitlines())
    assert len(ids) == 2 and len(set(ids)) == 2
    assert SeenRecord.objects.filter(run=run).count() == 3
