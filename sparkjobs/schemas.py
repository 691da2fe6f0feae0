"""The fields a stage reads and writes, and their types: checked when a pipeline is saved.

A source may declare its records' fields (``schema: "key string, value double"``);
from it, each operator's output fields follow from its parameters (:func:`output`), and
every field a parameter names (a grouping field, a condition's or a column's reference)
must be one its input has, of a type that fits: a misspelt field is refused at save
time, where it is, instead of every record of a run being quarantined. A source that
declares nothing leaves its pipeline unchecked, as before.

Types are coarse on purpose: what a field holds as far as a check needs it. An
expression's type is inferred from the admitted language (``sparkjobs/expressions.py``)
where it is certain, and ``unknown`` otherwise; ``unknown`` fits anything, so the
inference can only refuse what Spark would refuse too. Field names resolve without
regard to case, as Spark resolves them.

Pure Python: the console checks a pipeline without a JVM. Each check is linear in the
fields and the expressions' (bounded) sizes.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from sparkjobs import expressions, key_form, sql_stage
from sparkjobs.measures import BY_TIME, OF_NUMBERS, Grouping

FieldType = Literal["string", "long", "double", "boolean", "date", "timestamp", "unknown"]
#: The types a source may declare.
DECLARABLE: tuple[FieldType, ...] = ("string", "long", "double", "boolean", "date", "timestamp")
_DECLARED: Mapping[str, FieldType] = {t: t for t in DECLARABLE}
NUMERIC: frozenset[FieldType] = frozenset({"long", "double"})
MAX_FIELDS = 500
MAX_SCHEMA_CHARS = 64_000


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType


class Schema:
    """Fields in order, found by name whatever its case."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = list(fields)
        self._by_name = {f.name.lower(): f for f in self.fields}

    def find(self, name: str) -> Field | None:
        return self._by_name.get(name.lower())

    def unknown(self, name: str) -> str:
        """Why ``name`` is not a field here: the fields there are, the closest first."""
        names = [f.name for f in self.fields]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        return f"unknown field {name!r}{hint}; the input has {listed}"

    def as_list(self) -> list[dict[str, str]]:
        return [{"name": f.name, "type": f.type} for f in self.fields]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(tuple(self.fields))


@dataclass(frozen=True)
class ParamProblem:
    """A problem of one parameter of a node: ``param`` (``key``, ``columns``...)."""

    param: str
    message: str


# A job parameter the worker adds for a batch read straight from the source: the DDL of
# the source's declared schema (``declared_ddl``), which the jobs read records with.
INPUT_SCHEMA = "_input_schema"
_SPARK_TYPES: Mapping[FieldType, str] = {
    "string": "STRING",
    "long": "BIGINT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
}


def declared_ddl(value: Any) -> str | None:
    """A valid ``schema`` parameter as the DDL Spark reads records with, or None."""
    schema, problems = declared(value)
    if schema is None or problems:
        return None
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema.fields)


def declared(value: Any) -> tuple[Schema | None, list[str]]:
    """A source's ``schema`` parameter read, or its problems. It is written as Spark
    writes a schema in DDL: ``"key string, value double, user string"`` (a colon after
    a name is allowed). One string, so that the fields keep their order wherever the
    document is stored."""
    if not isinstance(value, str):
        return None, ['must list the fields and their types, e.g. "key string, value double"']
    if len(value) > MAX_SCHEMA_CHARS:
        return None, [f"longer than {MAX_SCHEMA_CHARS} characters"]
    parts = [part.strip() for part in value.split(",")]
    if not any(parts):
        return None, ["must declare at least one field"]
    if len(parts) > MAX_FIELDS:
        return None, [f"at most {MAX_FIELDS} fields, got {len(parts)}"]
    problems: list[str] = []
    fields: list[Field] = []
    seen: set[str] = set()
    for number, part in enumerate(parts, start=1):
        words = part.replace(":", " ", 1).split()
        if len(words) != 2:
            problems.append(f"field {number} ({part[:40]!r}): write a name and a type")
            continue
        name, kind = words[0], words[1].lower()
        if not _is_field_name(name):
            problems.append(
                f"field {number}: {name[:40]!r} is not a field name (letters, digits, _)"
            )
            continue
        field_type = _DECLARED.get(kind)
        if field_type is None:
            problems.append(f"{name}: type {kind[:40]!r}; use one of {', '.join(DECLARABLE)}")
            continue
        if name.lower() in seen:
            problems.append(f"{name}: declared twice")
            continue
        seen.add(name.lower())
        fields.append(Field(name, field_type))
    return (None if problems else Schema(fields)), problems


def _is_field_name(value: Any) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and 0 < len(value) <= 128
        and all(c.isascii() and (c.isalnum() or c == "_") for c in value)
    )


def output(
    operator: str, params: Mapping[str, Any], given: Schema, *, table: Schema | None = None
) -> tuple[Schema, list[ParamProblem]]:
    """What ``operator`` with ``params`` writes when it reads ``given``, and every
    problem of its parameters against ``given`` (a join's also against its reference
    ``table``'s columns, when they are known)."""
    if operator == "join":
        return _join(params, given, table)
    rule = _RULES.get(operator)
    if rule is None:
        return given, []
    return rule(params, given)


def _read(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    problems = _fields(params, given, {"route_by": str(params.get("route_by", "key"))})
    return given, problems


def _filter(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    tree = expressions.parse(str(params.get("condition", "")))
    if tree is None:  # refused by the expression check, which says why
        return given, []
    problems = [ParamProblem("condition", m) for m in _references(tree, given)]
    kind = infer(tree, given)
    if not problems and kind not in ("boolean", "unknown"):
        problems.append(ParamProblem("condition", f"is a {kind}, not a true/false condition"))
    return given, problems


def _project(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    columns = params.get("columns")
    if not isinstance(columns, list):
        return given, []
    fields: list[Field] = []
    problems: list[ParamProblem] = []
    for index, text in enumerate(columns):
        tree = expressions.parse(str(text), project=True)
        if tree is None:
            continue
        if tree.kind == "star":
            fields += given.fields
            continue
        problems += [ParamProblem("columns", f"[{index}] {m}") for m in _references(tree, given)]
        if tree.kind == "alias":
            name = tree.name
        elif tree.kind == "column":
            found = given.find(tree.name)
            name = found.name if found is not None else tree.name
        else:
            name = str(text).strip()  # Spark names an unnamed column by its text
        fields.append(Field(name, infer(tree, given)))
    seen: set[str] = set()
    for field in fields:
        if field.name.lower() in seen:
            problems.append(
                ParamProblem("columns", f"column {field.name!r} twice: name one with AS")
            )
        seen.add(field.name.lower())
    return Schema(fields), problems


def _grouped(
    grouping: Grouping, given: Schema, params: Mapping[str, Any]
) -> tuple[Schema, list[ParamProblem]]:
    """Grouped measures: over event-time windows, each window's start and end; the
    group's fields; then each measure (a count a long; a sum, an average, a minimum, a
    maximum or a percentile a double, each of a number)."""
    computing = grouping.computing
    problems = [
        ParamProblem("group_by", given.unknown(name))
        for name in grouping.group_by
        if name not in computing and given.find(name) is None
    ]
    # A required field a group or a measure reads is refused there, once.
    read = {*grouping.group_by, *(m.field for m in grouping.measures), *grouping.times}
    problems += [
        ParamProblem("required", given.unknown(name))
        for name in grouping.required
        if name not in read and given.find(name) is None
    ]
    computed: dict[str, Field] = {}
    for name, item in computing.items():
        tree = expressions.parse(item, project=True)
        if tree is not None:  # else refused by the stage's own check
            problems += [ParamProblem("group_by", f"{name}: {m}") for m in _references(tree, given)]
            computed[name] = Field(name, infer(tree, given))
    fields = []
    if params.get("window_s") is not None:
        fields += [Field("window_start", "timestamp"), Field("window_end", "timestamp")]
        name = str(params.get("event_time", "event_time"))
        time = given.find(name)
        if time is None:
            problems.append(ParamProblem("event_time", given.unknown(name)))
        elif time.type in ("boolean", "date"):
            problems.append(ParamProblem("event_time", _not_a_time(time)))
    fields += [
        computed.get(name) or given.find(name) or Field(name, "unknown")
        for name in grouping.group_by
    ]
    for index, measure in enumerate(grouping.measures):
        found = given.find(measure.field) if measure.field else None
        at = f"measures[{index}]"
        if measure.field and found is None:
            problems.append(ParamProblem("measures", f"{at}: {given.unknown(measure.field)}"))
        elif (
            found is not None
            and measure.fn in OF_NUMBERS
            and found.type not in NUMERIC | {"unknown"}
        ):
            problems.append(
                ParamProblem(
                    "measures",
                    f"{at}: {measure.fn} of {found.name!r}, a {found.type}: it needs a number",
                )
            )
        if measure.by:
            time = given.find(measure.by)
            if time is None:
                problems.append(ParamProblem("measures", f"{at}: {given.unknown(measure.by)}"))
            elif time.type in ("boolean", "date"):
                problems.append(ParamProblem("measures", f"{at}: {_not_a_time(time)}"))
        kind: FieldType = "double" if measure.fn in OF_NUMBERS else "long"
        if measure.fn in BY_TIME:  # a value of the field, as it is
            kind = found.type if found is not None else "unknown"
        fields.append(Field(measure.name, kind))
    return Schema(fields), problems


def _aggregate(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    grouping = Grouping.of(params)
    if grouping is None:  # refused by the stage's own check, which says why
        return given, []
    schema, problems = _grouped(grouping, given, params)
    if not key_form.is_key_form(params):
        return schema, problems
    # The key form's problems at the parameters it was given by.
    problems = [p for p in problems if p.param == "event_time"]
    for param, default in key_form.FIELDS.items():
        name = str(params.get(param, default))
        found = given.find(name)
        if found is None:
            problems.append(ParamProblem(param, given.unknown(name)))
        elif param == "value" and found.type not in NUMERIC | {"unknown"}:
            problems.append(ParamProblem(param, f"{name!r} is a {found.type}, not a number"))
    return schema, problems


def _not_a_time(field: Field) -> str:
    return (
        f"{field.name!r} is a {field.type}; an event time is a timestamp, epoch seconds or "
        "ISO-8601 text"
    )


def _fields(
    params: Mapping[str, Any], given: Schema, names: Mapping[str, str]
) -> list[ParamProblem]:
    """A problem for each parameter naming (in ``names``) no field of ``given``."""
    return [
        ParamProblem(param, given.unknown(name))
        for param, name in names.items()
        if name and given.find(name) is None
    ]


def _join(
    params: Mapping[str, Any], given: Schema, table: Schema | None
) -> tuple[Schema, list[ParamProblem]]:
    """The record's fields, then the table's ``columns``, of the table's types (unknown
    when the table's columns are not known). Each ``on`` field must be the record's and
    the table's, of types that compare (numbers with numbers, text with text), and no
    added column may hide one of the record's fields."""
    on, columns = params.get("on"), params.get("columns")
    if not isinstance(on, list) or not isinstance(columns, list):
        return given, []
    problems = [
        ParamProblem("on", given.unknown(str(name))) for name in on if given.find(str(name)) is None
    ]
    problems += [
        ParamProblem(
            "columns", f"{name!r} is already a field of the input, the table's would hide it"
        )
        for name in columns
        if given.find(str(name)) is not None
    ]
    if table is not None:
        problems += table_problems(params, table)
        problems += [
            ParamProblem(
                "on",
                f"{name!r} is {mine.type} in the records but {theirs.type} in the table; "
                "cast one of them in a project stage before the join",
            )
            for name in on
            if (mine := given.find(str(name))) is not None
            and (theirs := table.find(str(name))) is not None
            and not _comparable(mine.type, theirs.type)
        ]
    added = [
        Field(str(name), _added_type(table, str(name)))
        for name in columns
        if given.find(str(name)) is None
    ]
    return Schema([*given.fields, *added]), problems


def table_problems(params: Mapping[str, Any], table: Schema) -> list[ParamProblem]:
    """Each ``on`` field and added column a join names that its reference ``table``
    does not have."""
    problems = []
    for param in ("on", "columns"):
        names = params.get(param)
        for name in names if isinstance(names, list) else []:
            if table.find(str(name)) is None:
                listed = ", ".join(f.name for f in table.fields[:20])
                problems.append(
                    ParamProblem(param, f"the reference table has no column {name!r} ({listed})")
                )
    return problems


def _added_type(table: Schema | None, name: str) -> FieldType:
    found = table.find(name) if table is not None else None
    return found.type if found is not None else "unknown"


def _comparable(mine: FieldType, theirs: FieldType) -> bool:
    return "unknown" in (mine, theirs) or mine == theirs or {mine, theirs} <= NUMERIC


def _sql(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    """A statement's WHERE as a filter's condition, its groups and measures as an
    aggregate's, each problem at the statement (in WHERE, or which measure)."""
    query = sql_stage.query_of(params)
    if query is None:  # refused by the statement's check, which says why
        return given, []
    problems = []
    if query.where is not None:
        _, said = _filter({"condition": query.where}, given)
        problems += [ParamProblem("statement", f"{p.message} (in WHERE)") for p in said]
    schema, said = _grouped(query.grouping, given, params)
    problems += [
        ParamProblem(p.param if p.param == "event_time" else "statement", p.message) for p in said
    ]
    return schema, problems


def _deduplicate(params: Mapping[str, Any], given: Schema) -> tuple[Schema, list[ParamProblem]]:
    fields = params.get("fields")
    if not isinstance(fields, list):
        return given, []
    return given, [
        ParamProblem("fields", f"[{i}] {given.unknown(str(name))}")
        for i, name in enumerate(fields)
        if given.find(str(name)) is None
    ]


_RULES = {
    "read": _read,
    "deduplicate": _deduplicate,
    "filter": _filter,
    "project": _project,
    "aggregate": _aggregate,
    "running": _aggregate,
    "sql": _sql,
}


def _references(tree: expressions.Node, given: Schema) -> list[str]:
    """Why each field reference in ``tree`` names no field of ``given``."""
    problems = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.kind == "column" and given.find(node.name) is None:
            problems.append(expressions.ExpressionProblem(node.position, given.unknown(node.name)))
        stack.extend(node.children)
    return [str(p) for p in sorted(problems, key=lambda p: p.position)]


# -- what an expression's value is -----------------------------------------------------

_CAST_TYPES: Mapping[str, FieldType] = {
    **dict.fromkeys(("string", "varchar", "char"), "string"),
    **dict.fromkeys(
        ("int", "integer", "bigint", "smallint", "tinyint", "long", "short", "byte"), "long"
    ),
    **dict.fromkeys(("double", "float", "real", "decimal", "dec", "numeric"), "double"),
    **dict.fromkeys(("boolean", "bool"), "boolean"),
    "date": "date",
    **dict.fromkeys(("timestamp", "timestamp_ntz", "timestamp_ltz"), "timestamp"),
}
_BOOLEAN_OPERATORS = frozenset(
    [*expressions.words("= == <=> != <> < <= > >= and or not in like ilike is"), "is distinct"]
)
_LONG_OPERATORS = frozenset(expressions.words("div ~ & | ^ << >> >>>"))
_FUNCTION_TYPES: Mapping[str, FieldType] = {
    **dict.fromkeys(
        expressions.words(
            "between isnull isnotnull isnan startswith endswith contains array_contains "
            "luhn_check equal_null arrays_overlap map_contains_key"
        ),
        "boolean",
    ),
    **dict.fromkeys(
        expressions.words(
            "length len char_length character_length bit_length octet_length instr locate "
            "position levenshtein ascii crc32 hash xxhash64 json_array_length size "
            "cardinality array_size year month day dayofmonth dayofweek dayofyear hour "
            "minute second quarter weekday weekofyear unix_date unix_seconds unix_millis "
            "unix_micros to_unix_timestamp datediff date_diff bit_count floor ceil ceiling "
            "width_bucket"
        ),
        "long",
    ),
    **dict.fromkeys(
        expressions.words(
            "acos acosh asin asinh atan atan2 atanh cbrt cos cosh cot csc degrees e exp "
            "expm1 hypot ln log log10 log1p log2 pi pow power radians rint sec sin sinh sqrt "
            "tan tanh try_divide months_between"
        ),
        "double",
    ),
    **dict.fromkeys(
        expressions.words(
            "base64 btrim chr concat concat_ws format_number format_string "
            "initcap lcase left lower lpad ltrim mask overlay repeat replace reverse right "
            "rpad rtrim soundex space split_part substr substring substring_index "
            "to_char to_varchar translate trim ucase upper md5 sha sha1 sha2 "
            "get_json_object to_json typeof date_format dayname monthname hex bin"
        ),
        "string",
    ),
    **dict.fromkeys(
        expressions.words(
            "to_date date_add date_sub dateadd add_months last_day next_day make_date "
            "date_from_unix_date trunc"
        ),
        "date",
    ),
    **dict.fromkeys(
        expressions.words(
            "to_timestamp to_timestamp_ltz to_timestamp_ntz timestamp_seconds "
            "timestamp_millis timestamp_micros make_timestamp from_utc_timestamp "
            "to_utc_timestamp date_trunc"
        ),
        "timestamp",
    ),
}
# Functions whose value has the type their arguments share (``if``: from its second).
_COMMON_FUNCTIONS = frozenset(
    expressions.words("coalesce ifnull nvl nullif greatest least abs negative positive")
)


def infer(node: expressions.Node, given: Schema) -> FieldType:
    """What ``node``'s value is, when the admitted language makes it certain."""
    kind, name = node.kind, node.name.lower()
    children = node.children
    if kind == "column":
        found = given.find(node.name)
        return found.type if found is not None else "unknown"
    if kind == "string":
        return "string"
    if kind == "number":
        return "long" if name.isdigit() else "double" if _decimal(name) else "unknown"
    if kind == "literal":
        return {
            "true": "boolean",
            "false": "boolean",
            "date": "date",
            "timestamp": "timestamp",
            "timestamp_ntz": "timestamp",
            "timestamp_ltz": "timestamp",
        }.get(name, "unknown")  # type: ignore[return-value]
    if kind == "alias":
        return infer(children[0], given)
    if kind == "operator":
        if name in _BOOLEAN_OPERATORS:
            return "boolean"
        if name in _LONG_OPERATORS:
            return "long"
        if name == "||":
            return "string"
        if name == "/":
            return "double"
        if name in ("+", "-", "*", "%"):
            return _arithmetic([infer(c, given) for c in children])
        return "unknown"  # a CASE, a field of a struct, an element
    if kind == "function":
        if name in ("cast", "try_cast"):
            return _CAST_TYPES.get(node.cast_to, "unknown")
        if name in _COMMON_FUNCTIONS:
            return _common([infer(c, given) for c in children])
        if name in ("if", "nvl2"):
            return _common([infer(c, given) for c in children[1:]])
        return _FUNCTION_TYPES.get(name, "unknown")
    return "unknown"


def _decimal(text: str) -> bool:
    digits = text.replace(".", "", 1)
    return "." in text and digits.isdigit()


def _arithmetic(types: list[FieldType]) -> FieldType:
    if types and all(t == "long" for t in types):
        return "long"
    if types and all(t in NUMERIC for t in types):
        return "double"
    return "unknown"


def _common(types: list[FieldType]) -> FieldType:
    """The type values of ``types`` share: one type, or numbers of both kinds."""
    kinds = set(types)
    if len(kinds) == 1:
        return kinds.pop()
    return "double" if kinds == NUMERIC else "unknown"


# -- a schema proposed from sample records ----------------------------------------------

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?"
)
_LONG = re.compile(r"[+-]?\d{1,18}")
_DOUBLE = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


@dataclass
class Proposal:
    """The fields sample records suggest, for an operator to confirm: each field's
    type across the records, in the order fields were first seen; the fields that
    hold nested values, which a schema does not declare."""

    schema: Schema
    nested: list[str]

    @property
    def ddl(self) -> str:
        return ", ".join(f"{f.name} {f.type}" for f in self.schema.fields)


def propose(records: Iterable[Mapping[str, object]], *, text: bool) -> Proposal:
    """The schema ``records`` suggest. ``text``: every value is text (CSV), and a type
    is read from its form (``12`` a long, ``2026-12-05T08:00:00Z`` a timestamp);
    otherwise values are JSON's (a JSON string stays a string unless it is a date or a
    timestamp in ISO-8601). A field whose values disagree is a string, but longs and
    doubles make a double and dates and timestamps a timestamp. Names that are not
    field names, and fields past :data:`MAX_FIELDS`, are left out."""
    seen: dict[str, FieldType | None] = {}
    nested: dict[str, None] = {}
    for record in records:
        for name, value in record.items():
            if not _is_field_name(name) or (name not in seen and len(seen) >= MAX_FIELDS):
                continue
            if isinstance(value, dict | list):
                nested[name] = None
                continue
            kind = _text_type(value) if text and isinstance(value, str) else _value_type(value)
            seen[name] = kind if name not in seen else _merged(seen[name], kind)
    fields = [Field(name, kind or "string") for name, kind in seen.items() if name not in nested]
    return Proposal(Schema(fields), list(nested))


def _value_type(value: object) -> FieldType | None:
    if value is None:
        return None  # says nothing of the field's type
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if -(2**63) <= value < 2**63 else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return _time_type(value) or "string"
    return "string"


def _text_type(value: str) -> FieldType | None:
    text = value.strip()
    if not text:
        return None  # an empty CSV cell: null
    if text.lower() in ("true", "false"):
        return "boolean"
    if _LONG.fullmatch(text):
        return "long"
    if _DOUBLE.fullmatch(text):
        return "double"
    return _time_type(text) or "string"


def _time_type(text: str) -> FieldType | None:
    if len(text) > 40:
        return None
    if _TIMESTAMP.fullmatch(text):
        return "timestamp"
    if _DATE.fullmatch(text):
        return "date"
    return None


def _merged(was: FieldType | None, now: FieldType | None) -> FieldType | None:
    if was is None or was == now:
        return now if was is None else was
    if now is None:
        return was
    if {was, now} == {"long", "double"}:
        return "double"
    if {was, now} == {"date", "timestamp"}:
        return "timestamp"
    return "string"


def declared_proposal(typed: Iterable[tuple[str, FieldType | None]]) -> Proposal:
    """The fields a file declares itself (a Parquet footer), each with its type or
    ``None`` for a nested one; names that are not field names, and fields past
    :data:`MAX_FIELDS`, left out."""
    fields: list[Field] = []
    nested: list[str] = []
    for name, kind in typed:
        if not _is_field_name(name) or len(fields) >= MAX_FIELDS:
            continue
        if kind is None:
            nested.append(name)
        else:
            fields.append(Field(name, kind))
    return Proposal(Schema(fields), nested)
