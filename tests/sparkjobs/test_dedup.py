"""The deduplicate operator on Spark (sparkjobs/dedup.py): of a batch's records equal in
their fields one goes on, the same one whatever the batch's order; one the run kept
already goes on nowhere; the plain job's drop over the whole input keeps the same."""

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


def _run(spark: Any, tmp_path: Path, inputs: dict[str, Path], seen: set[str]) -> Any:
    outputs = {name: tmp_path / "out" / f"{name}.jsonl" for name in inputs}
    (tmp_path / "out").mkdir(exist_ok=True)
    asked: list[list[str]] = []

    def kept_already(digests: Any) -> set[str]:
        asked.append(list(digests))
        return seen & set(digests)

    results, kept = dedup_batch(spark, {"fields": FIELDS}, inputs, outputs, seen=kept_already)
    written = {
        name: sorted(
            (json.loads(line) for line in out.read_text().splitlines()),
            key=lambda r: json.dumps(r, sort_keys=True),
        )
        for name, out in outputs.items()
    }
    return results, kept, written, asked


def test_a_batch_keeps_one_record_of_each_identity_and_none_the_run_kept_already(
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
    frame = spark.createDataFrame([("DL3", 2)], "flight string, day long")
    (dl3_day2,) = [r[0] for r in frame.select(digest_of(frame, FIELDS)).collect()]
    # When the batch runs, the run having kept DL3 on day 2 already
    results, kept, written, asked = _run(spark, tmp_path, inputs, {dl3_day2})
    # Then each other identity goes on once, in the first segment that has it
    assert written == {
        "seg-1": [{"day": 1, "delay": 5, "flight": "UA1"}, {"day": 1, "flight": "DL3"}],
        "seg-2": [{"day": 1, "delay": 2, "flight": "AA7"}],
    }
    assert len(kept) == 3 and dl3_day2 not in kept
    assert len(asked) == 1 and len(asked[0]) == 4
    # ...every record is counted as read by its segment, the line that is not JSON apart
    assert (results["seg-1"].records, results["seg-2"].records) == (2, 4)
    assert results["seg-2"].malformed == 1 and results["seg-2"].quarantined == ["not json"]


def test_the_plain_job_keeps_one_record_of_each_identity_as_a_batch_does(
    spark: Any, tmp_path: Path
) -> None:
    rows = [
        ("UA1", 1, 5.0),
        ("UA1", 1, 5.0),
        ("UA1", 2, 1.0),
        ("AA7", None, 2.0),
        ("AA7", None, 3.0),
    ]
    frame = spark.createDataFrame(rows, "flight string, day long, delay double")
    left = sorted(tuple(r) for r in distinct(frame, FIELDS).collect())
    # the least by its whole text of the two AA7 without a day
    assert left == [("AA7", None, 2.0), ("UA1", 1, 5.0), ("UA1", 2, 1.0)]
