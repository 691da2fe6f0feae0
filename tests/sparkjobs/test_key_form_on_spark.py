"""The key form of an aggregating stage (key, value and user: sparkjobs/key_form.py) on
Spark, as the grouped measures it is read as (sparkjobs/grouped.py), against an oracle
written in plain Python (not the code under test): its partials, merged as the sink
merges them, and the plain job both equal the oracle. A line that is no record, and a
record missing its key, value or user, is malformed: counted and quarantined in the
segment it came from, once per record, as its line was written (a Parquet row as its
fields, in JSON)."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkjobs.grouped import aggregate_batch, grouped_partials
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup, group_slot
from sparkjobs.measures import Grouping
from sparkjobs.merge import combine_groups
from sparkjobs.outputs import PartialOutput
from sparkjobs.plain_job import GroupedResult, batch_grouped
from sparkjobs.schemas import INPUT_SCHEMA, declared_ddl
from sparkjobs.transform import record_batch

pytestmark = pytest.mark.spark


def _key_form() -> Grouping:
    grouping = Grouping.of({})  # the reference pipeline's: key, value and user
    assert grouping is not None
    return grouping


KEY_FORM = _key_form()
Totals = dict[tuple[str | None, ...], dict[str, Any]]

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
# What is quarantined of each BAD line: the line as it was written
QUARANTINED = list(BAD)


def oracle(records: Sequence[dict[str, Any]]) -> Totals:
    """Per key: the count, sum, min, max and average of the value and the distinct
    users, as the form's measures name them."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[record["key"]].append(record)
    result: Totals = {}
    for key, rows in groups.items():
        values = [Decimal(str(r["value"])) for r in rows]
        total = sum(values, Decimal(0))
        result[(key,)] = {
            "count": len(rows),
            "sum": total,
            "min": min(values),
            "max": max(values),
            "avg": total / len(values),
            "distinct_users": len({r["user"] for r in rows}),
        }
    return result


def merged(paths: Sequence[Path]) -> Totals:
    """The partials in ``paths`` merged as the sink merges them, each group finished."""
    return {p.group: KEY_FORM.finish(p.states) for p in combine_groups(KEY_FORM, list(paths))}


def partials(
    spark: Any,
    inputs: dict[str, Path],
    outputs: dict[str, Path],
    *,
    together: dict[str, str] | None = None,
) -> dict[str, PartialOutput]:
    """The batch job of an ``aggregate`` stage of no parameters: the key form."""
    return aggregate_batch(
        spark, "aggregate", {}, inputs, outputs, key_group=None, together=together
    )


def plain(
    spark: Any,
    paths: Sequence[Path],
    fmt: str,
    steps: Sequence[tuple[str, Any]] = (),
    *,
    schema: str | None = None,
) -> GroupedResult:
    return batch_grouped(spark, [str(p) for p in paths], fmt, KEY_FORM, steps, schema=schema)


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


QUARANTINED_BY_SEGMENT = {
    "seg0": sorted(QUARANTINED[0:2]),
    "seg1": [QUARANTINED[2]],
    "seg2": sorted(QUARANTINED[3:5]),
}


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
        produced = partials(spark, inputs, outputs)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    assert jobs
    assert max(len(job.stageIds) for job in jobs) == stages
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    assert sum(p.records for p in produced.values()) == len(GOOD)
    # Each malformed line is quarantined with the segment it came from.
    assert {seg: sorted(p.quarantined) for seg, p in produced.items()} == QUARANTINED_BY_SEGMENT
    assert merged(list(outputs.values())) == oracle(GOOD)


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
    produced = partials(spark, inputs, outputs, together=together)
    good_lines = {json.dumps(r) for r in GOOD}
    good_of = {
        seg: [json.loads(line) for line in path.read_text().splitlines() if line in good_lines]
        for seg, path in inputs.items()
    }
    holders = set(together.values())
    assert holders
    for holder in holders:
        records = [r for seg, held in together.items() if held == holder for r in good_of[seg]]
        lines = [json.loads(line) for line in outputs[holder].read_text().splitlines()]
        assert sorted(line["g"] for line in lines) == sorted(
            [k] for k in {r["key"] for r in records}
        )
        assert merged([outputs[holder]]) == oracle(records)
        assert produced[holder].records == len(records)
    for seg in set(inputs) - holders:
        assert outputs[seg].read_bytes() == b""
        assert (produced[seg].records, produced[seg].bytes) == (0, 0)
    assert {seg: sorted(p.quarantined) for seg, p in produced.items()} == QUARANTINED_BY_SEGMENT
    assert {seg: p.malformed for seg, p in produced.items()} == {"seg0": 2, "seg1": 1, "seg2": 2}


def test_the_plain_job_equals_the_oracle(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD) + "".join(b + "\n" for b in BAD))
    result = plain(spark, [path], "jsonl")
    assert result.malformed == len(BAD)
    assert result.records == len(GOOD)
    assert dict(result.rows) == oracle(GOOD)


def test_a_record_missing_its_key_value_or_user_is_malformed_where_unrequired_it_is_null(
    spark: Any, tmp_path: Path
) -> None:
    # Given records missing their value, their user (null) and their key
    lines = [
        '{"key": "a", "value": 2, "user": "u1"}',
        '{"key": "a", "user": "u2"}',
        '{"key": "a", "value": 3, "user": null}',
        '{"value": 4, "user": "u1"}',
        '[{"key": "b", "value": 5, "user": "u1"}, {"key": "b", "value": 6}]',
    ]
    inputs = {"s0": tmp_path / "s0.jsonl"}
    inputs["s0"].write_text("".join(line + "\n" for line in lines))
    # When the key form aggregates them
    outputs = {"s0": tmp_path / "form.jsonl"}
    produced = grouped_partials(spark, inputs, outputs, KEY_FORM)
    # Then each of those records is malformed, quarantined as its line was written
    assert produced["s0"].malformed == 4
    assert sorted(produced["s0"].quarantined) == sorted(lines[1:])
    two_good = [lines[0], json.dumps(json.loads(lines[4])[0])]
    assert merged(list(outputs.values())) == oracle([json.loads(line) for line in two_good])
    assert produced["s0"].records == 2
    # ...as the plain job counts them
    result = plain(spark, list(inputs.values()), "jsonl")
    assert (result.malformed, result.records) == (4, 2)
    # ...where the same measures requiring nothing read a missing field as null, as SQL
    nothing_required = dataclasses.replace(KEY_FORM, required=())
    outputs = {"s0": tmp_path / "sql.jsonl"}
    produced = grouped_partials(spark, inputs, outputs, nothing_required)
    assert (produced["s0"].malformed, produced["s0"].records) == (0, 6)
    groups = combine_groups(nothing_required, list(outputs.values()))
    found = {p.group: nothing_required.finish(p.states) for p in groups}
    assert found == {
        (None,): {
            "count": 1,
            "sum": Decimal(4),
            "min": Decimal(4),
            "max": Decimal(4),
            "avg": Decimal(4),
            "distinct_users": 1,
        },
        ("a",): {
            "count": 3,
            "sum": Decimal(5),
            "min": Decimal(2),
            "max": Decimal(3),
            "avg": Decimal("2.5"),
            "distinct_users": 2,
        },
        ("b",): {
            "count": 2,
            "sum": Decimal(11),
            "min": Decimal(5),
            "max": Decimal(6),
            "avg": Decimal("5.5"),
            "distinct_users": 1,
        },
    }
    unrequired = batch_grouped(spark, [str(inputs["s0"])], "jsonl", nothing_required)
    assert (unrequired.malformed, unrequired.records) == (0, 6)
    assert dict(unrequired.rows) == found


def test_a_stage_of_the_form_computing_some_of_its_aggregates_equals_the_oracle(
    spark: Any, tmp_path: Path
) -> None:
    # Given a stage of the form computing the count and maximum only (no distinct users),
    # and a record without a user: malformed all the same, as the form requires it
    params = {"aggregates": ["count", "max"]}
    grouping = Grouping.of(params)
    assert grouping is not None
    inputs = {"s0": tmp_path / "s0.jsonl"}
    lines = [json.dumps(r) for r in [*GOOD, {"key": "a", "value": 99}]]
    inputs["s0"].write_text("".join(line + "\n" for line in lines))
    outputs = {"s0": tmp_path / "out.jsonl"}
    # When its partials are computed and merged
    done = aggregate_batch(spark, "aggregate", params, inputs, outputs, key_group=None)
    found = {p.group: grouping.finish(p.states) for p in combine_groups(grouping, [outputs["s0"]])}
    # Then they are the oracle's count and maximum, the record without a user malformed
    assert done["s0"].malformed == 1
    assert found == {
        group: {"count": values["count"], "max": values["max"]}
        for group, values in oracle(GOOD).items()
    }


def test_key_groups_split_the_keys_by_slot_and_together_equal_the_oracle(
    spark: Any, tmp_path: Path
) -> None:
    # Given a running stage of the key form keyed by key groups, three parts of the slots
    records = [{"key": f"k{i % 23}", "value": i / 8, "user": f"u{i % 7}"} for i in range(200)]
    inputs = {}
    for index in range(2):
        inputs[f"seg{index}"] = tmp_path / f"seg{index}.jsonl"
        lines = [json.dumps(r) for r in records[index::2]]
        inputs[f"seg{index}"].write_text("".join(line + "\n" for line in [*lines, *BAD]))
    parts = [KeyGroup(0, 40), KeyGroup(40, 90), KeyGroup(90, KEY_SLOTS)]
    produced, held = [], []
    for number, part in enumerate(parts):
        outputs = {seg: tmp_path / f"{seg}.part{number}.jsonl" for seg in inputs}
        # When each part aggregates every segment
        produced.append(aggregate_batch(spark, "running", {}, inputs, outputs, key_group=part))
        held.append(merged(list(outputs.values())))
    # Then each part holds only the keys whose slot it owns...
    for part, totals in zip(parts, held, strict=True):
        assert totals, f"part {part} holds no key"
        assert all(group_slot(group) in part.slots for group in totals), part
    # ...the parts together are the oracle...
    together = {group: values for totals in held for group, values in totals.items()}
    assert len(together) == sum(len(totals) for totals in held)
    assert together == oracle(records)
    # ...and a record is counted once: the malformed ones by the part holding slot 0
    assert [sum(p.records for p in out.values()) for out in produced] == [
        sum(values["count"] for values in totals.values()) for totals in held
    ]
    assert [sum(p.malformed for p in out.values()) for out in produced] == [2 * len(BAD), 0, 0]
    assert sorted(produced[0]["seg1"].quarantined) == sorted(QUARANTINED)


def test_filter_then_batch_matches_filtering_first(spark: Any, tmp_path: Path) -> None:
    segments = write_segments(tmp_path)
    outputs = {seg: tmp_path / "f" / f"{seg}.jsonl" for seg in segments}
    produced = record_batch(spark, "filter", {"condition": "user <> 'u3'"}, segments, outputs)
    kept = [json.loads(line) for out in outputs.values() for line in out.read_text().splitlines()]
    assert {r["user"] for r in kept if "user" in r} >= {"u1", "u2"}
    assert all(r.get("user") != "u3" for r in kept)
    assert sum(p.malformed for p in produced.values()) == 2  # "not json" and "[1, 2, 3]"
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD) + "".join(b + "\n" for b in BAD))
    filtered = plain(spark, [path], "jsonl", [("filter", {"condition": "user <> 'u3'"})])
    assert dict(filtered.rows) == oracle([r for r in GOOD if r["user"] != "u3"])
    # The filter's records missing a required field, or whose value is no number, are
    # malformed after it, as the live stage after the filter counts them
    assert filtered.malformed == len(BAD)


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
    result = plain(
        spark, [segment], "jsonl", [("filter", {"condition": "value >= 0"})], schema=schema
    )
    assert result.malformed == 1 and result.records == 1
    assert dict(result.rows) == oracle([json.loads(lines[0])])


# Each line, the good records it holds and what is quarantined of it: a line means what
# it means to Spark's JSON reader, which the plain job and the operators both use.
Case = tuple[str, list[dict[str, Any]], list[str]]


def case(text: str, *good: dict[str, Any], bad: int = 0) -> Case:
    """A line, the good records it holds and what is quarantined of it: the line itself,
    once for each of the ``bad`` malformed records it holds."""
    return text, list(good), [text] * bad


LINES: list[Case] = [
    case('[{"key": "b", "value": 2, "user": "u7"}]', {"key": "b", "value": 2, "user": "u7"}),
    case("[]"),
    case("   "),
    case(
        '[{"key": "d", "value": 3, "user": "u1"}, {"key": "e"}]',
        {"key": "d", "value": 3, "user": "u1"},
        bad=1,
    ),
    case('[{"key": "c"}, {"value": 1}]', bad=2),
    case('{"key": "f", "value": null, "user": "u"}', bad=1),
    case("{}", bad=1),
    case('{"key": "g", "value": "x"}', bad=1),  # not a number, and a field missing: once
    case('{"key": "h", "value": 1e400, "user": "u"}', bad=1),  # beyond DECIMAL(38,10)
    case(
        '{"key": "i", "value": "7.25", "user": "u2"}', {"key": "i", "value": "7.25", "user": "u2"}
    ),
    case('"a string"', bad=1),
    case("null", bad=1),
    # Hostile: nesting past the parser's limit, a number of 2,000 digits
    case('{"key": "j", "value": 1, "user": "u", "pad": ' + "[" * 3000 + "]" * 3000 + "}", bad=1),
    case('{"key": "k", "value": ' + "9" * 2000 + ', "user": "u"}', bad=1),
    # Text the result could not keep (PostgreSQL's text holds no NUL; a key is indexed,
    # at most 500 characters): malformed, not a sink batch that never commits. The
    # separator and "" are values.
    case(
        '{"key": "l", "value": 1, "user": "a\\u0000b"}',
        bad=1,
    ),
    case(
        '{"key": "m\\u0000", "value": 1, "user": "u"}',
        bad=1,
    ),
    case(
        json.dumps({"key": "n" * 501, "value": 1, "user": "u"}),
        bad=1,
    ),
    # Characters, not bytes: 500 two-byte characters are a key, 501 are not.
    case(
        json.dumps({"key": "é" * 500, "value": 1, "user": "u"}, ensure_ascii=False),
        {"key": "é" * 500, "value": 1, "user": "u"},
    ),
    case(
        json.dumps({"key": "é" * 501, "value": 1, "user": "u"}, ensure_ascii=False),
        bad=1,
    ),
    # A distinct value of any length is kept: only a key is indexed
    case(
        json.dumps({"key": "o", "value": 1, "user": "u" * 3000}),
        {"key": "o", "value": 1, "user": "u" * 3000},
    ),
    case(
        json.dumps([{"key": "p" * 500, "value": 1, "user": "\x1f"}, {"key": "p", "user": ""}]),
        {"key": "p" * 500, "value": 1, "user": "\x1f"},
        bad=1,
    ),
    case(json.dumps({"key": "q", "value": 2, "user": ""}), {"key": "q", "value": 2, "user": ""}),
]


def test_each_line_holds_the_records_spark_reads_and_bad_ones_are_quarantined_once(
    spark: Any, tmp_path: Path
) -> None:
    operator_and_batch_agree_with_the_table(spark, tmp_path, LINES, fmt="jsonl")


def operator_and_batch_agree_with_the_table(
    spark: Any, folder: Path, table: list[Case], *, fmt: str, head: str = ""
) -> None:
    """Half the table's lines in each of two segments (after ``head``, a CSV header),
    then all of them in one input file. The operator quarantines each malformed record
    once, in its segment, whether each segment holds its own partials or both are
    aggregated together (the grouped job's two plans: sets per group, or (group, user)
    pairs first); its merged partials and the plain job all equal the oracle over the
    good records, with the same malformed count."""
    halves = [table[0::2], table[1::2]]
    inputs = {}
    for index, half in enumerate(halves):
        path = folder / f"seg{index}.{fmt}"
        path.write_text(head + "".join(text + "\n" for text, _, _ in half))
        inputs[f"seg{index}"] = path
    good = [record for _, records, _ in table for record in records]
    assert good and any(bad for _, _, bad in table)
    for plan, together in {"own": None, "together": {"seg0": "seg0", "seg1": "seg0"}}.items():
        outputs = {seg: folder / plan / f"{seg}.jsonl" for seg in inputs}
        produced = partials(spark, inputs, outputs, together=together)
        for index, half in enumerate(halves):
            out = produced[f"seg{index}"]
            assert sorted(out.quarantined) == sorted(q for _, _, bad in half for q in bad), plan
            assert out.malformed == sum(len(bad) for _, _, bad in half), plan
        assert merged(list(outputs.values())) == oracle(good), plan
    # The plain job is told the format: the input file's name may be anything
    whole = folder / "whole.txt"
    whole.write_text(head + "".join(text + "\n" for text, _, _ in table))
    result = plain(spark, [whole], fmt)
    assert result.malformed == sum(len(bad) for _, _, bad in table)
    assert dict(result.rows) == oracle(good)


CSV_HEADER = "user,key,value,pad"
CSV_LINES: list[Case] = [
    case("u1,a,1.5,x", {"key": "a", "value": "1.5", "user": "u1"}),
    case('"u,2",a,"7.25",x', {"key": "a", "value": "7.25", "user": "u,2"}),  # quoted
    case("u3,b,2", {"key": "b", "value": "2", "user": "u3"}),  # a field not needed: absent
    case("u4,b,1e3,x,extra", {"key": "b", "value": "1e3", "user": "u4"}),  # past the header
    case(""),
    # Not a number (the CSV reader's own parsing took 1000)
    case('u5,a,"1,000",x', bad=1),
    case("u6,c", bad=1),  # too few fields
    case(",c,4,x", bad=1),  # an empty field is missing
    case("u7,d,x,x", bad=1),
    case("u8,d," + "9" * 2000 + ",x", bad=1),  # past DECIMAL(38,10)
    # An unclosed quote runs to the end of the line: one field
    case('"u9,d,1,x', bad=1),
    # A key the result could not keep
    case(
        "u10," + "e" * 501 + ",1,x",
        bad=1,
    ),
    case("v" * 600 + ",e,1,x", {"key": "e", "value": "1", "user": "v" * 600}),
    case("u\x0011,e,1,x", bad=1),
]


def test_csv_segments_are_read_by_their_header_and_bad_lines_quarantined(
    spark: Any, tmp_path: Path
) -> None:
    # CSV's reader keeps no line: a malformed record's line is read again to quarantine
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
    produced = partials(spark, inputs, outputs)
    # A row whose value is no number, or null, is quarantined as the row's fields
    assert produced["seg0"].quarantined == ['{"key":"a","value":"x","user":"u2","n":2}']
    assert produced["seg1"].quarantined == ['{"key":"b","user":"u3","n":3}']
    expected = oracle([rows[0], rows[3]])
    assert merged(list(outputs.values())) == expected
    result = plain(spark, list(inputs.values()), "parquet")
    assert result.malformed == 2
    assert dict(result.rows) == expected


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
