"""The Spark operators against an oracle written in plain Python (not the code under test)."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkjobs.aggregate import AggregateParams, partial_aggregate
from sparkjobs.merge import combine_partials
from sparkjobs.plain_job import batch_aggregate
from sparkjobs.schemas import INPUT_SCHEMA, declared_ddl
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


def merged_totals(paths: list[Path]) -> dict[str, tuple[int, Decimal, Decimal, Decimal, int]]:
    """The partials in ``paths`` merged, per key as the oracle gives it."""
    return {m.key: (m.count, m.sum, m.min, m.max, len(m.distinct)) for m in combine_partials(paths)}


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


@pytest.mark.parametrize(
    ("one_task_mb", "stages"),
    [pytest.param(None, 1, id="small batch, one task"), pytest.param("0", 2, id="in parallel")],
)
def test_partials_merged_equal_the_oracle(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_task_mb: str | None,
    stages: int,
) -> None:
    # A batch of at most BPCONSOLE_SPARK_ONE_TASK_MB (2 MB by default) is aggregated in
    # one task, with no exchange (each job one stage); a larger one reads and groups in
    # two, the sets built per task and united after one exchange. Both give the
    # oracle's result.
    if one_task_mb is None:
        monkeypatch.delenv("BPCONSOLE_SPARK_ONE_TASK_MB", raising=False)
    else:
        monkeypatch.setenv("BPCONSOLE_SPARK_ONE_TASK_MB", one_task_mb)
    inputs = write_segments(tmp_path)
    outputs = {seg: tmp_path / "out" / f"{seg}.p.jsonl" for seg in inputs}
    group = f"partials-{one_task_mb}"
    spark.sparkContext.setJobGroup(group, "partials")
    try:
        produced = partial_aggregate(spark, inputs, outputs, AggregateParams())
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    assert max(len(job.stageIds) for job in jobs) == stages
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    assert sum(p.records for p in produced.values()) == len(GOOD)
    # Each malformed line is quarantined with the segment it came from.
    assert {seg: sorted(p.quarantined) for seg, p in produced.items()} == {
        "seg0": sorted(BAD[0:2]),
        "seg1": [BAD[2]],
        "seg2": sorted(BAD[3:5]),
    }
    assert merged_totals(list(outputs.values())) == oracle(GOOD)


@pytest.mark.parametrize(
    "together",
    [
        pytest.param({"seg0": "seg0", "seg1": "seg0", "seg2": "seg0"}, id="all in one"),
        pytest.param({"seg0": "seg0", "seg1": "seg1", "seg2": "seg0"}, id="two holders"),
    ],
)
def test_segments_named_together_leave_one_partial_in_their_holder(
    spark: Any, tmp_path: Path, together: dict[str, str]
) -> None:
    # Segments going to the same place are aggregated as one: their holder's output has
    # one line per key, equal to the oracle over their records, and theirs are empty.
    # Malformed lines are still counted and quarantined where they came from.
    inputs = write_segments(tmp_path)
    outputs = {seg: tmp_path / "out" / f"{seg}.p.jsonl" for seg in inputs}
    produced = partial_aggregate(spark, inputs, outputs, AggregateParams(), together=together)
    good_lines = {json.dumps(r) for r in GOOD}
    good_of = {
        seg: [json.loads(line) for line in path.read_text().splitlines() if line in good_lines]
        for seg, path in inputs.items()
    }
    for holder in set(together.values()):
        records = [r for seg, held in together.items() if held == holder for r in good_of[seg]]
        lines = [json.loads(line) for line in outputs[holder].read_text().splitlines()]
        assert sorted(line["key"] for line in lines) == sorted({r["key"] for r in records})
        assert merged_totals([outputs[holder]]) == oracle(records)
        assert produced[holder].records == len(records)
    for seg in set(inputs) - set(together.values()):
        assert outputs[seg].read_bytes() == b""
        assert (produced[seg].records, produced[seg].bytes) == (0, 0)
    assert {seg: sorted(p.quarantined) for seg, p in produced.items()} == {
        "seg0": sorted(BAD[0:2]),
        "seg1": [BAD[2]],
        "seg2": sorted(BAD[3:5]),
    }
    assert {seg: p.malformed for seg, p in produced.items()} == {"seg0": 2, "seg1": 1, "seg2": 2}


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


def test_a_value_its_declared_type_cannot_take_is_a_malformed_record_not_a_failed_batch(
    spark: Any, tmp_path: Path
) -> None:
    # Given records of a source declaring value a double, one of them holding a text
    lines = [
        '{"key": "a", "value": 2.5, "user": "u1"}',
        '{"key": "a", "value": "late", "user": "u2"}',
        '{"key": "b", "value": -1, "user": "u3"}',
    ]
    segment = tmp_path / "s0.jsonl"
    segment.write_text("".join(line + "\n" for line in lines))
    schema = declared_ddl("key string, value double, user string")
    params = {"condition": "value >= 0", INPUT_SCHEMA: schema}
    # When a filter comparing it with a number reads the batch
    outputs = {"s0": tmp_path / "out.jsonl"}
    produced = record_batch(spark, "filter", params, {"s0": segment}, outputs)
    # Then the record is malformed and quarantined, and the others are filtered
    assert produced["s0"].malformed == 1
    assert produced["s0"].quarantined == [lines[1]]
    kept = [json.loads(line) for line in outputs["s0"].read_text().splitlines()]
    assert kept == [{"key": "a", "value": 2.5, "user": "u1"}]
    # ...as the plain job counts it
    result = batch_aggregate(
        spark,
        [str(segment)],
        "jsonl",
        AggregateParams(),
        [("filter", {"condition": "value >= 0"})],
        schema=schema,
    )
    assert result.malformed == 1 and result.records == 1


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
    # Text the result could not keep (PostgreSQL's text holds no NUL; a key is indexed,
    # at most 500 characters): malformed, not a sink batch that never commits. The
    # separator and "" are values.
    ('{"key": "l", "value": 1, "user": "a\\u0000b"}', [], 1),
    ('{"key": "m\\u0000", "value": 1, "user": "u"}', [], 1),
    (json.dumps({"key": "n" * 501, "value": 1, "user": "u"}), [], 1),
    # Characters, not bytes: 500 two-byte characters are a key, 501 are not.
    (
        json.dumps({"key": "é" * 500, "value": 1, "user": "u"}, ensure_ascii=False),
        [{"key": "é" * 500, "value": 1, "user": "u"}],
        0,
    ),
    (json.dumps({"key": "é" * 501, "value": 1, "user": "u"}, ensure_ascii=False), [], 1),
    (
        json.dumps({"key": "o", "value": 1, "user": "u" * 3000}),
        [{"key": "o", "value": 1, "user": "u" * 3000}],
        0,
    ),  # a distinct value of any length is kept: only a key is indexed
    (
        json.dumps([{"key": "p" * 500, "value": 1, "user": "\x1f"}, {"key": "p", "user": ""}]),
        [{"key": "p" * 500, "value": 1, "user": "\x1f"}],
        1,
    ),
    (
        json.dumps({"key": "q", "value": 2, "user": ""}),
        [{"key": "q", "value": 2, "user": ""}],
        0,
    ),
]


def test_each_line_holds_the_records_spark_reads_and_bad_ones_are_quarantined_once(
    spark: Any, tmp_path: Path
) -> None:
    operator_and_batch_agree_with_the_table(spark, tmp_path, LINES, fmt="jsonl")


def operator_and_batch_agree_with_the_table(
    spark: Any,
    folder: Path,
    table: list[tuple[str, list[dict[str, Any]], int]],
    *,
    fmt: str,
    head: str = "",
) -> None:
    """Half the table's lines in each of two segments (after ``head``, a CSV header),
    then all of them in one input file. The operator quarantines each malformed record's
    line once per record, in its segment, whether each segment holds its own partials
    or both are aggregated together (each plan of ``_per_group``); its merged partials
    and the batch job all equal the oracle over the good records, with the same
    malformed count."""
    halves = [table[0::2], table[1::2]]
    inputs = {}
    for index, half in enumerate(halves):
        path = folder / f"seg{index}.{fmt}"
        path.write_text(head + "".join(line + "\n" for line, _, _ in half))
        inputs[f"seg{index}"] = path
    good = [record for _, records, _ in table for record in records]
    for plan, together in {"own": None, "together": {"seg0": "seg0", "seg1": "seg0"}}.items():
        outputs = {seg: folder / plan / f"{seg}.jsonl" for seg in inputs}
        produced = partial_aggregate(spark, inputs, outputs, AggregateParams(), together=together)
        for index, half in enumerate(halves):
            out = produced[f"seg{index}"]
            bad_lines = sorted(line for line, _, bad in half for _ in range(bad))
            assert sorted(out.quarantined) == bad_lines, plan
            assert out.malformed == sum(bad for _, _, bad in half), plan
        merged = {m.key: m for m in combine_partials(list(outputs.values()))}
        assert {k: (m.count, m.sum, m.min, m.max, len(m.distinct)) for k, m in merged.items()} == (
            oracle(good)
        ), plan
    # The batch job is told the format: the input file's name may be anything
    whole = folder / "whole.txt"
    whole.write_text(head + "".join(line + "\n" for line, _, _ in table))
    result = batch_aggregate(spark, [str(whole)], fmt, AggregateParams())
    assert result.malformed == sum(bad for _, _, bad in table)
    assert {r.key: (r.count, r.sum, r.min, r.max, r.distinct) for r in result.rows} == oracle(good)


CSV_HEADER = "user,key,value,pad"
CSV_LINES: list[tuple[str, list[dict[str, Any]], int]] = [
    ("u1,a,1.5,x", [{"key": "a", "value": "1.5", "user": "u1"}], 0),
    ('"u,2",a,"7.25",x', [{"key": "a", "value": "7.25", "user": "u,2"}], 0),  # quoted
    ("u3,b,2", [{"key": "b", "value": "2", "user": "u3"}], 0),  # a field not needed: absent
    ("u4,b,1e3,x,extra", [{"key": "b", "value": "1e3", "user": "u4"}], 0),  # past the header
    ("", [], 0),
    ('u5,a,"1,000",x', [], 1),  # not a number (the CSV reader's own parsing took 1000)
    ("u6,c", [], 1),  # too few fields
    (",c,4,x", [], 1),  # an empty field is a missing one
    ("u7,d,x,x", [], 1),
    ("u8,d," + "9" * 2000 + ",x", [], 1),  # beyond DECIMAL(38,10)
    ('"u9,d,1,x', [], 1),  # an unclosed quote runs to the end of the line: one field
    ("u10," + "e" * 501 + ",1,x", [], 1),  # a key the result could not keep
    ("v" * 600 + ",e,1,x", [{"key": "e", "value": "1", "user": "v" * 600}], 0),
    ("u\x0011,e,1,x", [], 1),
]


def test_csv_segments_are_read_by_their_header_and_bad_lines_quarantined(
    spark: Any, tmp_path: Path
) -> None:
    operator_and_batch_agree_with_the_table(
        spark, tmp_path, CSV_LINES, fmt="csv", head=CSV_HEADER + "\n"
    )


def test_parquet_segments_keep_their_types_and_a_bad_row_is_quarantined_as_json(
    spark: Any, tmp_path: Path
) -> None:
    rows: list[dict[str, Any]] = [
        {"key": "a", "value": "1.5", "user": "u1", "n": 1},
        {"key": "a", "value": "x", "user": "u2", "n": 2},
        {"key": "b", "value": None, "user": "u3", "n": 3},
        {"key": "b", "value": "-2", "user": "u3", "n": 4},
    ]
    inputs = {}
    for index in range(2):
        path = tmp_path / f"seg{index}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[index * 2 : index * 2 + 2]), path)
        inputs[f"seg{index}"] = path
    outputs = {seg: tmp_path / "out" / f"{seg}.jsonl" for seg in inputs}
    produced = partial_aggregate(spark, inputs, outputs, AggregateParams())
    assert produced["seg0"].quarantined == ['{"key":"a","value":"x","user":"u2","n":2}']
    assert produced["seg1"].quarantined == ['{"key":"b","user":"u3","n":3}']
    merged = {m.key: m for m in combine_partials(list(outputs.values()))}
    expected = oracle([rows[0], rows[3]])
    assert {k: (m.count, m.sum, m.min, m.max, len(m.distinct)) for k, m in merged.items()} == (
        expected
    )
    result = batch_aggregate(spark, [str(p) for p in inputs.values()], "parquet", AggregateParams())
    assert result.malformed == 2
    assert {r.key: (r.count, r.sum, r.min, r.max, r.distinct) for r in result.rows} == expected


def test_a_filter_over_csv_segments_of_two_headers_writes_their_records_as_json(
    spark: Any, tmp_path: Path
) -> None:
    # Two inputs name the same columns in another order: each segment is read by its own
    # header, and the records come out the same.
    inputs = {"seg0": tmp_path / "seg0.csv", "seg1": tmp_path / "seg1.csv"}
    inputs["seg0"].write_text("key,value,user\na,1,u1\nb,2,u3\n")
    # A header names columns however it likes: a dot, a backquote, a space
    inputs["seg1"].write_text('user,key,value,a.b `c` d\nu2,c,"3,5",x\nu3,d,4,y\n')
    outputs = {seg: tmp_path / "f" / f"{seg}.jsonl" for seg in inputs}
    produced = record_batch(spark, "filter", {"condition": "user <> 'u3'"}, inputs, outputs)
    assert [json.loads(line) for line in outputs["seg0"].read_text().splitlines()] == [
        {"key": "a", "value": "1", "user": "u1"}
    ]
    assert [json.loads(line) for line in outputs["seg1"].read_text().splitlines()] == [
        {"user": "u2", "key": "c", "value": "3,5", "a.b `c` d": "x"}
    ]
    # Each segment's records are those its operator took from it, kept or not.
    assert [p.records for p in produced.values()] == [2, 2]
