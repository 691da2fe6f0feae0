"""A ``sql`` stage: one ``SELECT ... FROM input [WHERE ...] [GROUP BY ...]`` statement,
compiled into what an aggregating stage already computes exactly: a condition (the
admitted expression language, sparkjobs/expressions.py) and grouped measures whose
partial states merge (sparkjobs/measures.py).

    SELECT carrier, origin, count(*) AS flights, avg(dep_delay) AS mean_delay,
           count(DISTINCT tailnum) AS tails,
           approx_percentile(dep_delay, 0.95) AS p95_delay
    FROM input WHERE dep_delay IS NOT NULL OR cancelled
    GROUP BY carrier, origin

A selected item is a field the statement groups by, or an aggregate call named with
``AS``: ``count(*)``, ``count(f)``, ``count(DISTINCT f)``, ``sum``, ``min``, ``max``,
``avg``, ``approx_count_distinct(f)``, ``approx_percentile(f, p)`` (or
``percentile_approx``). An aggregate whose result depends on the order records arrive in,
or that needs every value kept, a window function, a second statement, DDL, or any
clause beyond these is refused, saying which part and why: partials computed per batch
and merged in any order could not give it exactly.

Pure Python and linear in the statement's length: the console checks a statement
without a JVM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkjobs import expressions
from sparkjobs.expressions import Token
from sparkjobs.measures import Grouping, problems

MAX_STATEMENT_CHARS = 8000

# Aggregate calls and the measure each is, by the shape of its arguments.
_SIMPLE = {"sum": "sum", "min": "min", "max": "max", "avg": "avg", "mean": "avg"}
_PERCENTILES = ("approx_percentile", "percentile_approx")
# min_by(field, time) and max_by(field, time): the first and last value by an event time
_BY_TIME = {"min_by": "first", "max_by": "last"}
_ORDERED = (
    "its result depends on the order the records arrive in, which partials merged in any "
    "order do not keep"
)
_UNMERGEABLE: Mapping[str, str] = {
    **dict.fromkeys(
        expressions.words(
            "collect_list array_agg first first_value last last_value any_value string_agg listagg"
        ),
        _ORDERED,
    ),
    **dict.fromkeys(
        expressions.words("percentile percentile_cont percentile_disc median mode"),
        "it needs every value of a group kept; approx_percentile(field, p) merges a sketch",
    ),
    **dict.fromkeys(
        expressions.words("collect_set"),
        "a group's set of values is not a measure; count(DISTINCT field) counts it",
    ),
    **dict.fromkeys(
        expressions.words(
            "stddev stddev_pop stddev_samp std variance var_pop var_samp corr covar_pop "
            "covar_samp skewness kurtosis regr_slope bool_and bool_or every some "
            "bit_and bit_or bit_xor count_if count_min_sketch histogram_numeric"
        ),
        "it is not among the measures yet (count, sum, min, max, avg, count DISTINCT, "
        "approx_count_distinct, approx_percentile, min_by, max_by)",
    ),
    **dict.fromkeys(
        expressions.words("row_number rank dense_rank percent_rank ntile lag lead cume_dist"),
        "a window function over the whole stream cannot be merged from partials",
    ),
}
_STATEMENTS = frozenset(
    expressions.words(
        "create drop alter insert update delete merge truncate with values table show "
        "describe explain set reset use cache uncache refresh analyze grant revoke load"
    )
)
# Clauses after FROM a statement may not have, and why.
_CLAUSES: Mapping[str, str] = {
    "having": "HAVING filters merged groups; filter the result instead",
    "order": "ORDER BY has no meaning for a result merged as data arrives",
    "limit": "LIMIT would keep whichever groups came first",
    "union": "one SELECT only",
    "join": "join reference data with a join stage before this one",
    "window": "window functions cannot be merged from partials",
    "qualify": "window functions cannot be merged from partials",
    "lateral": "a generator is not a measure",
    "distribute": "the console distributes the records",
    "cluster": "the console distributes the records",
    "sort": "SORT BY has no meaning for a result merged as data arrives",
}


class StatementError(ValueError):
    """A statement that is not admitted; ``problems`` say what and where."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# An expression's tokens as two expressions are compared (``_shape``).
Shape = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Query:
    """What a statement computes: its records ``where`` holds (None: all), grouped."""

    grouping: Grouping
    where: str | None


def compiled(statement: Any) -> Query:
    """The query ``statement`` says; raises :class:`StatementError` with every problem,
    each saying where it is (the character, counted from 1)."""
    if not isinstance(statement, str) or not statement.strip():
        raise StatementError(["must be one SELECT statement"])
    if len(statement) > MAX_STATEMENT_CHARS:
        raise StatementError([f"longer than {MAX_STATEMENT_CHARS} characters"])
    text = statement.rstrip()
    text = text[:-1].rstrip() if text.endswith(";") else text
    try:
        tokens = expressions.tokens(text)
    except expressions.ExpressionRefused as refused:
        problem = refused.problems[0]
        if text[problem.position : problem.position + 1] == ";":
            raise StatementError(
                [f"at character {problem.position + 1}: one statement only (a ';' ends it)"]
            ) from None
        raise StatementError([str(problem)]) from None
    return _Statement(text, tokens).query()


def query_of(params: Mapping[str, Any]) -> Query | None:
    """What an aggregating stage computes by grouped measures: a ``sql`` stage's
    statement, or an ``aggregate`` stage's ``group_by`` and ``measures`` (all of its
    records; the key form's as sparkjobs/key_form.py reads it); None for parameters that
    are not valid (their checks say why)."""
    if "statement" in params:
        try:
            return compiled(params["statement"])
        except StatementError:
            return None
    grouping = Grouping.of(params)
    return None if grouping is None else Query(grouping, None)


def problems_of(statement: Any) -> list[str]:
    """Every problem of ``statement``, or none."""
    try:
        compiled(statement)
    except StatementError as error:
        return error.problems
    return []


class _Statement:
    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.said: list[str] = []
        self.ends: dict[str, int] = {}  # where each clause's text ends

    def at(self, token: Token, message: str) -> None:
        self.said.append(f"at character {token.position + 1}: {message}")

    def query(self) -> Query:
        first = self.tokens[0]
        if first.word() != "select":
            shown = first.text.upper() if first.word() in _STATEMENTS else repr(first.text)
            self.at(first, f"must be one SELECT statement, not {shown}")
            raise StatementError(self.said)
        clauses = self._clauses()
        if "from" not in clauses:
            self.at(self.tokens[-1], "FROM input is missing")
            raise StatementError(self.said)
        source = clauses["from"]
        if [t.word() for t in source] != ["input"]:
            where = source[0] if source else self.tokens[-1]
            self.at(where, "FROM must name input (the records reaching this stage), only")
        group_by = self._group_items(clauses.get("group by"))
        fields, computed, measures = self._select(clauses["select"], group_by)
        where_text = self._condition(clauses.get("where"))
        grouped = self._same_fields(fields, computed, group_by)
        if self.said:
            raise StatementError(self.said)
        params = {"group_by": grouped, "measures": measures}
        found = problems(params)
        if found:
            raise StatementError([_in_statement(problem, grouped) for problem in found])
        grouping = Grouping.of(params)
        if grouping is None:  # problems() found none: it is a grouping
            raise StatementError(["not a grouping"])
        return Query(grouping, where_text)

    def _clauses(self) -> dict[str, list[Token]]:
        """The tokens of each clause, by its keyword, split at depth 0, in the order
        SELECT, FROM, WHERE, GROUP BY; where each clause's text ends (``self.ends``)."""
        order = ("select", "from", "where", "group by")
        clauses: dict[str, list[Token]] = {}
        current = "select"
        clauses[current] = []
        depth = 0
        i = 1
        while self.tokens[i].kind != "end":
            token = self.tokens[i]
            word = token.word()
            if token.text == "(":
                depth += 1
            elif token.text == ")":
                depth -= 1
            if depth == 0 and word in ("from", "where", "group"):
                name = word
                if word == "group":
                    if self.tokens[i + 1].word() != "by":
                        self.at(token, "GROUP must be followed by BY")
                    i += 1
                    name = "group by"
                if name in clauses:
                    self.at(token, f"{name.upper()} is given twice")
                elif order.index(name) < order.index(current):
                    self.at(token, f"{name.upper()} comes after {current.upper()}")
                self.ends[current] = token.position
                current = name
                clauses[current] = []
            elif depth == 0 and word in _CLAUSES:
                self.at(token, f"{token.text.upper()} is not allowed: {_CLAUSES[word]}")
                break
            elif depth == 0 and word == "select":
                self.at(token, "one SELECT only, without subqueries")
                break
            else:
                clauses[current].append(token)
            i += 1
        self.ends.setdefault(current, self.tokens[i].position)
        return clauses

    def _items(self, tokens: list[Token]) -> list[list[Token]]:
        """``tokens`` split at commas at depth 0."""
        items: list[list[Token]] = [[]]
        depth = 0
        for token in tokens:
            if token.text == "(":
                depth += 1
            elif token.text == ")":
                depth -= 1
            if depth == 0 and token.kind == "op" and token.text == ",":
                items.append([])
            else:
                items[-1].append(token)
        return items

    def _group_items(self, tokens: list[Token] | None) -> list[list[Token]]:
        """GROUP BY's items: a field (or a selected expression's AS name), or an
        expression, which SELECT names with AS."""
        if tokens is None:
            return []
        items = self._items(tokens)
        for item in items:
            if not item:
                self.at(self.tokens[-1], "GROUP BY names nothing")
        return [item for item in items if item]

    def _select(
        self, tokens: list[Token], group_by: list[list[Token]]
    ) -> tuple[list[Token], dict[str, tuple[Shape, str]], list[dict[str, Any]]]:
        """The fields selected; the group fields computed, by their names (each its
        expression's shape and its ``expression AS name``): an expression GROUP BY has,
        or whose name it has; and the measures, each named by its AS."""
        fields: list[Token] = []
        computed: dict[str, tuple[Shape, str]] = {}
        measures: list[dict[str, Any]] = []
        expressions_grouped = {_shape(item) for item in group_by if not _is_field(item)}
        items = self._items(tokens)
        # A name GROUP BY has is a selected field's, else an expression's AS name.
        plain = {item[0].text.lower() for item in items if _is_field(item)}
        names_grouped = {item[0].text.lower() for item in group_by if _is_field(item)} - plain
        for item in items:
            if not item:
                self.at(self.tokens[-1], "an empty item in SELECT")
                continue
            if len(item) == 1 and item[0].kind in ("ident", "quoted"):
                fields.append(item[0])
                continue
            if item[0].text == "*":
                self.at(item[0], "SELECT * is not a measure; name the fields and measures")
                continue
            named = (
                len(item) >= 3 and item[-2].word() == "as" and item[-1].kind in ("ident", "quoted")
            )
            if not named:
                self.at(item[0], "name each measure with AS (count(*) AS flights)")
                continue
            if _shape(item[:-2]) in expressions_grouped or item[-1].text.lower() in names_grouped:
                text = self.text[item[0].position : item[-2].position].rstrip()
                computed[item[-1].text.lower()] = (_shape(item[:-2]), f"{text} AS {item[-1].text}")
                continue
            measure = self._measure(item[:-2])
            if measure is not None:
                measures.append({"name": item[-1].text, **measure})
        if len(fields) + len(computed) == len(items):
            self.at(tokens[0] if tokens else self.tokens[-1], "select at least one measure")
        return fields, computed, measures

    def _measure(self, call: list[Token]) -> dict[str, Any] | None:
        """The measure an aggregate call is: ``fn(args)``, nothing else."""
        head = call[0]
        name = head.word()
        if any(t.word() == "over" for t in call):
            self.at(head, "a window function (OVER) cannot be merged from partials")
            return None
        shaped = len(call) >= 3 and head.kind == "ident" and call[1].text == "(" and _closes(call)
        if not shaped:
            self.at(
                head,
                "a measure is one aggregate call, e.g. avg(dep_delay); compute other "
                "values in a project stage",
            )
            return None
        if name in _UNMERGEABLE:
            self.at(head, f"{head.text}() cannot be a measure: {_UNMERGEABLE[name]}")
            return None
        args = call[2:-1]
        if name == "count":
            return self._count(head, args)
        if name in _SIMPLE or name == "approx_count_distinct":
            fn = _SIMPLE.get(name, name)
            if len(args) == 1 and args[0].kind in ("ident", "quoted"):
                return {"fn": fn, "field": args[0].text}
            self.at(head, f"{head.text}() takes one field")
            return None
        if name in _BY_TIME:
            shape = [t.kind for t in args]
            if (
                shape in (["ident", "op", "ident"], ["quoted", "op", "quoted"])
                and args[1].text == ","
            ):
                return {"fn": _BY_TIME[name], "field": args[0].text, "by": args[2].text}
            self.at(head, f"{head.text}() takes a field and the event time field, (tailnum, t)")
            return None
        if name in _PERCENTILES:
            shape = [t.kind for t in args]
            if shape == ["ident", "op", "number"] and args[1].text == ",":
                return {
                    "fn": "approx_percentile",
                    "field": args[0].text,
                    "percentile": float(args[2].text),
                }
            self.at(head, f"{head.text}() takes a field and a percentile, e.g. (dep_delay, 0.95)")
            return None
        self.at(
            head,
            f"{head.text}() is not an aggregate this stage computes; compute other values in "
            "a project stage before it",
        )
        return None

    def _count(self, head: Token, args: list[Token]) -> dict[str, Any] | None:
        shape = [(t.kind, t.word()) for t in args]
        if len(args) == 1 and (args[0].text == "*" or args[0].kind == "number"):
            return {"fn": "count"}
        if len(args) == 1 and args[0].kind in ("ident", "quoted"):
            return {"fn": "count", "field": args[0].text}
        if (
            len(args) == 2
            and shape[0] == ("ident", "distinct")
            and args[1].kind in ("ident", "quoted")
        ):
            return {"fn": "count_distinct", "field": args[1].text}
        self.at(head, "count() takes *, a field, or DISTINCT and a field")
        return None

    def _condition(self, tokens: list[Token] | None) -> str | None:
        """The WHERE condition's text, admitted as a filter's condition is."""
        if tokens is None:
            return None
        if not tokens:
            self.at(self.tokens[-1], "WHERE has no condition")
            return None
        start = tokens[0].position
        condition = self.text[start : self.ends["where"]].rstrip()
        for problem in expressions.check(condition):
            self.said.append(
                f"at character {start + problem.position + 1}: {problem.message} (in WHERE)"
            )
        return condition

    def _same_fields(
        self,
        selected: list[Token],
        computed: dict[str, tuple[Shape, str]],
        grouped: list[list[Token]],
    ) -> list[str]:
        """A selected field is grouped by, and what is grouped by is selected (an
        expression named with AS); the stage's group_by, in GROUP BY's order."""
        named = {item[0].text.lower() for item in grouped if _is_field(item)}
        for token in selected:
            if token.text.lower() not in named:
                self.at(token, f"{token.text!r} is selected but not in GROUP BY")
        chosen = {t.text.lower(): t.text for t in selected}
        by_shape = dict(computed.values())
        group_by = []
        for item in grouped:
            if _is_field(item) and item[0].text.lower() in chosen:
                group_by.append(chosen[item[0].text.lower()])
            elif _is_field(item) and item[0].text.lower() in computed:
                group_by.append(computed[item[0].text.lower()][1])
            elif not _is_field(item) and _shape(item) in by_shape:
                group_by.append(by_shape[_shape(item)])
            elif _is_field(item):
                self.at(item[0], f"{item[0].text!r} is grouped by but not selected")
            else:
                self.at(item[0], "an expression grouped by must be selected, named with AS")
        return list(dict.fromkeys(group_by))


def _in_statement(problem: str, grouped: list[str]) -> str:
    """A problem of the grouping a statement compiles to, said of the statement: a group
    field's as of the GROUP BY item it is (its characters counted in that item)."""
    head, _, rest = problem.partition("] ")
    if head.startswith("group_by[") and head[9:].isdigit() and int(head[9:]) < len(grouped):
        item = grouped[int(head[9:])]
        return f"in GROUP BY's {item[:80]!r}: {rest}"
    return problem


def _is_field(item: list[Token]) -> bool:
    return len(item) == 1 and item[0].kind in ("ident", "quoted")


def _shape(item: list[Token]) -> Shape:
    """An expression's tokens as compared: names whatever their case, the rest as
    written."""
    return tuple((t.kind, t.word() if t.kind == "ident" else t.text) for t in item)


def _closes(call: list[Token]) -> bool:
    """Whether the parenthesis after a call's name closes at its last token."""
    depth = 0
    for index, token in enumerate(call[1:], start=1):
        depth += {"(": 1, ")": -1}.get(token.text, 0) if token.kind == "op" else 0
        if depth == 0:
            return index == len(call) - 1
    return False
