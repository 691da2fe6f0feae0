"""The worker's second check: Spark's own parse of the exact text it will run must be
admitted too, and nothing runs before it is (real Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkjobs.expression_guard import apply_record_step, problems
from sparkjobs.expressions import ExpressionRefused, check
from tests.sparkjobs.test_expressions import LEAK_COLUMN, SUBQUERY

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
