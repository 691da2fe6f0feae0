"""The worker's check of a filter condition or project column, on Spark's own parse.

The console admitted the expression with ``sparkjobs/expressions.py`` (pure Python).
Here, before any job runs, Spark's own SQL parser reads the very text that Spark will
execute, and every node of that parse must be of an allowed kind: a construct the two
parsers read differently is refused by at least one of them. A field reference must
name a field of the records, because Spark reads ``user`` or ``current_date`` as a
function when the data has no field of that name. What the parse may build is measured
by the console's budget (``sparkjobs/expression_budget.py``), on Spark's tree.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs import expression_budget, expressions
from sparkjobs.expressions import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    MAX_NODES,
    ExpressionProblem,
    ExpressionRefused,
    refusal_reason,
    words,
)
from sparkjobs.identity import distinct
from sparkjobs.reference import join_reference

#: Catalyst expressions the admitted language parses into (checked against Spark 4).
ALLOWED_NODES = frozenset(
    words(
        "Add Alias And BitwiseAnd BitwiseNot BitwiseOr BitwiseXor CaseWhen Cast Concat "
        "CreateNamedStruct Divide EqualNullSafe EqualTo GreaterThan GreaterThanOrEqual ILike "
        "In IntegralDivide IsNotNull IsNull LessThan LessThanOrEqual Like Literal Multiply "
        "Not Or Remainder ShiftLeft ShiftRight ShiftRightUnsigned Subtract UnaryMinus "
        "UnaryPositive UnresolvedAttribute UnresolvedExtractValue UnresolvedFunction"
    )
)
SUBQUERY_NODES = frozenset(
    words(
        "ScalarSubquery Exists ListQuery InSubquery LateralSubquery FunctionTableSubqueryArgument"
    )
)


@dataclass(frozen=True)
class _Part:
    """One node of Spark's parse, as far as the check needs it."""

    kind: str
    position: int
    name: str = ""  # function or field name
    detail: str = ""  # a function call's modifier Spark would honour (DISTINCT, FILTER...)


@dataclass(frozen=True)
class _Parse:
    parts: list[_Part]
    # What the budget reads of the parse; None when it is too complex to walk.
    term: expression_budget.Term | None


_parsed: dict[str, _Parse] = {}


def _parse(spark: SparkSession, text: str) -> _Parse:
    """Spark's parse of ``text`` as a flat list of parts and the budget's tree (cached:
    the parse never changes)."""
    cached = _parsed.get(text)
    if cached is not None:
        return cached
    parser = spark._jsparkSession.sessionState().sqlParser()  # Spark's own parser
    try:
        root = parser.parseExpression(text)
    except Exception as exc:  # noqa: BLE001 - py4j wraps Spark's ParseException
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problem = ExpressionProblem(0, f"Spark cannot parse it: {first}")
        raise ExpressionRefused(text, [problem]) from None
    parts = list(_walk(root))
    # Walked only within the bounds _walk checked, so the recursion is at most as deep.
    term = None if any(p.kind == "too complex" for p in parts) else _term(root)
    if len(_parsed) > 10_000:  # texts come from topologies: a handful per run
        _parsed.clear()
    _parsed[text] = parsed = _Parse(parts, term)
    return parsed


def _walk(root: Any) -> Iterator[_Part]:
    stack = [(root, 0)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        kind = node.getClass().getSimpleName()
        origin = node.origin().startIndex()
        position = int(origin.get()) if origin.isDefined() else 0
        if seen > MAX_NODES or depth > MAX_DEPTH:
            yield _Part("too complex", position)
            return
        if kind == "UnresolvedFunction":
            name_parts = node.nameParts()
            name = ".".join(name_parts.apply(i) for i in range(name_parts.size()))
            modifiers = [
                word
                for word, used in (
                    ("DISTINCT", node.isDistinct()),
                    ("FILTER", node.filter().isDefined()),
                    ("WITHIN GROUP", node.orderingWithinGroup().nonEmpty()),
                )
                if used
            ]
            yield _Part(kind, position, name, ", ".join(modifiers))
        elif kind == "UnresolvedAttribute":
            name_parts = node.nameParts()
            yield _Part(kind, position, str(name_parts.apply(0)) if name_parts.size() else "")
        elif kind == "UnresolvedStar":
            target = node.target()
            yield _Part(kind, position, "" if target.isEmpty() else "qualified")
        else:
            yield _Part(kind, position)
        children = node.children()
        stack.extend((children.apply(i), depth + 1) for i in range(children.size() - 1, -1, -1))


# Catalyst nodes whose value is built from their children's, by the budget's names;
# any other allowed node's value is a number or a boolean.
_BUILDING_NODES = {
    "Concat": "||",  # the parse of a || b; concat(a, b) stays a function
    "CaseWhen": "case",
    "Cast": "cast",
    "UnresolvedExtractValue": "[]",
    "CreateNamedStruct": "named_struct",
    "Like": "like",
    "ILike": "ilike",
}
_INTEGRAL_TYPES = frozenset(words("byte short integer long"))


def _term(node: Any) -> expression_budget.Term:
    """A Catalyst node as the budget reads it (sparkjobs/expression_budget.py)."""
    kind = node.getClass().getSimpleName()
    origin = node.origin().startIndex()
    position = int(origin.get()) if origin.isDefined() else 0
    children = node.children()
    args = [_term(children.apply(i)) for i in range(children.size())]
    if kind == "Alias":
        return args[0]
    if kind == "Literal":
        value, type_name = node.value(), node.dataType().typeName()
        if value is None:
            return expression_budget.Term("literal", "null", position)
        if type_name == "string":
            return expression_budget.Term("string", "", position, text=value.toString())
        if type_name == "binary":  # as hex digits, as the console's parser reads X'..'
            return expression_budget.Term("string", "", position, text=bytes(value).hex())
        if type_name in _INTEGRAL_TYPES:
            return expression_budget.Term("number", "", position, text=str(value))
        return expression_budget.Term("literal", type_name, position)
    if kind == "UnresolvedAttribute":
        name_parts = node.nameParts()
        name = str(name_parts.apply(0)) if name_parts.size() else ""
        return expression_budget.Term("column", name, position, text=name)
    if kind == "UnresolvedStar":
        return expression_budget.Term("literal", "*", position)
    if kind == "UnresolvedFunction":
        name_parts = node.nameParts()
        name = ".".join(name_parts.apply(i) for i in range(name_parts.size()))
        return expression_budget.Term("call", name, position, args)
    term = expression_budget.Term("call", _BUILDING_NODES.get(kind, "scalar"), position, args)
    if kind in ("Like", "ILike"):
        term.escape = str(node.escapeChar())
    return term


def problems(
    spark: SparkSession, text: str, *, fields: Collection[str], project: bool
) -> list[ExpressionProblem]:
    """Every reason Spark's parse of ``text`` is not admitted over records with ``fields``."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_EXPRESSION_CHARS:
        limit = f"must be a non-empty expression of at most {MAX_EXPRESSION_CHARS} characters"
        return [ExpressionProblem(0, limit)]
    known = {f.lower() for f in fields}
    found = []
    parsed = _parse(spark, text)
    for part in parsed.parts:
        problem = _problem(part, known, project=project)
        if problem:
            found.append(ExpressionProblem(part.position, problem))
    if parsed.term is not None:
        budget = expression_budget.problems(parsed.term)
        found.extend(ExpressionProblem(at, why) for at, why in budget)
    return sorted(found, key=lambda p: p.position)


def _problem(part: _Part, known: set[str], *, project: bool) -> str | None:
    if part.kind == "too complex":
        return f"too complex (more than {MAX_NODES} parts or {MAX_DEPTH} levels)"
    if part.kind in SUBQUERY_NODES:
        return "subqueries and table references are not allowed"
    if part.kind == "UnresolvedFunction":
        if "." in part.name:
            return f"qualified function names are not allowed ({part.name!r})"
        if part.detail:
            return f"{part.detail} in a call of {part.name!r} is not allowed"
        return refusal_reason(part.name)
    if part.kind == "UnresolvedAttribute":
        if part.name.lower() not in known:
            fields = ", ".join(sorted(known)) or "none"
            return f"unknown field {part.name!r} (the records have: {fields})"
        return None
    if part.kind == "UnresolvedStar":
        return None if project else "'*' is only a project column"
    if part.kind not in ALLOWED_NODES:
        return f"{part.kind or 'this construct'} is not allowed in an expression"
    return None


def admitted(
    spark: SparkSession, text: str, *, fields: Collection[str], project: bool = False
) -> Column:
    """The Spark column for ``text`` once Spark's parse of it is admitted; raises
    :class:`~sparkjobs.expressions.ExpressionRefused` before anything runs otherwise."""
    found = problems(spark, text, fields=fields, project=project)
    if found:
        raise ExpressionRefused(text, found)
    return F.expr(text)


def with_computed(
    frame: DataFrame, items: Sequence[str], *, keep: Collection[str] = ()
) -> DataFrame:
    """``frame`` with a column per ``expression AS name`` of ``items`` (computed group
    fields), each admitted over the fields ``frame`` had; a field of that name is
    replaced. ``keep``: columns that are not fields (the segment, the reader's line)."""
    spark = frame.sparkSession
    fields = [c for c in frame.columns if c not in keep]
    for item in items:
        tree = expressions.parse(item, project=True)
        if tree is None or tree.kind != "alias":
            raise ExpressionRefused(item, [ExpressionProblem(0, "not 'expression AS name'")])
        frame = frame.withColumn(tree.name, admitted(spark, item, fields=fields, project=True))
    return frame


def apply_record_step(
    frame: DataFrame,
    operator: str,
    params: Any,
    *,
    keep: Collection[str] = (),
    origin: str | None = None,
) -> DataFrame:
    """``frame`` after a filter, project, join or deduplicate node (the plain job's drop
    over the whole input), a filter's and a project's expressions admitted first.

    ``keep``: columns carried through a project untouched (the segment a record came
    from); they are neither fields an expression may name nor part of the output.
    ``origin``: the one of them naming the file a record was read from, for a join over
    a refreshed table (sparkjobs/reference.py).
    """
    spark = frame.sparkSession
    fields = [c for c in frame.columns if c not in keep]
    if operator == "filter":
        return frame.where(admitted(spark, params["condition"], fields=fields))
    if operator == "project":
        texts = params["columns"]
        columns = [admitted(spark, e, fields=fields, project=True) for e in texts]
        terms = [_parse(spark, e).term for e in texts]
        measured = [expression_budget.measure(t)[0] for t in terms if t is not None]
        row = expression_budget.row_problem([s for s in measured if s is not None])
        if row:
            raise ExpressionRefused(", ".join(texts), [ExpressionProblem(0, row)])
        return frame.select(*keep, *columns)
    if operator == "join":
        return join_reference(frame, params, keep=keep, origin=origin)
    if operator == "deduplicate":
        return distinct(frame, [str(f) for f in params["fields"]], keep)
    raise ValueError(f"unknown record operator {operator!r}")
