"""Expressions are an allow-list: the console's parser (sparkjobs/expressions.py) admits
column references, literals, operators, CASE, casts and pure built-ins, and refuses
everything else with the function's name and where it is."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjobs.expressions import (
    ALLOWED_FUNCTIONS,
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    REFUSED_FUNCTIONS,
    ExpressionRefused,
    admit,
    check,
)

# The attacks of the security issue, as an operator typed them.
LEAK_COLUMN = (
    "concat_ws('|', reflect('java.lang.System','getenv','DATABASE_URL'), "
    "java_method('java.lang.System','getProperty','user.name')) AS key"
)
SUBQUERY = "(SELECT first(value) FROM text.`/etc/passwd`) AS key"
# The expressions of the security issue that build huge values, with where (1-based)
# and why each is refused.
HUGE_VALUES = [
    (
        "format_string('%2000000000s', 'x') = ''",
        15,
        "function 'format_string': a width of 2,000,000,000 in its format",
    ),
    (
        "hex(" * 30 + "key" + ")" * 30 + " = ''",
        105,  # the fourth hex from the inside: 16 times the key
        "function 'hex' could build a value 16 times as long as field 'key'",
    ),
    (
        "hex(" * 30 + "'x'" + ")" * 30 + " = ''",  # folded while Spark plans
        85,
        "function 'hex' could build a value of 65,920 bytes (at most 65,536",
    ),
    (
        "replace(replace(key, 'a', 'aaaaaaaaaa'), 'a', 'aaaaaaaaaa') = ''",
        9,
        "function 'replace' could build a value 10 times as long as field 'key'",
    ),
    (
        "key LIKE '%a%a%a%a%a%a%a%a%a%a%a%a%b'",
        10,
        "a LIKE pattern with 13 '%' before its end",
    ),
    (
        "format_number(value, 1000000000) = ''",
        22,
        "function 'format_number': its decimal places or format is 1,000,000,000",
    ),
    (
        "length(repeat('x', 2000000000)) > 0",
        20,
        "function 'repeat': its count is 2,000,000,000, at most 1,000",
    ),
    ("key LIKE concat('%', user)", 10, "LIKE takes a literal pattern"),
]


def messages(text: str, *, project: bool = False) -> list[str]:
    return [str(p) for p in check(text, project=project)]


@pytest.mark.parametrize(
    ("text", "name", "position"),
    [
        ("reflect('java.lang.System','getenv','DATABASE_URL')", "reflect", 1),
        ("reflect('java.lang.System','getenv')", "reflect", 1),
        ("reflect('java.lang.System','exit',3) > 0", "reflect", 1),
        ("java_method('java.lang.System','getProperty','user.name') = 'root'", "java_method", 1),
        ("try_reflect('java.lang.Thread','sleep', 1000) IS NULL", "try_reflect", 1),
        ("value > 1 AND raise_error('boom') IS NULL", "raise_error", 15),
        ("assert_true(value > 1) IS NULL", "assert_true", 1),
        ("rand() > 0.5", "rand", 1),
        ("input_file_name() LIKE '%x%'", "input_file_name", 1),
        ("current_user() = 'root'", "current_user", 1),
        ("my_udf(value) > 1", "my_udf", 1),
        ("regexp_extract(key, '(a+)+$', 1) = ''", "regexp_extract", 1),
        ("size(sequence(1, 2000000000)) > 0", "sequence", 6),
    ],
)
def test_a_refused_function_is_named_with_its_position(text: str, name: str, position: int) -> None:
    found = messages(text)
    assert found, text
    assert f"at character {position}: function '{name}' is not allowed" in found[0]


def test_the_leaking_project_column_is_refused_for_each_java_call() -> None:
    found = messages(LEAK_COLUMN, project=True)
    assert [m.split(":")[1].strip() for m in found] == [
        "function 'reflect' is not allowed",
        "function 'java_method' is not allowed",
    ]
    assert "calls Java methods" in found[0]


@pytest.mark.parametrize(
    "text",
    [
        SUBQUERY,
        "key IN (SELECT key FROM t)",
        "EXISTS (SELECT 1)",
        "value > (SELECT max(value) FROM json.`/etc/passwd`)",
    ],
)
def test_subqueries_and_data_sources_are_refused(text: str) -> None:
    assert any("subqueries" in m for m in messages(text, project=True))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("`sys`.`reflect`('a', 'b')", "qualified function names"),
        ("IDENTIFIER('reflect')('a')", "IDENTIFIER"),
        ("transform(array(1), x -> x + 1) IS NULL", "lambda"),
        ("count(DISTINCT key) > 1", "DISTINCT"),
        ("sum(value) OVER () > 1", "OVER"),
        ("key = 'a' -- ' OR reflect('a','b')", "comments"),
        ("key = 'a' /* */", "comments"),
        ("current_user = 'root'", "server's environment"),
        ("value; DROP TABLE x", "unexpected character ';'"),
        ("key RLIKE '(a+)+$'", "regular expressions"),
        ("CAST(value AS ARRAY<INT>) IS NULL", "only simple types"),
        ("value AS v", "AS names a project column"),
    ],
)
def test_constructs_outside_the_language_are_refused_with_a_reason(text: str, why: str) -> None:
    assert any(why in m for m in messages(text)), messages(text)


@pytest.mark.parametrize(
    ("text", "project"),
    [
        ("value > 10 AND key LIKE 'key-1%'", False),
        ("NOT (value BETWEEN 1 AND 2) OR key IN ('a', 'b')", False),
        ("user = 'u1' AND value IS NOT NULL", False),
        ("coalesce(nullif(key, ''), 'none') <> 'none'", False),
        ("get_json_object(payload, '$.a.b') = 'x'", False),
        ("CASE WHEN value > 100 THEN 'high' ELSE 'low' END AS band", True),
        ("upper(key) AS key", True),
        ("CAST(value AS DECIMAL(38, 10)) * 2 AS value", True),
        ("value::double / 3 AS third", True),
        ("date_format(to_timestamp(ts), 'yyyy-MM') AS month", True),
        ("ts - INTERVAL 2 HOURS AS earlier", True),
        ("concat_ws('-', key, user) `joined key`", True),
        ("sha2(user, 256) AS user", True),
        ("*", True),
        ("'it''s' || \"a\\\"b\" AS quoted", True),
        ("lpad(key, 12, '0') AS key", True),
        ("repeat('-', 3) || key AS ruled", True),
        ("key LIKE '%key%' OR key LIKE 'a_b%c%%' OR key ILIKE 'x!%%' ESCAPE '!'", False),
        ("format_string('%-12s|%08.2f', key, value) AS line", True),
        ("hex(hex(hex(key))) AS deep", True),
        ("abs(-value) % 3 DIV 2 + 1e3 - 2.5BD AS n", True),
    ],
)
def test_ordinary_expressions_are_admitted(text: str, project: bool) -> None:
    assert check(text, project=project) == []
    assert admit(text, project=project) == text


@pytest.mark.parametrize(("text", "position", "why"), HUGE_VALUES)
def test_expressions_that_build_huge_values_are_refused_where_they_grow(
    text: str, position: int, why: str
) -> None:
    found = messages(text)
    assert len(found) == 1 and found[0].startswith(f"at character {position}: {why}"), found


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("lpad(key, value, '0') = ''", "at character 11: function 'lpad' takes its length"),
        ("lpad(key, \u00b2, '0') = ''", "at character 11: function 'lpad' takes its length"),
        ("repeat(key, \u0663) = ''", "function 'repeat' takes its count as a literal integer"),
        ("repeat(key, 9) = ''", "repeat' could build a value 9 times as long as field 'key'"),
        ("key || key || key || key || key || key || key || key || key = ''", "operator '||'"),
        ("format_string(key, value) = ''", "function 'format_string' takes its format"),
        ("format_string('%.5000f', value) = ''", "a precision of 5,000 in its format"),
        ("rpad(key, 1001) = ''", "its length is 1,001, at most 1,000"),
        ("replace(key, 'a', user) = ''", "takes a replacement that is not built from a field"),
        ("concat_ws(key, user, 'x') = ''", "takes a separator that is not built from a field"),
        ("key LIKE '" + "_" * 201 + "'", "a LIKE pattern of 201 characters"),
        ("key LIKE '%a%b'", "a LIKE pattern with 2 '%' before its end"),
        ("upper(upper(key)) = ''", "function 'upper' could build a value 9 times"),
        ("date_format(key, user) = ''", "date_format' could build a value 32 times"),
        ("hex(hex(named_struct('a', hex(hex(key))).a)) = ''", "could build a value 16 times"),
        ("hex(hex(array(hex(hex(key)))[0])) = ''", "could build a value 16 times"),
    ],
)
def test_growth_functions_are_bounded_not_banned(text: str, why: str) -> None:
    assert any(why in m for m in messages(text)), messages(text)


def test_size_and_nesting_are_bounded() -> None:
    assert "longer than" in messages("a" * (MAX_EXPRESSION_CHARS + 1))[0]
    deep = "(" * (MAX_DEPTH + 5) + "a" + ")" * (MAX_DEPTH + 5)
    assert "nested more than" in messages(deep)[0]
    negations = "NOT " * 100_000 + "a"
    assert check(negations)  # refused, not a RecursionError
    with pytest.raises(ExpressionRefused, match="at character"):
        admit("reflect('a', 'b')")


def test_no_function_is_both_allowed_and_refused() -> None:
    assert not set(ALLOWED_FUNCTIONS) & set(REFUSED_FUNCTIONS)


ALLOWED_CALLS = sorted(name for name, kind in ALLOWED_FUNCTIONS.items() if kind != "cast")
atoms = st.one_of(
    st.sampled_from(["key", "value", "`user name`", "1", "2.5", "'text'", "NULL", "TRUE"]),
)


@st.composite
def admitted_expressions(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0:
        return draw(atoms)
    left = draw(admitted_expressions(depth=depth - 1))
    right = draw(admitted_expressions(depth=depth - 1))
    form = draw(st.integers(0, 4))
    if form == 0:
        return f"{draw(st.sampled_from(ALLOWED_CALLS))}({left}, {right})"
    if form == 1:
        operator = draw(st.sampled_from(["+", "-", "*", "/", "=", "<>", "AND", "OR", "||"]))
        return f"({left} {operator} {right})"
    if form == 2:
        return f"CASE WHEN {left} THEN {right} ELSE NULL END"
    if form == 3:
        return f"(NOT {left})"  # NOT binds looser than arithmetic, as in Spark
    return f"CAST({left} AS STRING)"


# What the budget says when it refuses an expression built from the language.
BUDGET_WORDS = ("could build a value", "as a literal", "not built from a field")


@settings(max_examples=200, deadline=None)
@given(admitted_expressions())
def test_anything_built_from_the_language_is_admitted_within_its_budget(text: str) -> None:
    assert all(any(w in m for w in BUDGET_WORDS) for m in messages(text)), messages(text)


@settings(max_examples=200, deadline=None)
@given(admitted_expressions(), st.sampled_from(sorted(REFUSED_FUNCTIONS)))
def test_a_refused_call_anywhere_is_found(text: str, name: str) -> None:
    hostile = f"{text} = {name}('x')"
    assert any(f"function '{name}' is not allowed" in m for m in messages(hostile))


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_admitted_or_refused_never_a_crash(text: str) -> None:
    result = check(text, project=True)
    assert isinstance(result, list)


def test_calls_before_a_subquery_are_named_too() -> None:
    # Given the column: a Java call, then a subquery over a file
    text = (
        "concat_ws('|', reflect('java.lang.System', 'getenv', 'DATABASE_URL'), "
        "(SELECT first(value) FROM text.`/etc/passwd`)) AS key"
    )
    # Then both are reported, in the order they appear
    found = messages(text, project=True)
    assert len(found) == 2
    assert found[0].startswith("at character 16: function 'reflect' is not allowed")
    assert found[1].startswith("at character 72: subqueries and table references")
