"""Event time and windows: one meaning in Python (the source's watermark) and in Spark
(the operators' windows), hopping windows equal to Spark's own ``window()``, and late
records kept out, counted and quarantined."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from orchestrator.pipeline.event_high import segment_high
from sparkjobs.event_time import US, WindowSpec, parse_us
from sparkjobs.grouped import aggregate_batch
from sparkjobs.measures import Grouping
from sparkjobs.merge import combine_groups
from sparkjobs.windows import with_event_us

TIMES = [
    ("1790000000", 1_790_000_000 * US),
    ("1790000000.1234567", 1_790_000_000_123_456),  # down to the microsecond
    ("-1.5", -1_500_000),
    (" 12 ", 12 * US),
    ("1e3", 1000 * US),
    ("2026-11-26T17:00:00Z", 1_795_712_400 * US),
    ("2026-11-26T17:00:00.5+01:00", 1_795_708_800_500_000),
    ("2026-11-26 17:00:00", 1_795_712_400 * US),  # no offset: UTC
    ("2026-11-26", 1_795_651_200 * US),
    ("yesterday", None),
    ("1_000", None),
    ("", None),
    ("NaN", None),
    ("99999999999999999999", None),  # past year 9999
]


@pytest.mark.parametrize(("text", "expected"), TIMES)
def test_an_event_time_means_the_same_in_python(text: str, expected: int | None) -> None:
    assert parse_us(text) == expected


def test_an_event_time_means_the_same_in_spark(spark: Any) -> None:
    frame = spark.createDataFrame([(t,) for t, _ in TIMES], "t STRING")
    got = [row["us"] for row in with_event_us(frame, "t", "us").select("us").collect()]
    assert got == [expected for _, expected in TIMES]


@given(
    t=st.integers(-(10**15), 10**15),
    size=st.integers(1, 10**8),
    ratio=st.integers(1, 7),
)
def test_the_windows_of_a_time_hold_it_and_are_all_of_them(t: int, size: int, ratio: int) -> None:
    slide = max(1, size // ratio)
    spec = WindowSpec("ts", size, slide, 0)
    starts = spec.starts(t)
    assert starts
    assert all(s <= t < s + size and s % slide == 0 for s in starts)
    # No window holding t is left out: the one before the oldest ends by t.
    assert starts[0] - slide + size <= t


def test_hopping_windows_equal_spark_window_and_late_records_stay_out(
    spark: Any, tmp_path: Path
) -> None:
    records = [
        {"key": f"k{i % 3}", "value": i / 4, "user": f"u{i % 5}", "ts": 1000 + i * 0.7}
        for i in range(60)
    ]
    late_record = {"key": "k0", "value": 9, "user": "u9", "ts": 990.5}
    seg0, seg1 = tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"
    seg0.write_text("".join(json.dumps(r) + "\n" for r in records[:30]))
    seg1.write_text("".join(json.dumps(r) + "\n" for r in [*records[30:], late_record]))
    # An aggregate stage of the key form (key, value, user) over hopping windows
    params = {"window_s": 6, "slide_s": 2, "event_time": "ts"}
    grouping = Grouping.of(params)
    assert grouping is not None
    high0 = segment_high(seg0, "jsonl", "ts")
    assert high0 == parse_us(json.loads(json.dumps(records[29]))["ts"])
    outputs = {"s0": tmp_path / "o0.jsonl", "s1": tmp_path / "o1.jsonl"}
    produced = aggregate_batch(
        spark,
        "aggregate",
        params,
        {"s0": seg0, "s1": seg1},
        outputs,
        key_group=None,
        highs={"s0": None, "s1": high0},
    )
    # 990.5 falls in the windows starting at 986, 988 and 990: all ended by 1020.3.
    assert produced["s1"].late == 3
    assert [json.loads(line)["ts"] for line in produced["s1"].late_lines] == ["990.5"] * 3
    assert produced["s0"].late == 0

    got = {
        (p.window, *p.group): grouping.finish(p.states)
        for p in combine_groups(grouping, list(outputs.values()))
    }
    frame = spark.createDataFrame(
        [(r["key"], str(r["value"]), r["user"], str(r["ts"])) for r in records],
        "key STRING, value STRING, user STRING, ts STRING",
    )
    expected = (
        frame.withColumn("value", F.col("value").cast("DECIMAL(38,10)"))
        .transform(lambda f: with_event_us(f, "ts", "us"))
        .withColumn("t", F.timestamp_micros("us"))
        .groupBy(F.window("t", "6 seconds", "2 seconds"), "key")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("value").alias("sum"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.count_distinct("user").alias("distinct_users"),
        )
        .withColumn("start", F.unix_micros(F.col("window.start")))
        .collect()
    )
    want = {
        (r["start"], r["key"]): {
            "count": r["count"],
            "sum": Decimal(r["sum"]),
            "min": Decimal(r["min"]),
            "max": Decimal(r["max"]),
            "avg": Decimal(r["sum"]) / r["count"],
            "distinct_users": r["distinct_users"],
        }
        for r in expected
    }
    assert len(want) > 10
    assert got == want


def test_the_highest_event_time_of_a_segment_counts_records_only(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"ts": 10}',
                '[{"ts": 30}, {"ts": "1970-01-01T00:00:20Z"}]',
                '{"ts": 99999, "ts": 15}',  # of a field given twice, the last counts
                '{"ts": 50',  # malformed: moves nothing
                '{"meta": {"ts": 70}}',  # not the record's field
                '{"ts": "soon"}',
            ]
        )
    )
    assert segment_high(path, "jsonl", "ts") == 30 * US
    csv_path = tmp_path / "s.csv"
    csv_path.write_text('key,"ts"\nk,5\nk,"1970-01-01T00:00:40Z"\nk,\nbroken\n')
    assert segment_high(csv_path, "csv", "ts") == 40 * US
    assert segment_high(csv_path, "csv", "absent") is None


def test_numbers_read_by_arrow_mean_what_they_mean_line_by_line(tmp_path: Path) -> None:
    clean = tmp_path / "numbers.jsonl"
    lines = [
        '{"ts": 1790000000.1234567, "meta": {"ts": 1999999999}}',
        '{"ts": null}',
        '{"key": "no time"}',
        "",
        '{"ts": NaN}',
        '{"ts": 1789999999}',
    ]
    clean.write_text("\n".join(lines) + "\n")
    # The fast path reads it; the line-by-line one (a file it refuses) agrees.
    refused = tmp_path / "refused.jsonl"
    refused.write_text("\n".join([*lines, "{broken"]) + "\n")
    assert segment_high(clean, "jsonl", "ts") == 1_790_000_000_123_456
    assert segment_high(refused, "jsonl", "ts") == 1_790_000_000_123_456
