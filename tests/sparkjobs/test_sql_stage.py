"""A ``sql`` stage's statement (sparkjobs/sql_stage.py): one SELECT over the stage's
records, compiled into a condition and grouped measures that merge exactly; anything a
merge of partials could not give exactly, or that is not one SELECT, refused saying
which part and why."""

from __future__ import annotations

import pytest

from sparkjobs.measures import Grouping, Measure
from sparkjobs.sql_stage import MAX_STATEMENT_CHARS, StatementError, compiled, problems_of

FLIGHTS = """
    SELECT carrier, origin, count(*) AS flights, count(dep_delay) AS delayed,
           sum(dep_delay) AS total, min(dep_delay) AS least, MAX(dep_delay) AS most,
           avg(dep_delay) AS mean_delay, count(DISTINCT tailnum) AS tails,
           approx_count_distinct(tailnum) AS tails_seen,
           approx_percentile(dep_delay, 0.95) AS p95
    FROM input
    WHERE dep_delay IS NOT NULL AND origin IN ('JFK', 'LGA')
    GROUP BY carrier, origin;
"""


def test_the_flights_query_is_a_condition_and_grouped_measures() -> None:
    query = compiled(FLIGHTS)
    assert query.where == "dep_delay IS NOT NULL AND origin IN ('JFK', 'LGA')"
    assert query.grouping == Grouping(
        ("carrier", "origin"),
        (
            Measure("flights", "count"),
            Measure("delayed", "count", "dep_delay"),
            Measure("total", "sum", "dep_delay"),
            Measure("least", "min", "dep_delay"),
            Measure("most", "max", "dep_delay"),
            Measure("mean_delay", "avg", "dep_delay"),
            Measure("tails", "count_distinct", "tailnum"),
            Measure("tails_seen", "approx_count_distinct", "tailnum"),
            Measure("p95", "approx_percentile", "dep_delay", 0.95),
        ),
    )


def test_min_by_and_max_by_an_event_time_are_the_first_and_last_values() -> None:
    query = compiled("SELECT min_by(tail, t) AS first_tail, max_by(tail, t) AS l FROM input")
    assert query.grouping.measures == (
        Measure("first_tail", "first", "tail", by="t"),
        Measure("l", "last", "tail", by="t"),
    )


def test_a_statement_without_where_or_groups_is_one_group_of_every_record() -> None:
    query = compiled("select count(*) as n, sum(value) as total from input")
    assert query.where is None
    assert query.grouping == Grouping((), (Measure("n", "count"), Measure("total", "sum", "value")))


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT carrier, hour(dep_time) AS dep_hour, count(*) AS n FROM input "
        "GROUP BY carrier, hour(dep_time)",
        "SELECT carrier, hour(dep_time) AS dep_hour, count(*) AS n FROM input "
        "GROUP BY carrier, dep_hour",
        "SELECT carrier, HOUR( dep_time ) AS dep_hour, count(*) AS n FROM input "
        "GROUP BY carrier, hour(DEP_TIME)",
    ],
    ids=["by-expression", "by-its-name", "as-written-otherwise"],
)
def test_an_expression_grouped_by_is_a_computed_group_field(statement: str) -> None:
    query = compiled(statement)
    assert query.grouping.group_by == ("carrier", "dep_hour")
    (computed,) = query.grouping.computed
    assert computed.lower().replace(" ", "") == "hour(dep_time)asdep_hour"


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        (
            "SELECT count(*) AS n FROM input GROUP BY hour(dep_time)",
            "an expression grouped by must be selected, named with AS",
        ),
        (
            "SELECT reflect('java.lang.System', 'exit', 0) AS x, count(*) AS n FROM input "
            "GROUP BY reflect('java.lang.System', 'exit', 0)",
            "in GROUP BY's \"reflect('java.lang.System', 'exit', 0) AS x\": at character 1: "
            "function 'reflect' is not allowed",
        ),
        (
            "SELECT carrier, collect_list(tailnum) AS tails FROM input GROUP BY carrier",
            "at character 17: collect_list() cannot be a measure: its result depends on the "
            "order the records arrive in",
        ),
        (
            "SELECT carrier, percentile(dep_delay, 0.5) AS m FROM input GROUP BY carrier",
            "percentile() cannot be a measure: it needs every value of a group kept",
        ),
        (
            "SELECT carrier, rank() OVER (ORDER BY carrier) AS r FROM input GROUP BY carrier",
            "a window function (OVER) cannot be merged from partials",
        ),
        ("SELECT count(*) AS n FROM input; DROP TABLE x", "one statement only (a ';' ends it)"),
        ("DROP TABLE flights", "at character 1: must be one SELECT statement, not DROP"),
        ("INSERT INTO t SELECT 1", "must be one SELECT statement, not INSERT"),
        ("SELECT count(*) AS n FROM flights", "FROM must name input"),
        ("SELECT count(*) AS n", "FROM input is missing"),
        ("SELECT count(*) FROM input", "name each measure with AS"),
        ("SELECT carrier, count(*) AS n FROM input", "'carrier' is selected but not in GROUP BY"),
        ("SELECT count(*) AS n FROM input GROUP BY carrier", "'carrier' is grouped by but not"),
        ("SELECT count(*) AS n FROM input ORDER BY n", "ORDER BY has no meaning"),
        ("SELECT count(*) AS n FROM input LIMIT 5", "LIMIT would keep whichever groups"),
        (
            "SELECT count(*) AS n FROM input HAVING count(*) > 1",
            "HAVING filters merged groups",
        ),
        ("SELECT count(*) AS n FROM (SELECT * FROM input)", "FROM must name input"),
        (
            "SELECT count(*) AS n FROM input WHERE reflect('java.lang.System', 'exit', 0)",
            "function 'reflect' is not allowed: it calls Java methods (in WHERE)",
        ),
        ("SELECT count(*) AS n FROM input WHERE rand() > 0.5", "it is not deterministic"),
        ("SELECT count(*) AS carrier FROM input GROUP BY", "GROUP BY names nothing"),
        (
            "SELECT carrier, count(*) AS carrier FROM input GROUP BY carrier",
            "'carrier' is also a group_by field",
        ),
        ("SELECT sum(a + b) AS s FROM input", "sum() takes one field"),
        ("SELECT hour(ts) AS h, count(*) AS n FROM input", "hour() is not an aggregate this"),
        ("SELECT sum(x) / count(*) AS m FROM input", "a measure is one aggregate call"),
        ("SELECT stddev(x) AS s FROM input", "it is not among the measures yet"),
        ("SELECT approx_percentile(x, 95) AS p FROM input", "percentile must be a number in"),
        ("SELECT * FROM input", "SELECT * is not a measure"),
        ("SELECT carrier FROM input GROUP BY carrier", "select at least one measure"),
        ("", "must be one SELECT statement"),
        ("SELECT count(*) AS n FROM input -- why", "comments are not allowed"),
    ],
)
def test_a_statement_that_cannot_be_merged_exactly_is_refused_saying_where_and_why(
    statement: str, says: str
) -> None:
    found = problems_of(statement)
    assert any(says in p for p in found), found
    with pytest.raises(StatementError):
        compiled(statement)


def test_a_hostile_statement_is_refused_in_linear_time() -> None:
    assert problems_of("SELECT " + "(" * 100_000) == [
        f"longer than {MAX_STATEMENT_CHARS} characters"
    ]
    nested = "SELECT count(*) AS n FROM input WHERE " + "(" * 3000 + "1" + ")" * 3000
    assert problems_of(nested)
    many = ", ".join(f"count(*) AS n{i}" for i in range(40))
    assert any(
        "measures must be a list of 1 to 32" in p
        for p in problems_of(f"SELECT {many} FROM input")  # noqa: S608
    )
