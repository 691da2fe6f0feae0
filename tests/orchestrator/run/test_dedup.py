"""A pipeline that drops redelivered records before it aggregates (a `deduplicate`
stage): through a killed Spark worker and a hot migration of the stage, every flight
counts once, and the result equals the plain Spark job's over the same input."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import SeenRecord
from tests.orchestrator.run.scenarios import (
    completes_like_the_batch_job,
    deduplicated_flights,
    input_folder,
    kill_a_batch_and_hot_migrate,
    policy,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def _redelivered(path: Path, flights: int, *, seed: int) -> None:
    """Flights, each with its id; a third of them delivered twice, the copy far behind
    the first (in another segment), and a line that is not JSON now and then."""
    rng = random.Random(seed)
    lines = [
        json.dumps(
            {
                "id": f"F{i}",
                "carrier": rng.choice(["UA", "AA", "B6"]),
                "origin": rng.choice(["JFK", "LGA", "EWR"]),
                "delay": round(rng.uniform(-20, 300), 1),
            }
        )
        for i in range(flights)
    ]
    again = lines[::3]
    with path.open("w") as out:
        for i, line in enumerate([*lines, *again]):
            out.write(("not json\n" if i % 997 == 0 else "") + line + "\n")


def test_redelivered_records_count_once_through_a_kill_and_a_migration(
    workers: Any, settings: Any, tmp_path: Path
) -> None:
    # Given 30,000 flights, 10,000 of them delivered a second time further on
    root = input_folder(settings, tmp_path, data=False)
    _redelivered(root / "flights.jsonl", 30_000, seed=5)
    run = start(deduplicated_flights(), policy(), input_path=str(root / "flights.jsonl"))
    # When a Spark worker is killed holding a batch, and the stage is hot-migrated
    kill_a_batch_and_hot_migrate(run, workers, node="once")
    # Then the run equals the plain job, which drops the copies over the whole input...
    result = completes_like_the_batch_job(run)
    # ...each flight counted once, and the stage remembers each flight once
    assert sum(r["flights"] for r in result["rows"]) == 30_000
    assert result["malformed_records"] == 41
    assert SeenRecord.objects.filter(run=run).count() == 30_000
