"""How large a value an admitted expression may build, computed before Spark sees it.

Both checkers (``sparkjobs/expressions.py`` on the console's parse,
``sparkjobs/expression_guard.py`` on Spark's own) translate their tree into
:class:`Term` and ask :func:`problems`, so they enforce one budget with one set of
rules and constants.

Every term gets an upper bound on the UTF-8 bytes of the value it can produce, as a
linear form ``fixed + sum(coefficient[f] * len(f))`` over the record's fields ``f``
(a field's length is the bytes of its text: a string's, or another value's cast to a
string). A record operator's fields have no length of their own to rely on (any line a
source takes in), so the bound says how a value grows with its record: a term is
admitted while its ``fixed`` part is at most ``MAX_VALUE_BYTES`` and no field's
coefficient is above ``MAX_GROWTH``. A value is then never longer than ``MAX_GROWTH``
times its record plus ``MAX_VALUE_BYTES``, however the functions nest, and a
literal-only term (which Spark folds while it plans, where stopping a run cannot
reach) is at most ``MAX_VALUE_BYTES``.

Functions that grow a value have rules of their own (``concat`` adds, ``hex``
doubles, ``repeat`` multiplies by its literal count, ``lpad`` is its literal width,
``format_string`` is read from its literal format); any other function is bounded by
the sum of its arguments plus ``SCALAR_BYTES``, which covers every function on the
list that returns a number, a date or a short text. ``LIKE`` compiles to a Java
regular expression (``%`` to ``.*``, ``_`` to ``.``, matched whole), which backtracks
on every ``%`` but a trailing one: a pattern must be a literal of at most
``MAX_LIKE_PATTERN_CHARS`` characters with at most ``MAX_LIKE_WILDCARDS`` such
``%``, so a match is linear in the value's length.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

#: The most bytes a value may hold beyond what grows with its record's fields.
MAX_VALUE_BYTES = 65_536
#: The most times one field's length may appear in a value's bound.
MAX_GROWTH = 8
#: The widest literal width, precision, padding or count a function may be given.
MAX_WIDTH = 1_000
#: A bound on any number, date, time, interval, boolean or hash as text.
SCALAR_BYTES = 128
#: A bound on a number as text with every digit, grouping and sign (a double's 309 digits).
NUMBER_TEXT_BYTES = 512
#: The longest LIKE pattern: a match tries the rest of it at each position of a value.
MAX_LIKE_PATTERN_CHARS = 200
#: ``%`` wildcards a LIKE pattern may have before its trailing run of ``%``.
MAX_LIKE_WILDCARDS = 1

TermKind = Literal["column", "string", "number", "literal", "call"]


@dataclass
class Term:
    """One node of an expression, as the budget needs it.

    ``call`` names a function by Spark's name or an operator by a name no function
    has (``||``, ``like``, ``ilike``, ``case``, ``[]`` for a field or an element of a
    value, ``scalar`` for any operator whose value is a number or a boolean).
    ``text``: a string literal's value, a number literal's text or a column's name.
    """

    kind: TermKind
    name: str
    position: int
    args: list[Term] = field(default_factory=list)
    text: str = ""
    escape: str = "\\"  # a LIKE's escape character


@dataclass(frozen=True)
class Size:
    fixed: int
    fields: Mapping[str, int] = field(default_factory=dict)

    @property
    def growth(self) -> int:
        return max(self.fields.values(), default=0)

    def __add__(self, other: Size) -> Size:
        merged = dict(self.fields)
        for name, times in other.fields.items():
            merged[name] = merged.get(name, 0) + times
        return Size(self.fixed + other.fixed, merged)

    def times(self, factor: int) -> Size:
        return Size(self.fixed * factor, {n: t * factor for n, t in self.fields.items()})

    def most(self, other: Size) -> Size:
        names = set(self.fields) | set(other.fields)
        merged = {n: max(self.fields.get(n, 0), other.fields.get(n, 0)) for n in names}
        return Size(max(self.fixed, other.fixed), merged)


EMPTY = Size(0)
SCALAR = Size(SCALAR_BYTES)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Functions on the list whose value is a number, a boolean, a date or time, or a text
#: of at most SCALAR_BYTES whatever their arguments.
SCALAR_FUNCTIONS = _words(
    "abs acos acosh asin asinh atan atan2 atanh bin bround cbrt ceil ceiling conv cos cosh "
    "cot csc degrees div e exp expm1 factorial floor hypot ln log log10 log1p log2 mod "
    "negative pi pmod positive pow power radians rint round sec sign signum sin sinh sqrt "
    "tan tanh try_add try_divide try_multiply try_subtract width_bucket bit_count bit_get "
    "getbit shiftleft shiftright shiftrightunsigned "
    "add_months convert_timezone date_add date_diff date_from_unix_date date_part date_sub "
    "date_trunc dateadd datediff datepart day dayname dayofmonth dayofweek dayofyear extract "
    "from_utc_timestamp hour last_day make_date make_dt_interval make_interval "
    "make_timestamp make_timestamp_ltz make_timestamp_ntz make_ym_interval minute month "
    "monthname months_between next_day quarter second timestamp_micros timestamp_millis "
    "timestamp_seconds timestampadd timestampdiff to_date to_timestamp to_timestamp_ltz "
    "to_timestamp_ntz to_unix_timestamp to_utc_timestamp trunc try_make_interval "
    "try_make_timestamp try_to_timestamp unix_date unix_micros unix_millis unix_seconds "
    "weekday weekofyear year "
    "ascii bit_length char chr char_length character_length contains endswith instr len "
    "length levenshtein locate luhn_check octet_length position startswith to_number "
    "try_to_number between isnan isnotnull isnull equal_null json_array_length "
    "crc32 hash md5 sha sha1 sha2 xxhash64 array_contains array_position array_size "
    "arrays_overlap cardinality map_contains_key size scalar"
)
#: Functions whose value is one of their arguments'.
EITHER_FUNCTIONS = _words(
    "coalesce if ifnull nanvl nullif nullifzero nvl nvl2 zeroifnull case greatest least"
)
#: Functions whose value is their first argument's, each byte up to so many bytes.
SCALED_FUNCTIONS: Mapping[str, int] = {
    "[]": 1,
    "hex": 2,  # two digits a byte
    "upper": 3,  # a letter's capital may be three characters ('ΐ')
    "ucase": 3,
    "lower": 3,
    "lcase": 3,
    "initcap": 3,
    "translate": 4,  # each character for a character of up to four bytes
    "mask": 4,
    "to_json": 6,  # a control character is written \u0000
    "get_json_object": 3,  # numbers written again: '1e6' is '1000000.0'
}
#: Functions whose value is their format's rendering, each character of the format a
#: bounded text (a day's name, a zone's, a padded field): the format is their second
#: argument.
FORMAT_FUNCTIONS = _words("date_format from_unixtime to_char to_varchar")
FORMAT_CHAR_BYTES = 32

#: Arguments that must be literals (by 0-based position), and what they are.
LITERAL_ARGUMENTS: Mapping[str, tuple[int, str]] = {
    "lpad": (1, "its length"),
    "rpad": (1, "its length"),
    "repeat": (1, "its count"),
    "space": (0, "its length"),
    "format_string": (0, "its format"),
    "format_number": (1, "its decimal places or format"),
}

# java.util.Formatter's specifiers (its digits are ASCII ones).
_FORMAT_SPEC = re.compile(r"%(\d+\$|<)?[-#+ 0,(]*(\d+)?(?:\.(\d+))?([tT]?.)?", re.DOTALL | re.ASCII)


class _Refusal(Exception):
    def __init__(self, position: int, message: str) -> None:
        super().__init__(message)
        self.position = position
        self.message = message


def measure(root: Term) -> tuple[Size | None, list[tuple[int, str]]]:
    """The bound of ``root``'s value (None when a term is refused), and ``(position,
    message)`` for every term over the budget, in order. The terms around a refused
    one are not measured, so each excess is reported once, where it arises."""
    found: list[tuple[int, str]] = []
    size = _size(root, found)
    return size, sorted(found)


def problems(root: Term) -> list[tuple[int, str]]:
    return measure(root)[1]


def row_problem(columns: list[Size]) -> str | None:
    """Why a project's columns, each admitted, could together build too large a row (a
    row is bounded as one value is), or None."""
    return _excess(_sum(columns), "the columns together could build a row")


def _excess(size: Size, what: str) -> str | None:
    """Why a value of ``size`` is over the budget, or None; ``what`` builds it."""
    if size.fixed > MAX_VALUE_BYTES:
        return f"{what} of {size.fixed:,} bytes (at most {MAX_VALUE_BYTES:,} are allowed)"
    if size.growth > MAX_GROWTH:
        name = max(size.fields, key=lambda n: size.fields[n])
        return (
            f"{what} {size.growth:,} times as long as field {name!r} "
            f"(at most {MAX_GROWTH} times are allowed)"
        )
    return None


def _size(term: Term, found: list[tuple[int, str]]) -> Size | None:
    measured = [_size(arg, found) for arg in term.args]
    sizes = [s for s in measured if s is not None]
    if len(sizes) < len(measured):
        return None
    try:
        size = _bound(term, sizes)
    except _Refusal as refusal:
        found.append((refusal.position, refusal.message))
        return None
    excess = _excess(size, f"{_shown(term)} could build a value")
    if excess:
        found.append((term.position, excess))
        return None
    return size


def _shown(term: Term) -> str:
    if term.kind != "call":
        return "this value"
    return f"operator {term.name!r}" if term.name == "||" else f"function {term.name!r}"


def _bound(term: Term, sizes: list[Size]) -> Size:
    if term.kind == "column":
        return Size(0, {term.name.lower(): 1})
    if term.kind == "string":
        return Size(_bytes(term.text))
    if term.kind in ("number", "literal"):
        return SCALAR
    name = term.name.lower()
    _literals_given(term, name)
    if name in {"like", "ilike"}:
        _check_like(term)
        return SCALAR
    if name in SCALAR_FUNCTIONS:
        return SCALAR
    if name in EITHER_FUNCTIONS:
        return _most(sizes)
    if name in SCALED_FUNCTIONS:
        first = sizes[0] if sizes else EMPTY
        return first.times(SCALED_FUNCTIONS[name]) + (EMPTY if name == "[]" else SCALAR)
    if name in FORMAT_FUNCTIONS:
        fmt = sizes[1] if len(sizes) > 1 else EMPTY
        return fmt.times(FORMAT_CHAR_BYTES) + SCALAR
    rule = _RULES.get(name)
    if rule is not None:
        return rule(term, sizes)
    total = _sum(sizes)
    return total + Size(2 * len(sizes)) + SCALAR


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _sum(sizes: list[Size]) -> Size:
    total = EMPTY
    for size in sizes:
        total += size
    return total


def _most(sizes: list[Size]) -> Size:
    most = EMPTY
    for size in sizes:
        most = most.most(size)
    return most


def _literals_given(term: Term, name: str) -> None:
    wanted = LITERAL_ARGUMENTS.get(name)
    if wanted is None:
        return
    index, what = wanted
    arg = term.args[index] if index < len(term.args) else None
    if arg is None:
        return  # Spark refuses a call with too few arguments before it runs anything
    if name == "format_string":
        literal, kind = arg.kind == "string", "string"
    elif name == "format_number":
        literal, kind = arg.kind == "string" or _integer(arg) is not None, "integer or string"
    else:
        literal, kind = _integer(arg) is not None, "integer"
    if not literal:
        raise _Refusal(arg.position, f"function {term.name!r} takes {what} as a literal {kind}")
    number = _integer(arg)
    if number is not None and number > MAX_WIDTH:
        raise _Refusal(
            arg.position,
            f"function {term.name!r}: {what} is {number:,}, at most {MAX_WIDTH:,} is allowed",
        )


def _integer(term: Term) -> int | None:
    """The value of an integer literal, or None for anything else."""
    if term.kind != "number":
        return None
    text = term.text.rstrip("LlSsYy")
    return int(text) if text.isascii() and text.isdigit() else None


def _width(term: Term, index: int) -> int:
    """The literal integer argument at ``index`` (checked by ``_literals_given``), at
    least 0: Spark pads or repeats nothing for a negative one."""
    return max(0, _integer(term.args[index]) or 0) if index < len(term.args) else 0


def _pad(term: Term, sizes: list[Size]) -> Size:
    return Size(4 * _width(term, 1))  # characters, of up to four bytes


def _repeat(term: Term, sizes: list[Size]) -> Size:
    return sizes[0].times(_width(term, 1)) if sizes else EMPTY


def _space(term: Term, sizes: list[Size]) -> Size:
    return Size(_width(term, 0))


def _concat(term: Term, sizes: list[Size]) -> Size:
    return _sum(sizes)


def _concat_ws(term: Term, sizes: list[Size]) -> Size:
    if not sizes:
        return EMPTY
    separator, parts = sizes[0], sizes[1:]
    if separator.fields:
        raise _Refusal(
            term.args[0].position,
            f"function {term.name!r} takes a separator that is not built from a field",
        )
    # An argument may be an array: its elements are at most its length plus one.
    elements = _sum([p + Size(1) for p in parts])
    return _sum(parts) + elements.times(separator.fixed)


def _replace(term: Term, sizes: list[Size]) -> Size:
    if not sizes:
        return EMPTY
    replacement = sizes[2] if len(sizes) > 2 else EMPTY
    if replacement.fields:
        raise _Refusal(
            term.args[2].position,
            f"function {term.name!r} takes a replacement that is not built from a field",
        )
    search = term.args[1] if len(term.args) > 1 else None
    # Spark returns the value unchanged for an empty search; any other search is at
    # least one byte, each occurrence replaced by the replacement's bytes.
    searched = _bytes(search.text) if search and search.kind == "string" else 1
    if searched == 0:
        return sizes[0]
    factor = max(1, -(-replacement.fixed // searched))
    return sizes[0].times(factor)


def _base64(term: Term, sizes: list[Size]) -> Size:
    return (sizes[0].times(2) if sizes else EMPTY) + Size(4)


def _format_string(term: Term, sizes: list[Size]) -> Size:
    fmt = term.args[0].text if term.args else ""
    arguments = _most(sizes[1:])
    total = Size(_bytes(fmt))
    for spec in _FORMAT_SPEC.finditer(fmt):
        width, precision = (int(g) if g else 0 for g in (spec.group(2), spec.group(3)))
        for value, what in ((width, "width"), (precision, "precision")):
            if value > MAX_WIDTH:
                raise _Refusal(
                    term.args[0].position,
                    f"function {term.name!r}: a {what} of {value:,} in its format "
                    f"(at most {MAX_WIDTH:,} is allowed)",
                )
        total += arguments + Size(width + precision + NUMBER_TEXT_BYTES)
    return total


def _format_number(term: Term, sizes: list[Size]) -> Size:
    places = term.args[1] if len(term.args) > 1 else None
    if places is not None and places.kind == "string":
        # A DecimalFormat pattern: each of its characters at most a digit and a grouping.
        return Size(NUMBER_TEXT_BYTES + 2 * _bytes(places.text))
    return Size(NUMBER_TEXT_BYTES + 2 * _width(term, 1))


_RULES = {
    "concat": _concat,
    "||": _concat,
    "concat_ws": _concat_ws,
    "lpad": _pad,
    "rpad": _pad,
    "repeat": _repeat,
    "space": _space,
    "replace": _replace,
    "base64": _base64,
    "format_string": _format_string,
    "format_number": _format_number,
}


def _check_like(term: Term) -> None:
    pattern = term.args[1] if len(term.args) > 1 else None
    word = term.name.upper()
    if pattern is None:
        return
    if pattern.kind != "string":
        raise _Refusal(pattern.position, f"{word} takes a literal pattern (a string)")
    if len(pattern.text) > MAX_LIKE_PATTERN_CHARS:
        raise _Refusal(
            pattern.position,
            f"a {word} pattern of {len(pattern.text):,} characters "
            f"(at most {MAX_LIKE_PATTERN_CHARS} are allowed)",
        )
    inner = _inner_wildcards(pattern.text, term.escape)
    if inner > MAX_LIKE_WILDCARDS:
        raise _Refusal(
            pattern.position,
            f"a {word} pattern with {inner} '%' before its end: a match backtracks on "
            f"each (at most {MAX_LIKE_WILDCARDS} is allowed, any number at the end)",
        )


def _inner_wildcards(pattern: str, escape: str) -> int:
    """The unescaped ``%`` of ``pattern`` that are not in the run of ``%`` it ends with
    (a trailing ``.*`` matches the rest at once; any other backtracks)."""
    positions = list(_wildcards(pattern, escape))
    end = len(pattern)
    while positions and positions[-1] == end - 1:
        positions.pop()
        end -= 1
    return len(positions)


def _wildcards(pattern: str, escape: str) -> Iterator[int]:
    """The indexes of the unescaped ``%`` of ``pattern``, as Spark reads them."""
    i = 0
    while i < len(pattern):
        if pattern[i] == escape:
            i += 2
            continue
        if pattern[i] == "%":
            yield i
        i += 1
