"""Grouped measures on Spark (sparkjobs/grouped.py): the partials of a batch's segments,
merged as the sink merges them, equal Spark SQL's own GROUP BY over the same records;
nulls count as SQL counts them, malformed lines are quarantined per segment, and the
plain job computes the same rows. The sketches hold every value of groups this small
(under 4,096 distinct values, under 200 values), so their estimates are Spark SQL's
exact distinct count and discrete percentile."""

from __future__ import annotations

import json
import random
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkjobs.event_time import WindowSpec
from sparkjobs.grouped import grouped_partials
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup, group_slot
from sparkjobs.measures import Grouping
from sparkjobs.merge import combine_groups
from sparkjobs.plain_job import batch_grouped
from sparkjobs.sql_stage import compiled

pytestmark = pytest.mark.spark

PARAMS: dict[str, Any] = {
    "group_by": ["carrier", "origin"],
    "measures": [
        {"name": "flights", "fn": "count"},
        {"name": "delayed", "fn": "count", "field": "dep_delay"},
        {"name": "total_delay", "fn": "sum", "field": "dep_delay"},
        {"name": "least", "fn": "min", "field": "dep_delay"},
        {"name": "most", "fn": "max", "field": "dep_delay"},
        {"name": "mean_delay", "fn": "avg", "field": "dep_delay"},
        {"name": "tails", "fn": "count_distinct", "field": "tailnum"},
        {"name": "tails_approx", "fn": "approx_count_distinct", "field": "tailnum"},
        {"name": "p95", "fn": "approx_percentile", "field": "dep_delay", "percentile": 0.95},
        {"name": "first_tail", "fn": "first", "field": "tailnum", "by": "t"},
        {"name": "last_tail", "fn": "last", "field": "tailnum", "by": "t"},
    ],
}
GROUPING = Grouping.of(PARAMS)
BAD = ["not json", "[1, 2", '{"carrier": "UA", "dep_delay": "late"}', '{"carrier": "U\\u0000A"}']
SQL = """
    SELECT carrier, origin, count(*) AS flights, count(dep_delay) AS delayed,
           sum(dep_delay) AS total_delay, min(dep_delay) AS least, max(dep_delay) AS most,
           avg(dep_delay) AS mean_delay, count(DISTINCT tailnum) AS tails,
           count(DISTINCT tailnum) AS tails_approx,
           CAST(percentile_disc(0.95) WITHIN GROUP (ORDER BY dep_delay) AS DOUBLE) AS p95,
           min(CASE WHEN t IS NOT NULL THEN named_struct('t', t, 'v', tailnum) END).v
             AS first_tail,
           max(CASE WHEN t IS NOT NULL THEN named_struct('t', t, 'v', tailnum) END).v
             AS last_tail
    FROM flights WHERE (carrier IS NULL OR NOT contains(carrier, char(0))) {where}
    GROUP BY carrier, origin
"""
CONDITION = "origin <> 'EWR' OR tailnum LIKE 'N1%'"


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        delay = rng.choice([None, round(rng.uniform(-20, 300), 2), rng.randint(-5, 5)])
        record = {
            "carrier": rng.choice(["UA", "AA", "B6", None]),
            "origin": rng.choice(["JFK", "LGA", "EWR"]),
            "dep_delay": delay,
            "tailnum": rng.choice([None, *[f"N{i}" for i in range(30)]]),
            "t": rng.randrange(600),  # seconds: an event time
        }
        if rng.random() < 0.1:
            del record["origin"]  # missing: null, as SQL reads it
        records.append(record)
    return records


def _segments(folder: Path, n: int = 600) -> dict[str, Path]:
    lines = [json.dumps(r) for r in _records(n, seed=5)]
    for i, bad in enumerate(BAD):
        lines.insert(37 * (i + 1), bad)
    segments = {}
    for i in range(4):
        path = folder / f"s{i}.jsonl"
        path.write_text("".join(line + "\n" for line in lines[i::4]))
        segments[f"s{i}"] = path
    return segments


def _spark_sql(
    spark: Any, paths: list[Path], where: str = ""
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Spark SQL's own query over the records, as a user would write it over the files:
    the delay read as the live stage reads numbers, DECIMAL(38,10)."""
    frame = spark.read.schema(
        "carrier STRING, origin STRING, dep_delay DECIMAL(38,10), tailnum STRING, t LONG, "
        "_corrupt_record STRING"
    ).json([str(p) for p in paths])
    frame.where("_corrupt_record IS NULL").createOrReplaceTempView("flights")
    return {
        (row["carrier"], row["origin"]): {
            k: v for k, v in row.asDict().items() if k not in ("carrier", "origin")
        }
        for row in spark.sql(SQL.format(where=f"AND ({where})" if where else "")).collect()
    }


# The same query per hopping window of a minute, every 30 s, of the event time ``t``.
WINDOWED = {"window_s": 60, "slide_s": 30, "event_time": "t"}


def _spark_sql_windows(spark: Any, paths: list[Path]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Spark SQL's query per window, by Spark's own ``window()`` over the event time."""
    _spark_sql(spark, paths)  # the view
    windowed = (
        SQL.format(where="AND t IS NOT NULL")
        .replace(
            "SELECT carrier,",
            "SELECT unix_micros(window(timestamp_seconds(t), '60 seconds', '30 seconds').start)"
            " AS w, carrier,",
        )
        .replace(
            "GROUP BY carrier",
            "GROUP BY window(timestamp_seconds(t), '60 seconds', '30 seconds'), carrier",
        )
    )
    return {
        (row["w"], row["carrier"], row["origin"]): {
            k: v for k, v in row.asDict().items() if k not in ("w", "carrier", "origin")
        }
        for row in spark.sql(windowed).collect()
    }


def _equal_to_sql(
    ours: dict[tuple[Any, ...], dict[str, Any]], sql: dict[tuple[Any, ...], dict[str, Any]]
) -> None:
    assert ours.keys() == sql.keys()
    assert len(ours) > 5
    for group, values in ours.items():
        expected = {name: value for name, value in sql[group].items() if name in values}
        # Spark's average of DECIMAL(38,10) is rounded half up at 14 places; ours keeps more
        mean = values["mean_delay"]
        if mean is not None:
            mean = mean.quantize(Decimal("1e-14"), rounding=ROUND_HALF_UP)
        assert {**values, "mean_delay": mean} == expected, group


# Measures that re-aggregate, and one distinct count: a batch aggregated as one builds
# their partials from (group, value) pairs first.
EXACT = Grouping.of(
    {
        **PARAMS,
        "measures": [
            m
            for m in PARAMS["measures"]
            if not m["fn"].startswith("approx") and m["fn"] not in ("first", "last")
        ],
    }
)


@pytest.mark.parametrize(
    ("together", "grouping"),
    [(False, GROUPING), (True, GROUPING), (True, EXACT)],
    ids=["per-segment", "together", "together-by-pairs"],
)
def test_partials_merged_equal_spark_sql_s_group_by(
    spark: Any, tmp_path: Path, together: bool, grouping: Grouping | None
) -> None:
    assert grouping is not None
    inputs = _segments(tmp_path)
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    held = {seg: "s0" for seg in inputs} if together else None

    produced = grouped_partials(spark, inputs, outputs, grouping, together=held)

    ours = {
        p.group: grouping.finish(p.states) for p in combine_groups(grouping, list(outputs.values()))
    }
    _equal_to_sql(ours, _spark_sql(spark, list(inputs.values())))
    # Malformed lines are counted and quarantined in the segment they were in; the
    # group value holding a NUL character (PostgreSQL cannot keep it) among them
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    quarantined = [line for p in produced.values() for line in p.quarantined]
    assert "not json" in quarantined and any("\\u0000" in line for line in quarantined)
    assert sum(p.records for p in produced.values()) == 600
    if together:
        assert [seg for seg, p in produced.items() if p.keys] == ["s0"]


def test_key_groups_split_the_groups_by_slot_and_together_equal_spark_sql(
    spark: Any, tmp_path: Path
) -> None:
    # Given a stage keyed by key groups, three parts of the slot space
    assert GROUPING is not None
    inputs = _segments(tmp_path)
    parts = [KeyGroup(0, 40), KeyGroup(40, 90), KeyGroup(90, KEY_SLOTS)]
    produced, partials = [], []
    for i, part in enumerate(parts):
        outputs = {seg: tmp_path / f"{seg}.part{i}.jsonl" for seg in inputs}
        # When each part aggregates every segment
        produced.append(grouped_partials(spark, inputs, outputs, GROUPING, key_group=part))
        partials.append(combine_groups(GROUPING, list(outputs.values())))
    # Then each part holds only the groups whose slot it owns, as the state table
    # computes the slot (a null value among them)...
    for part, held in zip(parts, partials, strict=True):
        assert held, f"part {part} holds no group"
        assert all(group_slot(p.group) in part.slots for p in held), part
    assert any(None in p.group for held in partials for p in held)
    # ...the parts together are Spark SQL's query...
    ours = {p.group: GROUPING.finish(p.states) for held in partials for p in held}
    assert len(ours) == sum(len(held) for held in partials)
    _equal_to_sql(ours, _spark_sql(spark, list(inputs.values())))
    # ...and a record is counted once: the malformed ones by the part holding slot 0
    counted = [sum(p.records + p.malformed for p in out.values()) for out in produced]
    assert sum(counted) == 600 + len(BAD)
    assert [sum(p.malformed for p in out.values()) for out in produced] == [len(BAD), 0, 0]


def test_the_plain_job_computes_the_same_rows(spark: Any, tmp_path: Path) -> None:
    assert GROUPING is not None
    inputs = _segments(tmp_path)
    result = batch_grouped(spark, [str(p) for p in inputs.values()], "jsonl", GROUPING)

    assert result.malformed == len(BAD) and result.records == 600
    _equal_to_sql(dict(result.rows), _spark_sql(spark, list(inputs.values())))


def test_sketches_past_their_exact_range_stay_within_their_stated_error(
    spark: Any, tmp_path: Path
) -> None:
    # Given 20,000 records of one group, 12,000 distinct users, in four segments
    rng = random.Random(3)
    records = [
        {"g": "all", "user": f"u{rng.randrange(12_000)}", "x": rng.random() * 1000}
        for _ in range(20_000)
    ]
    inputs = {}
    for i in range(4):
        inputs[f"s{i}"] = tmp_path / f"s{i}.jsonl"
        inputs[f"s{i}"].write_text("".join(json.dumps(r) + "\n" for r in records[i::4]))
    grouping = Grouping.of(
        {
            "group_by": ["g"],
            "measures": [
                {"name": "users", "fn": "approx_count_distinct", "field": "user"},
                {"name": "p95", "fn": "approx_percentile", "field": "x", "percentile": 0.95},
            ],
        }
    )
    assert grouping is not None
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    # When each segment's partial is computed apart and merged
    grouped_partials(spark, inputs, outputs, grouping)
    (merged,) = combine_groups(grouping, list(outputs.values()))
    values = grouping.finish(merged.states)
    # Then the distinct count is within three standard errors of HLL's 2^12 registers
    # (1.6% each), and the percentile's rank within three of KLL's k = 200 (1.65% each)
    exact = len({r["user"] for r in records})
    assert abs(int(values["users"] or 0) - exact) <= 0.05 * exact, (values["users"], exact)
    ordered = sorted(r["x"] for r in records)
    rank = sum(x <= float(values["p95"] or 0) for x in ordered) / len(ordered)
    assert abs(rank - 0.95) <= 0.05, rank


@pytest.mark.parametrize("together", [False, True], ids=["per-segment", "together"])
def test_a_statement_s_condition_and_measures_equal_spark_sql_s_own_query(
    spark: Any, tmp_path: Path, together: bool
) -> None:
    # Given a sql stage's statement over the flights, with a condition
    query = compiled(
        "SELECT carrier, origin, count(*) AS flights, count(dep_delay) AS delayed, "  # noqa: S608
        "sum(dep_delay) AS total_delay, min(dep_delay) AS least, max(dep_delay) AS most, "
        "avg(dep_delay) AS mean_delay, count(DISTINCT tailnum) AS tails, "
        "approx_count_distinct(tailnum) AS tails_approx, "
        "approx_percentile(dep_delay, 0.95) AS p95 "
        f"FROM input WHERE {CONDITION} GROUP BY carrier, origin"
    )
    inputs = _segments(tmp_path)
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    # When its partials are computed per segment and merged
    held = {seg: "s0" for seg in inputs} if together else None
    produced = grouped_partials(
        spark, inputs, outputs, query.grouping, where=query.where, together=held
    )
    ours = {
        p.group: query.grouping.finish(p.states)
        for p in combine_groups(query.grouping, list(outputs.values()))
    }
    # Then they equal Spark SQL's query over the same records, the condition included
    _equal_to_sql(ours, _spark_sql(spark, list(inputs.values()), where=CONDITION))
    # ...and every record was taken: those the condition dropped counted, in no group
    taken = sum(p.records + p.malformed for p in produced.values())
    assert taken == 600 + len(BAD)


def test_partials_per_window_equal_spark_sql_s_window_query(spark: Any, tmp_path: Path) -> None:
    # Given grouped measures over hopping windows of the event time (a record in two)
    grouping = Grouping.of({**PARAMS, **WINDOWED})
    assert grouping is not None
    inputs = _segments(tmp_path)
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    # When each segment's partials are computed per window and merged
    produced = grouped_partials(
        spark, inputs, outputs, grouping, windows=WindowSpec.from_params(WINDOWED)
    )
    ours = {
        (p.window, *p.group): grouping.finish(p.states)
        for p in combine_groups(grouping, list(outputs.values()))
    }
    # Then they equal Spark SQL's query grouped by window() too
    _equal_to_sql(ours, _spark_sql_windows(spark, list(inputs.values())))
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    assert sum(p.late for p in produced.values()) == 0
    # ...and so does the plain job, window by window
    plain = batch_grouped(
        spark,
        [str(p) for p in inputs.values()],
        "jsonl",
        grouping,
        windows=WindowSpec.from_params(WINDOWED),
    )
    assert plain.windows is not None and plain.malformed == len(BAD)
    assert {(w[0], *w[2][0]): w[2][1] for w in plain.windows} == {
        at: {**values} for at, values in ours.items()
    }


def test_a_record_whose_window_its_chunk_s_watermark_closed_is_late_not_counted(
    spark: Any, tmp_path: Path
) -> None:
    grouping = Grouping.of({**PARAMS, **WINDOWED})
    assert grouping is not None
    inputs = _segments(tmp_path)
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    # Given segment s3 read under a watermark at 300 s: windows ending by then closed
    highs = {"s3": 300 * 1_000_000}
    produced = grouped_partials(
        spark, inputs, outputs, grouping, windows=WindowSpec.from_params(WINDOWED), highs=highs
    )
    # Then each of its (record, window) pairs with a window ending by 300 s is late,
    # quarantined as the fields read, and in no partial
    timed = [json.loads(line) for line in inputs["s3"].read_text().splitlines() if '"t"' in line]
    ends = [t // 30 * 30 + 60 - k * 30 for t in (r["t"] for r in timed) for k in (0, 1)]
    late = [end for end in ends if end <= 300]
    assert produced["s3"].late == len(late) > 0
    assert len(produced["s3"].late_lines) == produced["s3"].late
    assert all(p.late == 0 for seg, p in produced.items() if seg != "s3")
    windows = {p.window for p in combine_groups(grouping, [outputs["s3"]])}
    assert windows and min(w for w in windows if w is not None) + 60_000_000 > 300 * 1_000_000


def test_a_computed_group_field_equals_spark_sql_s_group_by_its_expression(
    spark: Any, tmp_path: Path
) -> None:
    # Given flights grouped by carrier and the minute of their event time, computed
    grouping = Grouping.of({**PARAMS, "group_by": ["carrier", "floor(t / 60) AS minute"]})
    assert grouping is not None
    inputs = _segments(tmp_path)
    outputs = {seg: tmp_path / f"{seg}.out.jsonl" for seg in inputs}
    # When each segment's partials are computed and merged
    produced = grouped_partials(spark, inputs, outputs, grouping)
    ours = {
        p.group: grouping.finish(p.states) for p in combine_groups(grouping, list(outputs.values()))
    }
    # Then they equal Spark SQL's GROUP BY of the same expression
    _spark_sql(spark, list(inputs.values()))  # the view
    query = (
        SQL.format(where="")
        .replace("SELECT carrier, origin,", "SELECT carrier, floor(t / 60) AS minute,")
        .replace("GROUP BY carrier, origin", "GROUP BY carrier, floor(t / 60)")
    )
    sql = {
        (row["carrier"], None if row["minute"] is None else str(row["minute"])): {
            k: v for k, v in row.asDict().items() if k not in ("carrier", "minute")
        }
        for row in spark.sql(query).collect()
    }
    _equal_to_sql(ours, sql)
    assert sum(p.malformed for p in produced.values()) == len(BAD)
    # ...and so does the plain job
    plain = batch_grouped(spark, [str(p) for p in inputs.values()], "jsonl", grouping)
    assert plain.malformed == len(BAD)
    assert dict(plain.rows) == ours


def test_values_too_large_for_longs_are_still_summed_exactly(spark: Any, tmp_path: Path) -> None:
    # Given values of a billion and more (past what the sums in longs take), in a
    # group beside small ones, and fractions to the tenth decimal place
    records = [
        {"g": "a", "x": "0.0000000001"},
        {"g": "a", "x": 987654321012.5},
        {"g": "b", "x": -3.25},
        {"g": "b", "x": 2},
    ]
    inputs = {"s0": tmp_path / "s0.jsonl"}
    inputs["s0"].write_text("".join(json.dumps(r) + "\n" for r in records))
    grouping = Grouping.of(
        {
            "group_by": ["g"],
            "measures": [
                {"name": "total", "fn": "sum", "field": "x"},
                {"name": "least", "fn": "min", "field": "x"},
                {"name": "most", "fn": "max", "field": "x"},
                {"name": "mean", "fn": "avg", "field": "x"},
            ],
        }
    )
    assert grouping is not None
    outputs = {"s0": tmp_path / "s0.out.jsonl"}
    # When its partials are computed (twice: the second batch of a process that saw
    # such values goes to decimals at once)
    for _ in range(2):
        grouped_partials(spark, inputs, outputs, grouping)
        found = {
            p.group: grouping.finish(p.states) for p in combine_groups(grouping, [outputs["s0"]])
        }
        # Then every figure is exact
        assert found == {
            ("a",): {
                "total": Decimal("987654321012.5000000001"),
                "least": Decimal("0.0000000001"),
                "most": Decimal("987654321012.5"),
                "mean": Decimal("493827160506.25000000005"),
            },
            ("b",): {
                "total": Decimal("-1.25"),
                "least": Decimal("-3.25"),
                "most": Decimal("2"),
                "mean": Decimal("-0.625"),
            },
        }
