"""The deduplicate operator on Spark (sparkjobs/dedup.py): of a batch's records equal in
their fields one goes on, each line with its identity (the worker drops those the run
kept already: tests/orchestrator/worker/test_dedup_batch.py); the plain job's drop over
the whole input keeps one of each the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkjobs.dedup import dedup_batch
from sparkjobs.identity import digest_of, distinct

pytestmark = pytest.mark.spark

FIELDS = ["flight", "day"]


def _segments(tmp_path: Path, records: dict[str, list[Any]]) -> dict[str, Path]:
    found = {}
    for name, lines in records.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        found[name] = path
    return found


def test_a_batch_keeps_one_record_of_each_identity_each_line_with_its_own(
    spark: Any, tmp_path: Path
) -> None:
    # Given two segments: UA1 on day 1 twice (once in each), AA7 twice in the second,
    # DL3 on two days, and a line that is not JSON
    inputs = _segments(
        tmp_path,
        {
            "seg-1": [{"flight": "UA1", "day": 1, "delay": 5}, {"flight": "DL3", "day": 1}],
            "seg-2": [
                {"flight": "AA7", "day": 1, "delay": 2},
                {"flight": "UA1", "day": 1, "delay": 5},
                {"flight": "AA7", "day": 1, "delay": 2},
                {"flight": "DL3", "day": 2},
                "not json",
            ],
        },
    )
    outputs = {name: tmp_path / f"{name}.out.jsonl" for name in inputs}
    # When the batch runs
    results = dedup_batch(spark, "deduplicate", {"fields": FIELDS}, inputs, outputs)
    # Then each identity goes on once, in the first segment that has it...
    written = {
        name: [json.loads(line) for line in out.read_text().splitlines()]
        for name, out in outputs.items()
    }
    by_text = {
        n: sorted(rows, key=lambda r: json.dumps(r, sort_keys=True)) for n, rows in written.items()
    }
    assert by_text == {
        "seg-1": [{"day": 1, "delay": 5, "flight": "UA1"}, {"day": 1, "flight": "DL3"}],
        "seg-2": [{"day": 1, "delay": 2, "flight": "AA7"}, {"day": 2, "flight": "DL3"}],
    }
    # ...each line with its identity, the digest of its fields
    for name, rows in written.items():
        frame = spark.createDataFrame(
            [(r["flight"], r["day"]) for r in rows], "flight string, day long"
        )
        digests = [r[0] for r in frame.select(digest_of(frame, FIELDS)).collect()]
        assert results[name].identities == digests
    # ...and every record is counted as read by its segment, the line that is not JSON apart
    assert (results["seg-1"].records, results["seg-2"].records) == (2, 4)
    assert results["seg-2"].malformed == 1 and results["seg-2"].quarantined == ["not json"]


def test_the_plain_job_keeps_one_record_of_each_identity_over_the_whole_input(
    spark: Any,
) -> None:
    rows = [("UA1", 1, 5.0), ("UA1", 1, 5.0), ("UA1", 2, 1.0)]
    rows += [("AA7", None, 2.0), ("AA7", None, 3.0)]
    frame = spark.createDataFrame(rows, "flight string, day long, delay double")
    left = sorted(tuple(r) for r in distinct(frame, FIELDS).collect())
    # one of the two AA7 without a day, Spark's choice
    assert left[1:] == [("UA1", 1, 5.0), ("UA1", 2, 1.0)]
    assert left[0] in {("AA7", None, 2.0), ("AA7", None, 3.0)}
    # a field no record has is null in each: all records are one identity on it alone
    assert distinct(frame, ["gate"]).count() == 1
    assert distinct(frame, ["gate"]).columns == frame.columns
