"""The Spark operators against an oracle written in plain Python (not the code under test)."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkjobs.aggregate import AggregateParams, partial_aggregate
from sparkjobs.merge import combine_partials
from sparkjobs.plain_job import batch_aggregate
from sparkjobs.transform import record_batch

pytestmark = pytest.mark.spark

GOOD = [
    {"key": "a", "value": 1.5, "user": "u1"},
    {"key": "a", "value": 0.1, "user": "u2"},
    {"key": "a", "value": 0.2, "user": "u1"},
    {"key": "b", "value": -3, "user": "u3"},
    {"key": "b", "value": 1e6, "user": "u3"},
    {"key": "c", "value": "7.25", "user": "u9"},  # a numeric string counts as a number
]
BAD = [
    "not json",
    '{"key": "a", "user": "u1"}',
    '{"key": "a", "value": "x", "user": "u"}',
    '{"value": 1, "user": "u"}',
    "[1, 2, 3]",
]


def oracle(records: list[dict[str, Any]]) -> dict[str, tuple[int, Decimal, Decimal, Decimal, int]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[record["key"]].append(record)
    result = {}
    for key, rows in groups.items():
        values = [Decimal(str(r["value"])) for r in rows]
        users = {r["user"] for r in rows}
        result[key] = (len(rows), sum(values), min(values), max(values), len(users))
    return result


def write_segments(folder: Path) -> dict[str, Path]:
    # Records split over three segments, malformed lines mixed in.
    lines = [json.dumps(r) for r in GOOD] + BAD
    order = [0, 6, 1, 7, 2, 3, 8, 4, 9, 5, 10]
    segments = {}
    for index, chunk in enumerate([order[0:4], order[4:8], order[8:]]):
        path = folder / f"seg{index}.jsonl"
        path.write_text("".join(lines[i] + "\n" for i in chunk))
        segments[f"seg{index}"] = path
    return segments


def test_partials_merged_equal_the_oracle(spark: Any, tmp_path: Path) -> None:
    inputs = write_segments(tmp_path)
    outputs = {seg: tmp_path / "out" / f"{seg}.p.jsonl" for seg in inputs}
    produced = partial_aggregate(spark, inputs, outputs, AggregateParams())
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    assert sum(p.records for p in produced.values()) == len(GOOD)
    # Each malformed line is quarantined with the segment it came from.
    assert {seg: sorted(p.quarantined) for seg, p in produced.items()} == {
        "seg0": sorted(BAD[0:2]),
        "seg1": [BAD[2]],
        "seg2": sorted(BAD[3:5]),
    }
    merged = {m.key: m for m in combine_partials(list(outputs.values()))}
    expected = oracle(GOOD)
    assert set(merged) == set(expected)
    for key, (count, total, low, high, distinct) in expected.items():
        got = merged[key]
        assert (got.count, got.sum, got.min, got.max, len(got.distinct)) == (
            count,
            total,
            low,
            high,
            distinct,
        )


def test_batch_job_equals_the_oracle(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD) + "".join(b + "\n" for b in BAD))
    result = batch_aggregate(spark, [str(path)], "jsonl", AggregateParams())
    assert result.malformed == len(BAD)
    assert result.records == len(GOOD)
    got = {r.key: (r.count, r.sum, r.min, r.max, r.distinct) for r in result.rows}
    assert got == oracle(GOOD)


def test_filter_then_batch_matches_filtering_first(spark: Any, tmp_path: Path) -> None:
    segments = write_segments(tmp_path)
    outputs = {seg: tmp_path / "f" / f"{seg}.jsonl" for seg in segments}
    produced = record_batch(spark, "filter", {"condition": "user <> 'u3'"}, segments, outputs)
    kept = [json.loads(line) for out in outputs.values() for line in out.read_text().splitlines()]
    assert {r["user"] for r in kept if "user" in r} >= {"u1", "u2"}
    assert all(r.get("user") != "u3" for r in kept)
    assert sum(p.malformed for p in produced.values()) == 2  # "not json" and "[1, 2, 3]"
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    filtered = batch_aggregate(
        spark, [str(path)], "jsonl", AggregateParams(), [("filter", {"condition": "user <> 'u3'"})]
    )
    got = {r.key: (r.count, r.sum, r.min, r.max, r.distinct) for r in filtered.rows}
    assert got == oracle([r for r in GOOD if r["user"] != "u3"])


# Each line, the good records it holds and how many malformed ones: a line means what
# it means to Spark's JSON reader, which the batch job and the operators both use.
LINES: list[tuple[str, list[dict[str, Any]], int]] = [
    ('[{"key": "b", "value": 2, "user": "u7"}]', [{"key": "b", "value": 2, "user": "u7"}], 0),
    ("[]", [], 0),
    ("   ", [], 0),
    (
        '[{"key": "d", "value": 3, "user": "u1"}, {"key": "e"}]',
        [{"key": "d", "value": 3, "user": "u1"}],
        1,
    ),
    ('[{"key": "c"}, {"value": 1}]', [], 2),
    ('{"key": "f", "value": null, "user": "u"}', [], 1),
    ("{}", [], 1),
    ('{"key": "g", "value": "x"}', [], 1),  # not a number, and a field missing: once
    ('{"key": "h", "value": 1e400, "user": "u"}', [], 1),  # beyond DECIMAL(38,10)
    (
        '{"key": "i", "value": "7.25", "user": "u2"}',
        [{"key": "i", "value": "7.25", "user": "u2"}],
        0,
    ),
    ('"a string"', [], 1),
    ("null", [], 1),
    # Hostile: nesting past the parser's limit, a number of 2,000 digits
    ('{"key": "j", "value": 1, "user": "u", "pad": ' + "[" * 3000 + "]" * 3000 + "}", [], 1),
    ('{"key": "k", "value": ' + "9" * 2000 + ', "user": "u"}', [], 1),
]


def test_each_line_holds_the_records_spark_reads_and_bad_ones_are_quarantined_once(
    spark: Any, tmp_path: Path
) -> None:
    halves = [LINES[0::2], LINES[1::2]]
    inputs = {}
    for index, half in enumerate(halves):
        path = tmp_path / f"seg{index}.jsonl"
        path.write_text("".join(line + "\n" for line, _, _ in half))
        inputs[f"seg{index}"] = path
    outputs = {seg: tmp_path / "out" / f"{seg}.jsonl" for seg in inputs}
    good = [record for _, records, _ in LINES for record in records]
    # The operator: each malformed record's line quarantined once per record, in its segment
    produced = partial_aggregate(spark, inputs, outputs, AggregateParams())
    for index, half in enumerate(halves):
        out = produced[f"seg{index}"]
        assert sorted(out.quarantined) == sorted(line for line, _, bad in half for _ in range(bad))
        assert out.malformed == sum(bad for _, _, bad in half)
    merged = {m.key: m for m in combine_partials(list(outputs.values()))}
    assert {k: (m.count, m.sum, m.min, m.max, len(m.distinct)) for k, m in merged.items()} == (
        oracle(good)
    )
    # The batch job: the same records, the same malformed count
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(line + "\n" for line, _, _ in LINES))
    result = batch_aggregate(spark, [str(whole)], "jsonl", AggregateParams())
    assert result.malformed == sum(bad for _, _, bad in LINES)
    assert {r.key: (r.count, r.sum, r.min, r.max, r.distinct) for r in result.rows} == oracle(good)
