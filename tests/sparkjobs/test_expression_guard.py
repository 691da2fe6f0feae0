"""The worker's second check: Spark's own parse of the exact text it will run must be
admitted too, and nothing runs before it is (real Spark)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkjobs import expressions
from sparkjobs.catalog import validate_params
from sparkjobs.expression_guard import apply_record_step, problems
from sparkjobs.expressions import ExpressionRefused, check
from tests.sparkjobs.test_expressions import HUGE_VALUES, LEAK_COLUMN, SUBQUERY

pytestmark = [pytest.mark.spark]

FIELDS = ["key", "value", "user"]


@pytest.fixture
def records(spark: Any) -> Any:
    return spark.createDataFrame(
        [("key-1", 5.0, "u1"), ("key-2", 50.0, "u2"), ("key-3", 500.0, "u1")],
        "key STRING, value DOUBLE, user STRING",
    )


def test_the_issues_attacks_are_refused_by_sparks_own_parse(spark: Any) -> None:
    leak = problems(spark, LEAK_COLUMN, fields=FIELDS, project=True)
    assert ["reflect" in str(p) for p in leak] == [True, False]
    assert "java_method" in str(leak[1])
    assert "subqueries" in str(problems(spark, SUBQUERY, fields=FIELDS, project=True)[0])
    exit_jvm = problems(
        spark, "reflect('java.lang.System','exit',3) = 0", fields=FIELDS, project=False
    )
    assert "it calls Java methods" in str(exit_jvm[0])


def test_a_refused_expression_never_runs(spark: Any, records: Any, tmp_path: Path) -> None:
    # Given the issue's symlink attack: a reflect call that would link /etc into a folder
    link = tmp_path / "etcdir"
    column = f"reflect('org.apache.hadoop.fs.FileUtil', 'symLink', '/etc', '{link}') AS key"
    # When a project node with it is applied (as on a worker, the console bypassed)
    with pytest.raises(ExpressionRefused, match="'reflect' is not allowed"):
        apply_record_step(records, "project", {"columns": [column]}).collect()
    # Then nothing ran: the link was never made
    assert not link.exists() and not link.is_symlink()


def test_names_spark_would_read_as_functions_must_be_fields(spark: Any, records: Any) -> None:
    # `user` is a field here, so it is data; with no such field Spark would call current_user
    assert problems(spark, "user = 'u1'", fields=FIELDS, project=False) == []
    found = problems(spark, "user = 'root'", fields=["key", "value"], project=False)
    assert "unknown field 'user'" in str(found[0])
    found = problems(spark, "current_date IS NOT NULL", fields=FIELDS, project=False)
    assert "unknown field 'current_date'" in str(found[0])


@pytest.mark.parametrize(
    "text",
    [
        "`sys`.`reflect`('a', 'b') IS NULL",
        "IDENTIFIER('reflect')('a') IS NULL",
        "key = 'a' -- comment\n OR reflect('a', 'b') IS NULL",
        "key IN (SELECT key FROM json.`/etc/passwd`)",
        "count(DISTINCT key) > 0",
        "upper(key) FILTER (WHERE value > 1) = 'x'",
        "exists(array(1), x -> x > 0)",
    ],
)
def test_what_the_console_refuses_spark_refuses_too(spark: Any, text: str) -> None:
    assert check(text) != []
    assert problems(spark, text, fields=FIELDS, project=False) != []


def test_admitted_steps_give_what_plain_spark_gives(spark: Any, records: Any) -> None:
    from pyspark.sql import functions as F

    # Given a filter and a project that the console admits
    condition = "value BETWEEN 10 AND 1000 AND key LIKE 'key-%'"
    columns = ["upper(key) AS key", "CAST(value * 2 AS DECIMAL(12, 2)) AS value", "user"]
    assert check(condition) == [] and all(check(c, project=True) == [] for c in columns)
    # When they are applied through the guard
    filtered = apply_record_step(records, "filter", {"condition": condition})
    projected = apply_record_step(filtered, "project", {"columns": columns})
    # Then the rows equal plain Spark's over the same records
    expected = records.where((F.col("value") >= 10) & (F.col("value") <= 1000)).select(
        F.upper("key").alias("key"),
        (F.col("value") * 2).cast("decimal(12,2)").alias("value"),
        "user",
    )
    assert sorted(projected.collect()) == sorted(expected.collect())


@pytest.mark.parametrize(("text", "position", "why"), HUGE_VALUES)
def test_expressions_that_build_huge_values_are_refused_by_sparks_own_parse(
    spark: Any, records: Any, text: str, position: int, why: str
) -> None:
    # Given one of the issue's expressions, the console bypassed
    found = [str(p) for p in problems(spark, text, fields=FIELDS, project=False)]
    # Then Spark's parse of it is refused where it grows, as the console refuses it
    assert len(found) == 1 and found[0].startswith(f"at character {position}: {why}"), found
    # and a filter with it fails before any job, without building the value
    with pytest.raises(ExpressionRefused, match=why.replace("(", r"\(")):
        apply_record_step(records, "filter", {"condition": text}).collect()


def test_a_project_whose_columns_together_build_too_large_a_row_is_refused(
    spark: Any, records: Any
) -> None:
    # Given columns each within the budget, together 10 times the key
    columns = ["hex(hex(key)) AS a", "hex(hex(key)) AS b", "hex(key) AS c"]
    assert all(problems(spark, c, fields=FIELDS, project=True) == [] for c in columns)
    # Then the project is refused before any job, as the console refuses it
    why = "the columns together could build a row 10 times as long as field 'key'"
    with pytest.raises(ExpressionRefused, match=why):
        apply_record_step(records, "project", {"columns": columns})
    assert why in " ".join(validate_params("project", "operator", {"columns": columns}))


def test_growth_functions_within_the_budget_give_what_plain_spark_gives(
    spark: Any, records: Any
) -> None:
    from pyspark.sql import functions as F

    # Given project columns that pad, repeat and match within the budget
    columns = ["lpad(key, 12, '0') AS padded", "repeat('-', 3) || key AS ruled"]
    condition = "key LIKE '%y-_' AND key NOT LIKE 'x%'"
    # When they run through the guard
    filtered = apply_record_step(records, "filter", {"condition": condition})
    projected = apply_record_step(filtered, "project", {"columns": columns})
    # Then they give plain Spark's values
    assert sorted(projected.collect()) == sorted(
        records.select(
            F.lpad("key", 12, "0").alias("padded"),
            F.concat(F.lit("---"), "key").alias("ruled"),
        ).collect()
    )
    assert sorted(r.padded for r in projected.collect()) == [
        "0000000key-1",
        "0000000key-2",
        "0000000key-3",
    ]


def test_an_admitted_like_is_linear_in_the_length_of_its_value(spark: Any) -> None:
    # Given a value of 4 MB of 'a' and patterns with one backtracking '%', that fail
    frame = spark.createDataFrame([("a" * (4 << 20),)], "key STRING")
    for condition in ("key LIKE '%a_b%%'", "key LIKE 'a%a_b'", "key ILIKE '%a_ab%'"):
        started = time.monotonic()
        rows = apply_record_step(frame, "filter", {"condition": condition}).count()
        # Then each match is one pass over the value, not a backtracking search
        assert rows == 0 and time.monotonic() - started < 30, condition
    # and a second '%' before the end, which would search again from every 'a', is refused
    with pytest.raises(ExpressionRefused, match="a LIKE pattern with 2 '%' before its end"):
        apply_record_step(frame, "filter", {"condition": "key LIKE '%a%a_b'"})


# Values that make each growth rule reach its bound: the search of a replace, letters
# whose capital is three characters, control characters JSON escapes, two-byte letters,
# JSON numbers written longer again.
WORST_VALUES = [
    "",
    "a" * 300,
    "\u0390" * 300,
    "\x01" * 300,
    "\u00e9" * 300,
    "[" + ",".join(["1e6"] * 75) + "]",
]
WORST_RECORDS = [(k, u, 1.5e300) for k in WORST_VALUES for u in WORST_VALUES]
LITERALS = ["''", "'a'", "'aaaaa'", "'\u00e9'", "'-'", "'%'"]
counts = st.integers(0, 40).map(str)


@st.composite
def growing_values(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0:
        return draw(st.sampled_from(["key", "user", *LITERALS]))
    a = draw(growing_values(depth=depth - 1))
    b = draw(growing_values(depth=depth - 1))
    lit = draw(st.sampled_from(LITERALS))
    n = draw(counts)
    return draw(
        st.sampled_from(
            [
                f"concat({a}, {b})",
                f"({a} || {b})",
                f"hex({a})",
                f"upper({a})",
                f"lower({a})",
                f"initcap({a})",
                f"lpad({a}, {n}, {lit})",
                f"rpad({a}, {n})",
                f"repeat({a}, {n})",
                f"space({n})",
                f"replace({a}, {lit}, {lit})",
                f"translate({a}, 'a\u00e9', '\u0390\u0390')",
                f"base64({a})",
                f"mask({a}, '\u0390', '\u0390', '\u0390')",
                f"to_json(named_struct('k', {a}))",
                f"get_json_object({a}, '$')",
                f"format_string('%-{int(n) + 1}s|%s', {a}, {b})",
                f"format_number(value, {n})",
                f"concat_ws({lit}, {a}, {b})",
                f"coalesce({a}, {b})",
                f"CASE WHEN length({a}) > 3 THEN {a} ELSE {b} END",
                f"substr({a}, 2, {n})",
                "date_format(TIMESTAMP '2024-01-02 03:04:05', 'EEEE MMMM yyyy zzzz')",
            ]
        )
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(1, 3).flatmap(growing_values), min_size=8, max_size=8))
def test_no_admitted_value_is_longer_than_its_bound(spark: Any, texts: list[str]) -> None:
    # Given values built of growth functions, both checkers agreeing on their admission
    bounds = {}
    for text in texts:
        refused_here = problems(spark, text, fields=FIELDS, project=False)
        assert bool(check(text)) == bool(refused_here), (text, check(text), refused_here)
        bound = expressions.measure(text)
        if bound is not None:
            bounds[f"n{len(bounds)}"] = (text, bound)
    # When Spark computes them over the records that make each rule reach its bound
    frame = spark.createDataFrame(WORST_RECORDS, "key STRING, user STRING, value DOUBLE")
    lengths = [f"octet_length(CAST(({text}) AS STRING)) AS {n}" for n, (text, _) in bounds.items()]
    rows = apply_record_step(frame, "project", {"columns": [*lengths, "key", "user"]}).collect()
    # Then no value is longer than its bound says
    for row in rows:
        fields = {"key": len(row.key.encode()), "user": len(row.user.encode())}
        for name, (text, bound) in bounds.items():
            most = bound.fixed + sum(t * fields[f] for f, t in bound.fields.items())
            assert (row[name] or 0) <= most, (text, row.key[:3], row.user[:3], row[name], most)
