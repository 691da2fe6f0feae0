"""What a filter condition or a project column may say: an allow-list, not a string.

An operator's pipeline is data, not a program. Spark SQL expressions can call Java
(``reflect``, ``java_method``), read files (a scalar subquery over ``text.`/etc/passwd```),
kill the JVM, sleep, or read the environment, so an expression is admitted only when
every part of it is on the lists below: column references, literals, operators,
CASE, casts to simple types, and pure, deterministic built-in functions.

Two independent parsers check every expression. This module's (pure Python, so the
console validates a topology without a JVM) runs when a pipeline is saved and when a
run starts; ``sparkjobs/expression_guard.py`` walks Spark's own parse of the same text
on the worker before the job runs, so the text Spark executes is the text that was
checked, by the parser that executes it. A construct one parser reads differently
from the other is refused by at least one of them.

Deliberately left out (each would let an operator act outside the data or starve a
shared worker): subqueries and table or file references, Java reflection, errors
raised on purpose (``raise_error``, ``assert_true``), user-defined and catalog
functions, generators, lambdas and higher-order functions, aggregate and window
functions, non-deterministic functions (random, current time and user, input file
names), regular expressions (a crafted pattern backtracks for hours on one shared
JVM) and functions that build collections of a size an argument chooses
(``sequence``, ``array_repeat``). What an admitted expression may build is bounded
too (``sparkjobs/expression_budget.py``): functions that grow a value (``repeat``,
``lpad``, ``format_string``, ``hex``...) are admitted with literal sizes within a
budget, ``LIKE`` with a literal pattern that cannot backtrack far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sparkjobs import expression_budget

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 40
MAX_NODES = 400


def words(text: str) -> list[str]:
    return text.split()


_STRING = (
    "ascii base64 bit_length btrim char char_length character_length chr concat concat_ws "
    "contains endswith format_number format_string initcap instr lcase left len length "
    "levenshtein locate lower lpad ltrim luhn_check mask octet_length overlay position repeat "
    "replace reverse right rpad rtrim soundex space split_part startswith substr substring "
    "substring_index "
    "to_binary to_char to_number to_varchar translate trim try_to_number ucase unbase64 "
    "upper"
)
_MATH = (
    "abs acos acosh asin asinh atan atan2 atanh bin bround cbrt ceil ceiling conv cos cosh "
    "cot csc degrees div e exp expm1 factorial floor greatest hex hypot least ln log log10 "
    "log1p log2 mod negative pi pmod positive pow power radians rint round sec sign signum "
    "sin sinh sqrt tan tanh try_add try_divide try_multiply try_subtract unhex width_bucket "
    "bit_count bit_get getbit shiftleft shiftright shiftrightunsigned"
)
_DATETIME = (
    "add_months convert_timezone date_add date_diff date_format date_from_unix_date "
    "date_part date_sub date_trunc dateadd datediff datepart day dayname dayofmonth "
    "dayofweek dayofyear extract from_unixtime from_utc_timestamp hour last_day "
    "make_date make_dt_interval make_interval make_timestamp make_timestamp_ltz "
    "make_timestamp_ntz make_ym_interval minute month monthname months_between next_day "
    "quarter second timestamp_micros timestamp_millis timestamp_seconds "
    "timestampadd timestampdiff to_date to_timestamp to_timestamp_ltz to_timestamp_ntz "
    "to_unix_timestamp to_utc_timestamp trunc try_make_interval try_make_timestamp "
    "try_to_timestamp unix_date unix_micros unix_millis unix_seconds weekday weekofyear "
    "year"
)
_CONDITIONAL = (
    "between coalesce if ifnull isnan isnotnull isnull nanvl nullif nullifzero nvl nvl2 "
    "zeroifnull equal_null"
)
_JSON = "get_json_object json_array_length json_object_keys to_json"
_CAST = (
    "bigint binary boolean cast date decimal double float int smallint string timestamp "
    "tinyint try_cast typeof"
)
_HASH = "crc32 hash md5 sha sha1 sha2 xxhash64"
_COLLECTION = (
    "array array_contains array_distinct array_max array_min array_position array_size "
    "arrays_overlap cardinality element_at map map_contains_key map_keys map_values "
    "named_struct size struct try_element_at"
)

#: Every function an expression may call, by the name Spark knows it, with its kind.
ALLOWED_FUNCTIONS: dict[str, str] = {
    name: kind
    for kind, names in (
        ("string", _STRING),
        ("math", _MATH),
        ("date/time", _DATETIME),
        ("conditional", _CONDITIONAL),
        ("JSON", _JSON),
        ("cast", _CAST),
        ("hash", _HASH),
        ("collection", _COLLECTION),
    )
    for name in words(names)
}

_REFUSED = (
    ("reflect java_method try_reflect", "it calls Java methods"),
    ("raise_error assert_true", "it raises errors on purpose"),
    (
        "rand randn random uuid shuffle monotonically_increasing_id spark_partition_id "
        "current_date current_timestamp now curdate current_timezone localtimestamp "
        "unix_timestamp uniform",
        "it is not deterministic, so a retried batch would give other results",
    ),
    (
        "input_file_name input_file_block_start input_file_block_length",
        "it reveals where the data is stored",
    ),
    (
        "current_user user session_user current_database current_schema current_catalog version",
        "it reveals the server's environment",
    ),
    (
        "explode explode_outer posexplode posexplode_outer inline inline_outer stack json_tuple",
        "it is a generator (one record in, many out)",
    ),
    (
        "transform filter exists forall aggregate reduce zip_with map_filter transform_keys "
        "transform_values map_zip_with array_sort",
        "higher-order functions (lambdas) are not allowed",
    ),
    (
        "rlike regexp regexp_like regexp_replace regexp_extract regexp_extract_all "
        "regexp_count regexp_instr regexp_substr split str_to_map",
        "regular expressions can run for hours on a crafted pattern; use LIKE",
    ),
    (
        "sequence array_repeat randstr",
        "an argument chooses the size of its output, which can exhaust a worker's memory",
    ),
    (
        "count sum avg mean min max collect_list collect_set first last any_value "
        "approx_count_distinct percentile row_number rank dense_rank lag lead",
        "aggregate and window functions belong in an aggregate node",
    ),
)

#: Why some well-known functions are refused (any other function is refused too).
REFUSED_FUNCTIONS: dict[str, str] = {name: why for names, why in _REFUSED for name in words(names)}

#: Names Spark resolves to a function when no field of that name exists.
LITERAL_FUNCTIONS = frozenset(
    words(
        "current_date current_timestamp current_time current_user user session_user "
        "current_database current_schema current_catalog grouping__id"
    )
)
SIMPLE_TYPES = frozenset(
    words(
        "string varchar char int integer bigint smallint tinyint long short byte double float "
        "real decimal dec numeric boolean bool date timestamp timestamp_ntz timestamp_ltz "
        "binary"
    )
)
INTERVAL_UNITS = frozenset(
    unit + plural
    for unit in words("year month week day hour minute second millisecond microsecond")
    for plural in ("", "s")
)
_SUBQUERY_WORDS = frozenset(words("select from with values table where join union lateral"))
_COMPARISONS = ("=", "==", "<=>", "!=", "<>", "<", "<=", ">", ">=")
# Longest first, so that "<=>" is not read as "<=" then ">".
_OPERATORS = sorted(
    words("<=> >>> <= >= <> != == || :: -> << >> = < > + - * / % & | ^ ~ ! ( ) , . [ ]"),
    key=len,
    reverse=True,
)


@dataclass(frozen=True)
class ExpressionProblem:
    position: int  # 0-based offset of the character where the problem is
    message: str

    def __str__(self) -> str:
        return f"at character {self.position + 1}: {self.message}"


class ExpressionRefused(ValueError):
    """An expression that is not admitted; ``problems`` say what and where."""

    def __init__(self, text: str, problems: list[ExpressionProblem]) -> None:
        shown = text if len(text) <= 80 else text[:77] + "..."
        super().__init__(f"expression {shown!r}: " + "; ".join(str(p) for p in problems))
        self.text = text
        self.problems = problems


def refusal_reason(name: str) -> str | None:
    """Why the function ``name`` may not be called, or None when it may."""
    lowered = name.lower()
    if lowered in ALLOWED_FUNCTIONS:
        return None
    why = REFUSED_FUNCTIONS.get(lowered, "it is not on the list of allowed functions")
    return f"function {name!r} is not allowed: {why}"


# -- tokens ------------------------------------------------------------------------------

TokenKind = Literal["ident", "quoted", "string", "number", "op", "end"]


@dataclass(frozen=True)
class Token:
    kind: TokenKind
    text: str
    position: int

    def word(self) -> str:
        """The lower-cased keyword this token may be (never a quoted identifier)."""
        return self.text.lower() if self.kind == "ident" else ""


class _Stop(Exception):
    def __init__(self, position: int, message: str) -> None:
        super().__init__(message)
        self.problem = ExpressionProblem(position, message)


def _tokens(text: str) -> list[Token]:
    found: list[Token] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith(("--", "/*"), i):
            raise _Stop(i, "comments are not allowed in an expression")
        elif c in "'\"" or (c in "rR" and i + 1 < n and text[i + 1] in "'\""):
            i = _string(text, i, found)
        elif c == "`":
            end = i + 1
            name = []
            while True:
                stop = text.find("`", end)
                if stop < 0:
                    raise _Stop(i, "unclosed ` quote")
                name.append(text[end:stop])
                if text.startswith("``", stop):
                    name.append("`")
                    end = stop + 2
                    continue
                break
            found.append(Token("quoted", "".join(name), i))
            i = stop + 1
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            i = _number(text, i, found)
        elif c.isalpha() or c == "_":
            end = i
            while end < n and (text[end].isalnum() or text[end] == "_"):
                end += 1
            found.append(Token("ident", text[i:end], i))
            i = end
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise _Stop(i, f"unexpected character {c!r}")
            found.append(Token("op", op, i))
            i += len(op)
    found.append(Token("end", "", n))
    return found


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` as the admitted language reads them (names, quoted names,
    strings, numbers, operators), ending with an ``end`` token; raises
    :class:`ExpressionRefused` at a character outside the language."""
    try:
        return _tokens(text)
    except _Stop as stop:
        raise ExpressionRefused(text, [stop.problem]) from None


def _string(text: str, start: int, found: list[Token]) -> int:
    i = start + (1 if text[start] in "rR" else 0)
    raw = i != start
    quote = text[i]
    i += 1
    value = []
    while True:
        if i >= len(text):
            raise _Stop(start, "unclosed string")
        c = text[i]
        if c == "\\" and not raw and i + 1 < len(text):
            value.append(text[i + 1])
            i += 2
        elif c == quote and text.startswith(quote * 2, i):
            value.append(quote)
            i += 2
        elif c == quote:
            found.append(Token("string", "".join(value), start))
            return i + 1
        else:
            value.append(c)
            i += 1


def _number(text: str, start: int, found: list[Token]) -> int:
    i = start
    n = len(text)
    while i < n and (text[i].isdigit() or text[i] == "."):
        i += 1
    if i < n and text[i] in "eE" and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] in "+-"):
        i += 2
        while i < n and text[i].isdigit():
            i += 1
    for suffix in ("BD", "L", "S", "Y", "D", "F"):
        if text[i : i + len(suffix)].upper() == suffix:
            i += len(suffix)
            break
    if i < n and (text[i].isalnum() or text[i] == "_"):
        raise _Stop(start, f"malformed number {text[start : i + 1]!r}")
    found.append(Token("number", text[start:i], start))
    return i


# -- the parse tree ----------------------------------------------------------------------

NodeKind = Literal["column", "string", "number", "literal", "function", "operator", "star", "alias"]


@dataclass
class Node:
    kind: NodeKind
    name: str
    position: int
    children: list[Node] = field(default_factory=list)
    cast_to: str = ""  # a cast's target type, as written (``bigint``, ``decimal``)


class _Parser:
    """Recursive descent over the admitted subset of Spark SQL's expression grammar.

    The tree's shape matters less than its completeness: every token ends up in a node
    or is refused, so nothing reaches Spark unseen. Precedence follows Spark's grammar.
    """

    def __init__(self, text: str, *, project: bool) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.depth = 0
        self.made: list[Node] = []
        self.project = project

    # token helpers
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.at += 1
        return token

    def is_op(self, *ops: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text in ops

    def is_word(self, *words: str) -> bool:
        return self.peek().word() in words

    def expect_op(self, op: str) -> Token:
        if not self.is_op(op):
            raise self.unexpected(f"expected {op!r}")
        return self.take()

    def expect_word(self, word: str) -> Token:
        if not self.is_word(word):
            raise self.unexpected(f"expected {word.upper()}")
        return self.take()

    def unexpected(self, hint: str = "") -> _Stop:
        token = self.peek()
        if token.kind == "end":
            return _Stop(
                token.position, f"the expression ends too early{'; ' + hint if hint else ''}"
            )
        shown = token.text if token.kind != "string" else f"'{token.text}'"
        return _Stop(token.position, f"unexpected {shown!r}{'; ' + hint if hint else ''}")

    def node(self, kind: NodeKind, name: str, position: int, *children: Node) -> Node:
        if len(self.made) >= MAX_NODES:
            raise _Stop(position, f"too complex (more than {MAX_NODES} parts)")
        made = Node(kind, name, position, list(children))
        self.made.append(made)
        return made

    # grammar
    def parse(self) -> Node:
        if self.project and self.is_op("*") and self.peek(1).kind == "end":
            return self.node("star", "*", self.take().position)
        tree = self.expression()
        if self.project and (self.is_word("as") or self.peek().kind in ("ident", "quoted")):
            if self.is_word("as"):
                self.take()
            alias = self.take()
            if alias.kind not in ("ident", "quoted"):
                raise _Stop(alias.position, "expected a column name after AS")
            tree = self.node("alias", alias.text, alias.position, tree)
        if not self.project and self.is_word("as"):
            raise _Stop(self.peek().position, "AS names a project column; a condition has no name")
        if self.peek().kind != "end":
            raise self.unexpected("expected the end of the expression")
        return tree

    def expression(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Stop(self.peek().position, f"nested more than {MAX_DEPTH} levels deep")
        try:
            return self.binary(self.conjunction, ("or",), words=True)
        finally:
            self.depth -= 1

    def binary(
        self, operand: Callable[[], Node], ops: tuple[str, ...], *, words: bool = False
    ) -> Node:
        left = operand()
        while self.is_word(*ops) if words else self.is_op(*ops):
            token = self.take()
            left = self.node("operator", token.text.lower(), token.position, left, operand())
        return left

    def conjunction(self) -> Node:
        return self.binary(self.negation, ("and",), words=True)

    def negation(self) -> Node:
        if self.is_word("not") or self.is_op("!"):
            token = self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Stop(token.position, f"nested more than {MAX_DEPTH} levels deep")
            try:
                return self.node("operator", "not", token.position, self.negation())
            finally:
                self.depth -= 1
        return self.predicate()

    def predicate(self) -> Node:
        left = self.comparison()
        while True:
            start = self.peek()
            if self.is_word("not") and self.peek(1).word() in ("between", "in", "like", "ilike"):
                self.take()
            word = self.peek().word()
            if word in ("rlike", "regexp"):
                raise _Stop(start.position, refusal_reason(word) or "")
            suffix = {
                "between": self.between,
                "in": self.in_list,
                "like": self.like,
                "ilike": self.like,
                "is": self.is_test,
            }.get(word)
            if suffix is None:
                return left
            left = suffix(left, self.take())

    def between(self, left: Node, word: Token) -> Node:
        low = self.comparison()
        self.expect_word("and")
        return self.node("function", "between", word.position, left, low, self.comparison())

    def in_list(self, left: Node, word: Token) -> Node:
        self.expect_op("(")
        if self.peek().word() in _SUBQUERY_WORDS:
            raise _Stop(self.peek().position, "subqueries are not allowed")
        items = [left, self.expression()]
        while self.is_op(","):
            self.take()
            items.append(self.expression())
        self.expect_op(")")
        return self.node("operator", "in", word.position, *items)

    def like(self, left: Node, word: Token) -> Node:
        if self.peek().word() in ("any", "all", "some"):
            quantifier = self.peek()
            message = f"{word.text.upper()} {quantifier.text.upper()} is not allowed"
            raise _Stop(quantifier.position, message)
        tree = self.node("operator", word.word(), word.position, left, self.comparison())
        if self.is_word("escape"):
            self.take()
            if self.peek().kind != "string":
                raise self.unexpected("ESCAPE takes a string")
            escape = self.take()
            tree.children.append(self.node("string", escape.text, escape.position))
        return tree

    def is_test(self, left: Node, word: Token) -> Node:
        if self.is_word("not"):
            self.take()
        if self.is_word("null", "true", "false"):
            self.take()
            return self.node("operator", "is", word.position, left)
        if self.is_word("distinct"):
            self.take()
            self.expect_word("from")
            return self.node("operator", "is distinct", word.position, left, self.comparison())
        raise self.unexpected("expected NULL, TRUE, FALSE or DISTINCT FROM after IS")

    def comparison(self) -> Node:
        return self.binary(self.bit_or, _COMPARISONS)

    def bit_or(self) -> Node:
        return self.binary(self.bit_xor, ("|",))

    def bit_xor(self) -> Node:
        return self.binary(self.bit_and, ("^",))

    def bit_and(self) -> Node:
        return self.binary(self.shift, ("&",))

    def shift(self) -> Node:
        return self.binary(self.additive, ("<<", ">>", ">>>"))

    def additive(self) -> Node:
        return self.binary(self.multiplicative, ("+", "-", "||"))

    def multiplicative(self) -> Node:
        left = self.unary()
        while self.is_op("*", "/", "%") or self.is_word("div"):
            token = self.take()
            left = self.node("operator", token.text.lower(), token.position, left, self.unary())
        return left

    def unary(self) -> Node:
        if self.is_op("-", "+", "~"):
            token = self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Stop(token.position, f"nested more than {MAX_DEPTH} levels deep")
            try:
                return self.node("operator", token.text, token.position, self.unary())
            finally:
                self.depth -= 1
        return self.postfix()

    def postfix(self) -> Node:
        tree = self.primary()
        while True:
            if self.is_op("."):
                self.take()
                name = self.take()
                if name.kind not in ("ident", "quoted"):
                    raise _Stop(name.position, "expected a field name after '.'")
                tree = self.node("operator", ".", name.position, tree)
            elif self.is_op("["):
                token = self.take()
                index = self.expression()
                self.expect_op("]")
                tree = self.node("operator", "[]", token.position, tree, index)
            elif self.is_op("::"):
                token = self.take()
                target = self.data_type()
                tree = self.node("function", "cast", token.position, tree)
                tree.cast_to = target
            else:
                return tree

    def primary(self) -> Node:
        token = self.peek()
        word = token.word()
        if token.kind == "string":
            self.take()
            value = [token.text]
            while self.peek().kind == "string":  # 'a' 'b' is one literal in Spark
                value.append(self.take().text)
            return self.node("string", "".join(value), token.position)
        if token.kind == "number":
            self.take()
            return self.node("number", token.text, token.position)
        if self.is_op("("):
            self.take()
            if self.peek().word() in _SUBQUERY_WORDS:
                raise _Stop(self.peek().position, "subqueries and table references are not allowed")
            inner = self.expression()
            if self.is_op(","):
                raise _Stop(self.peek().position, "row values (a, b) are not allowed")
            self.expect_op(")")
            return inner
        if token.kind == "op":
            if token.text == "*":
                raise _Stop(token.position, "'*' stands alone: a project column of its own")
            raise self.unexpected()
        if token.kind == "end":
            raise self.unexpected()
        if word in ("true", "false", "null"):
            self.take()
            return self.node("literal", word, token.position)
        if word in _SUBQUERY_WORDS:
            raise _Stop(token.position, "subqueries and table references are not allowed")
        if word == "case":
            return self.case()
        if word in ("cast", "try_cast") and self.peek(1).text == "(":
            self.take()
            self.take()
            inner = self.expression()
            self.expect_word("as")
            target = self.data_type()
            self.expect_op(")")
            cast = self.node("function", word, token.position, inner)
            cast.cast_to = target
            return cast
        if word in ("date", "timestamp", "timestamp_ntz", "timestamp_ltz", "x") and (
            self.peek(1).kind == "string"
        ):
            self.take()
            text = self.take().text
            if word == "x":  # its bytes, as hex digits: twice as many, a bound
                return self.node("string", text, token.position)
            return self.node("literal", word, token.position)
        if word == "interval":
            return self.interval()
        if word == "identifier" and self.peek(1).text == "(":
            raise _Stop(token.position, "IDENTIFIER(...) is not allowed: name fields directly")
        self.take()
        if self.is_op("("):
            return self.call(token)
        if (
            self.is_op(".")
            and self.peek(1).kind in ("ident", "quoted")
            and self.peek(2).text == "("
        ):
            raise _Stop(
                token.position, "qualified function names (catalog.function) are not allowed"
            )
        if self.is_op("->"):
            raise _Stop(self.peek().position, "lambda functions are not allowed")
        return self.node("column", token.text, token.position)

    def call(self, name: Token) -> Node:
        self.expect_op("(")
        args: list[Node] = []
        if self.is_word("distinct", "all") and self.peek(1).text not in (")", ","):
            raise _Stop(
                self.peek().position,
                f"{self.peek().text.upper()} inside a function call is not allowed",
            )
        if not self.is_op(")"):
            args.append(self.argument())
            while self.is_op(","):
                self.take()
                args.append(self.argument())
        self.expect_op(")")
        if self.is_word("over", "filter", "within", "ignore", "respect"):
            raise _Stop(
                self.peek().position,
                f"{self.peek().text.upper()} after a function call is not allowed",
            )
        return self.node("function", name.text, name.position, *args)

    def argument(self) -> Node:
        if self.peek(1).text == "->" or (self.is_op("(") and self._lambda_ahead()):
            raise _Stop(self.peek().position, "lambda functions are not allowed")
        if self.peek(1).text == "=" and self.peek(2).text == ">":
            raise _Stop(self.peek().position, "named arguments are not allowed")
        return self.expression()

    def _lambda_ahead(self) -> bool:
        """Is the parenthesis here the parameter list of a lambda, ``(x, y) -> ...``?"""
        depth = 0
        for index in range(self.at, len(self.tokens) - 1):
            text = self.tokens[index].text if self.tokens[index].kind == "op" else ""
            depth += {"(": 1, ")": -1}.get(text, 0)
            if depth == 0:
                return self.tokens[index + 1].text == "->"
        return False

    def case(self) -> Node:
        start = self.take()
        children: list[Node] = []
        if not self.is_word("when"):
            children.append(self.expression())
        if not self.is_word("when"):
            raise self.unexpected("expected WHEN")
        while self.is_word("when"):
            self.take()
            children.append(self.expression())
            self.expect_word("then")
            children.append(self.expression())
        if self.is_word("else"):
            self.take()
            children.append(self.expression())
        self.expect_word("end")
        return self.node("operator", "case", start.position, *children)

    def interval(self) -> Node:
        start = self.take()
        parts = 0
        while True:
            signed = self.is_op("-", "+") and self.peek(1).kind in ("number", "string")
            value = self.peek(1 if signed else 0)
            if value.kind not in ("number", "string"):
                break
            self.at += 2 if signed else 1
            if value.kind == "string" and not self.is_word(*INTERVAL_UNITS):
                parts += 1  # INTERVAL '1 day 2 hours'
                break
            unit = self.take()
            if unit.word() not in INTERVAL_UNITS:
                raise _Stop(unit.position, f"unknown interval unit {unit.text!r}")
            if self.is_word("to"):
                self.take()
                unit = self.take()
                if unit.word() not in INTERVAL_UNITS:
                    raise _Stop(unit.position, f"unknown interval unit {unit.text!r}")
            parts += 1
        if not parts:
            raise self.unexpected("expected an interval such as INTERVAL 1 DAY")
        return self.node("literal", "interval", start.position)

    def data_type(self) -> str:
        """The simple type a cast names (its parameters, such as ``decimal(10, 2)``'s,
        read and dropped)."""
        token = self.take()
        if token.word() not in SIMPLE_TYPES:
            allowed = ", ".join(sorted(SIMPLE_TYPES))
            raise _Stop(token.position, f"cast to {token.text!r}: only simple types ({allowed})")
        if self.is_op("("):
            self.take()
            while not self.is_op(")"):
                if self.peek().kind != "number" and not self.is_op(","):
                    raise self.unexpected("a type takes numbers, such as decimal(10, 2)")
                self.take()
            self.take()
        return token.word()


def check(text: str, *, project: bool = False) -> list[ExpressionProblem]:
    """Every reason ``text`` is not admitted, in the order they appear; an empty list
    means it is. ``project``: a project column (an alias, or ``*``)."""
    if not isinstance(text, str) or not text.strip():
        return [ExpressionProblem(0, "must be a non-empty expression")]
    if len(text) > MAX_EXPRESSION_CHARS:
        limit = f"longer than {MAX_EXPRESSION_CHARS} characters"
        return [ExpressionProblem(MAX_EXPRESSION_CHARS, limit)]
    try:
        parser = _Parser(text, project=project)
    except _Stop as stop:  # a character or token outside the language
        return [stop.problem]
    try:
        tree = parser.parse()
    except _Stop as stop:
        found = [stop.problem]
    else:
        found = [ExpressionProblem(at, why) for at, why in expression_budget.problems(term(tree))]
    # Calls read before a problem that stopped the parse are reported too, so the
    # operator sees every refused function at once, not only the first obstacle.
    return sorted(found + _refusals(parser.made), key=lambda p: p.position)


# Operators whose value is the value of their operands, as the budget names them; any
# other operator's value is a number or a boolean.
_BUILDING_OPERATORS = {"||": "||", "case": "case", ".": "[]", "[]": "[]"}


def term(node: Node) -> expression_budget.Term:
    """``node`` as the budget reads it (sparkjobs/expression_budget.py)."""
    args = [term(child) for child in node.children]
    if node.kind in ("column", "string", "number"):
        return expression_budget.Term(node.kind, node.name, node.position, text=node.name)
    if node.kind in ("literal", "star"):
        return expression_budget.Term("literal", node.name, node.position)
    if node.kind == "alias":
        return args[0]
    if node.kind == "function":
        return expression_budget.Term("call", node.name, node.position, args)
    if node.name in ("like", "ilike"):
        like = expression_budget.Term("call", node.name, node.position, args[:2])
        if len(args) > 2:
            like.escape = args[2].text
        return like
    name = _BUILDING_OPERATORS.get(node.name, "scalar")
    return expression_budget.Term("call", name, node.position, args)


def _refusals(nodes: list[Node]) -> list[ExpressionProblem]:
    problems = []
    for node in nodes:
        if node.kind == "function":
            reason = refusal_reason(node.name)
            if reason:
                problems.append(ExpressionProblem(node.position, reason))
        elif node.kind == "column" and node.name.lower() in LITERAL_FUNCTIONS - {"user"}:
            # Spark reads these names as functions when the data has no such field.
            problems.append(ExpressionProblem(node.position, refusal_reason(node.name) or ""))
    return problems


def measure(text: str, *, project: bool = False) -> expression_budget.Size | None:
    """The bound of the value of an admitted ``text`` (sparkjobs/expression_budget.py);
    None for a text that is not admitted."""
    if check(text, project=project):
        return None
    return expression_budget.measure(term(_Parser(text, project=project).parse()))[0]


def parse(text: str, *, project: bool = False) -> Node | None:
    """The tree of an admitted ``text``; None for a text that is not admitted."""
    if check(text, project=project):
        return None
    return _Parser(text, project=project).parse()


def admit(text: str, *, project: bool = False) -> str:
    """``text`` unchanged when it is admitted; raises :class:`ExpressionRefused`."""
    problems = check(text, project=project)
    if problems:
        raise ExpressionRefused(text, problems)
    return text
