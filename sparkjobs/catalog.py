"""The operators a pipeline node can run, with their parameters and validation.

Declared without importing pyspark, so the console can validate a topology on a
machine that never starts Spark. Each operator's implementation lives beside it in
``sparkjobs/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from sparkjobs import expression_budget, expressions, key_form, measures, schemas, sql_stage
from sparkjobs.event_time import (
    MAX_LATENESS_S,
    MAX_WINDOW_S,
    MAX_WINDOWS_PER_RECORD,
    MIN_WINDOW_S,
)
from sparkjobs.measures import FUNCTIONS
from sparkjobs.reserved import reserved

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkjobs.keygroups import KeyGroup
    from sparkjobs.outputs import PartialOutput

NodeKind = Literal["source", "operator", "sink"]
AGGREGATES = tuple(key_form.AGGREGATES)
FORMATS = ("jsonl", "csv", "parquet")
MAX_COLUMNS = 100
IDENTIFIER_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")

Check = Callable[[Any], str | None]


# A record field's name as a pipeline names it. Spark would take longer ones; a bound
# keeps a hostile document's names (and the messages that quote them) short.
MAX_FIELD_NAME = 128


def _field_name(value: Any) -> str | None:
    if isinstance(value, str) and len(value) > MAX_FIELD_NAME:
        return f"must be a field name of at most {MAX_FIELD_NAME} characters, got {len(value)}"
    if not isinstance(value, str) or not value or not set(value) <= IDENTIFIER_CHARS:
        shown = repr(value)
        cut = shown if len(shown) <= 80 else shown[:77] + "..."
        return f"must be a field name (letters, digits, _), got {cut}"
    return reserved(value)


def _expression(value: Any, *, project: bool = False) -> str | None:
    """Why ``value`` is not an admitted expression (sparkjobs/expressions.py), or None."""
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty Spark SQL expression, got {value!r}"
    problems = expressions.check(value, project=project)
    return "; ".join(str(p) for p in problems) or None


def _number(low: float, high: float) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {value!r}"
        if not low <= value <= high:
            return f"must be between {low:g} and {high:g}, got {value:g}"
        return None

    return check


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        if value not in choices:
            return f"must be one of {', '.join(choices)}, got {value!r}"
        return None

    return check


def _aggregates(value: Any) -> str | None:
    if not isinstance(value, list) or not value:
        return f"must be a non-empty list drawn from {', '.join(AGGREGATES)}"
    unknown = [v for v in value if v not in AGGREGATES]
    if unknown:
        return f"unknown aggregate(s) {', '.join(map(str, unknown))}; use {', '.join(AGGREGATES)}"
    return None


def _expressions(value: Any) -> str | None:
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of Spark SQL expressions"
    if len(value) > MAX_COLUMNS:
        return f"at most {MAX_COLUMNS} columns, got {len(value)}"
    problems = []
    for index, item in enumerate(value):
        problem = _expression(item, project=True)
        if problem:
            problems.append(f"[{index}] {problem}")
            continue
        tree = expressions.parse(item, project=True)
        named = reserved(tree.name) if tree is not None and tree.kind == "alias" else None
        if named:
            problems.append(f"[{index}] {named}")
    if problems:
        return "; ".join(problems)
    sizes = [expressions.measure(item, project=True) for item in value]
    return expression_budget.row_problem([s for s in sizes if s is not None])


SINKS = ("results", "postgres", "parquet")
# How a stateful stage's instances share its keys: the first is the default.
KEYINGS = ("local_global", "key_groups")
MAX_PATH_CHARS = 500


def _schema(value: Any) -> str | None:
    return "; ".join(schemas.declared(value)[1]) or None


def _table_name(value: Any) -> str | None:
    ok = isinstance(value, str) and 0 < len(value) <= 63 and value[0].isalpha()
    if not ok or not set(value) <= IDENTIFIER_CHARS or value != value.lower():
        return f"must be a table name (lower-case letters, digits, _; at most 63), got {value!r}"
    return None


def _relative(value: Any, what: str, below: str) -> str | None:
    """A ``what`` (folder, file) below ``below``: relative, no ``..``, no control
    characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_PATH_CHARS:
        return f"must be a relative {what} of at most {MAX_PATH_CHARS} characters"
    parts = value.replace("\\", "/").split("/")
    if value.startswith("/") or ".." in parts or any(ord(c) < 32 for c in value):
        return f"must be a {what} below {below} (relative, no '..'), got {value!r}"
    return None


def _relative_path(value: Any) -> str | None:
    """A folder below the sink root."""
    return _relative(value, "folder", "the sink root")


def _sink_problems(params: Mapping[str, Any]) -> list[str]:
    """Each sink names what it needs, and only that."""
    sink = params.get("sink", "results")
    needs = {"postgres": ("table",), "parquet": ("path",), "results": ()}.get(sink, ())
    problems = [f"{name} is required for sink {sink}" for name in needs if not params.get(name)]
    for name in ("table", "path", "database"):
        used = needs + (("database",) if sink == "postgres" else ())
        if name in params and name not in used:
            problems.append(f"{name} is not used by sink {sink}")
    return problems


# The console's own database, as a sink names it (BPCONSOLE_SINK_DATABASES): it holds
# the console's users and ledger, which no pipeline reads.
CONSOLE_DATABASE = "console"
# A reference table's file, by its suffix: what Spark reads it as.
REFERENCE_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
JOINS = ("inner", "left")
MAX_JOIN_FIELDS = 16


def _reference_file(value: Any) -> str | None:
    """A file below the input folders: no wildcard, a known suffix."""
    problem = _relative(value, "file", "an input folder")
    if problem is not None:
        return problem
    if any(c in value for c in "*?["):
        return f"must name one file, not a pattern, got {value!r}"
    if Path(value).suffix.lower() not in REFERENCE_FORMATS:
        return f"must end in {', '.join(REFERENCE_FORMATS)} (its format), got {value!r}"
    return None


def _field_names(value: Any) -> str | None:
    if not isinstance(value, list) or not value or len(value) > MAX_JOIN_FIELDS:
        return f"must be a list of 1 to {MAX_JOIN_FIELDS} field names"
    for index, item in enumerate(value):
        problem = _field_name(item)
        if problem is not None:
            return f"[{index}] {problem}"
    if len({str(v).lower() for v in value}) != len(value):
        return "names a field twice"
    return None


def _reference_database(value: Any) -> str | None:
    if value == CONSOLE_DATABASE:
        return (
            "must be a database the admin named for pipelines (BPCONSOLE_SINK_DATABASES), "
            "not the console's own"
        )
    return _field_name(value)


def _join_problems(params: Mapping[str, Any]) -> list[str]:
    """A join reads a file or a table of a database, one of them; the fields it matches
    on are not among those it adds."""
    problems = []
    if ("reference" in params) == ("table" in params):
        problems.append("give reference (a file) or table and database (a PostgreSQL table)")
    elif ("table" in params) != ("database" in params):
        problems.append("table and database go together")
    on, columns = params.get("on"), params.get("columns")
    if isinstance(on, list) and isinstance(columns, list):
        both = sorted({str(c).lower() for c in columns} & {str(f).lower() for f in on})
        if both:
            problems.append(f"columns and on both name {', '.join(both)}")
    return problems


def _checked_with_measures(value: Any) -> str | None:
    """``group_by`` and ``measures`` are checked together, once each is known
    (sparkjobs/measures.py, ``problems``), where each problem says which item it is."""
    return None


def _statement(value: Any) -> str | None:
    return "; ".join(sql_stage.problems_of(value)) or None


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _micro_precise(check: Check) -> Check:
    def precise(value: Any) -> str | None:
        problem = check(value)
        if problem is None and round(value * 1_000_000) != value * 1_000_000:
            return f"must be a whole number of microseconds, got {value!r}"
        return problem

    return precise


# A refreshed join's period, in seconds: the least and the most.
REFRESH_S = (5.0, 86400.0)
# How long a deduplicate stage remembers an identity, in seconds: least, default, most.
DEDUP_WITHIN_S = (1.0, 3600.0, 7 * 86400.0)

WINDOW_PARAMS: tuple[str, ...] = ("window_s", "slide_s", "event_time", "lateness_s")


def _window_field_problems(params: Mapping[str, Any]) -> list[str]:
    """What is wrong with an aggregate's window fields taken together."""
    size, slide = params.get("window_s"), params.get("slide_s")
    if size is None:
        given = [name for name in WINDOW_PARAMS if name != "window_s" and name in params]
        return [f"{', '.join(given)} given without window_s (no windows)"] if given else []
    if not isinstance(size, int | float) or not isinstance(slide, int | float | None):
        return []  # each field's own check said what
    if slide is not None and slide > size:
        return [f"slide_s ({slide:g}) must not exceed window_s ({size:g})"]
    if slide is not None and -(-size // slide) > MAX_WINDOWS_PER_RECORD:
        return [
            f"window_s / slide_s must be at most {MAX_WINDOWS_PER_RECORD} (windows per "
            f"record), got {size:g} / {slide:g}"
        ]
    return []


@dataclass(frozen=True)
class ParamSpec:
    default: Any
    check: Check
    help: str
    required: bool = False
    number: bool = False  # a number even when its default is none (an editor types it)
    list: bool = False  # a list even when its default is none (an editor splits it)
    lines: bool = False  # text of several lines (an editor gives it a text area)
    # Another way to say what a parameter of the operator says (the key form: sparkjobs/
    # key_form.py): read wherever it is given, shown by an editor only on a node that
    # gives it.
    alternative: bool = False


class BatchJob(Protocol):
    """What an operator runs on Spark for one batch: each input segment (file stem ->
    file) into its output file, with what it produced and what it refused.

    ``together`` (file stem -> file stem) names segments whose outputs go to the same
    place, and the one whose output may hold them all: a job whose outputs are partials
    (``OperatorSpec.partials``) aggregates them as one there; a record job keeps each
    segment's records in its own output."""

    def __call__(
        self,
        spark: SparkSession,
        operator: str,
        params: Mapping[str, Any],
        inputs: Mapping[str, Path],
        outputs: Mapping[str, Path],
        *,
        key_group: KeyGroup | None,
        highs: Mapping[str, int | None] | None = None,
        together: Mapping[str, str] | None = None,
    ) -> Mapping[str, PartialOutput]: ...


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    kind: NodeKind
    description: str
    params: Mapping[str, ParamSpec]
    stateful: bool = False
    # Its batch job on Spark, "module:function" in sparkjobs/ (a :class:`BatchJob`),
    # imported only when a batch runs: this module never imports pyspark. None for the
    # source and the sink, which the orchestrator runs itself (it cuts the input into
    # segments; it merges partials into the result).
    batch_job: str | None = None
    # Its outputs are per-key partial aggregates: what the sink merges into the result,
    # and what the plain batch job (the exactness reference) must end in.
    partials: bool = False

    def defaults(self) -> dict[str, Any]:
        return {name: spec.default for name, spec in self.params.items()}

    def job(self) -> BatchJob:
        """The function that runs a batch of this operator on Spark."""
        if self.batch_job is None:
            raise ValueError(f"operator {self.name!r} ({self.kind}) runs no Spark batch job")
        module, _, function = self.batch_job.partition(":")
        job: BatchJob = getattr(importlib.import_module(module), function)
        return job


RECORD_JOB = "sparkjobs.transform:record_batch"
AGGREGATE_JOB = "sparkjobs.grouped:aggregate_batch"


# The key form of an aggregating stage (sparkjobs/key_form.py): read as group_by and
# measures.
_KEY_FORM_PARAMS: Mapping[str, ParamSpec] = {
    "key": ParamSpec("key", _field_name, "grouping field (key form)", alternative=True),
    "value": ParamSpec("value", _field_name, "numeric field (key form)", alternative=True),
    "distinct": ParamSpec(
        "user", _field_name, "field counted distinctly (key form)", alternative=True
    ),
    "aggregates": ParamSpec(
        list(AGGREGATES), _aggregates, "aggregates computed (key form)", alternative=True
    ),
}
# An aggregating stage's grouped measures (sparkjobs/measures.py).
_GROUPED_PARAMS: Mapping[str, ParamSpec] = {
    "group_by": ParamSpec(
        None,
        _checked_with_measures,
        "fields whose values make a group (with measures, instead of key)",
        list=True,
    ),
    "measures": ParamSpec(
        None,
        _checked_with_measures,
        "named measures, each {name, fn, field}; fn one of "
        f"{', '.join(FUNCTIONS)} (instead of value, distinct and aggregates)",
    ),
    "required": ParamSpec(
        None,
        _checked_with_measures,
        "fields a record must have to be aggregated (else it is malformed, quarantined); "
        "others missing are null, as in SQL",
        list=True,
    ),
}
# Event-time windows, the same on every aggregating operator (sparkjobs/event_time.py).
_WINDOW_PARAMS: Mapping[str, ParamSpec] = {
    "window_s": ParamSpec(
        None,
        _optional(_micro_precise(_number(MIN_WINDOW_S, MAX_WINDOW_S))),
        "event-time window size in seconds (none: over all time)",
        number=True,
    ),
    "slide_s": ParamSpec(
        None,
        _optional(_micro_precise(_number(0.001, MAX_WINDOW_S))),
        "hopping windows start every slide_s seconds (none: tumbling)",
        number=True,
    ),
    "event_time": ParamSpec(
        "event_time",
        _field_name,
        "field holding the event time (epoch seconds or ISO-8601)",
    ),
    "lateness_s": ParamSpec(
        0,
        _micro_precise(_number(0, MAX_LATENESS_S)),
        "allowed delay behind the largest event time seen",
    ),
}


OPERATORS: Mapping[str, OperatorSpec] = {
    spec.name: spec
    for spec in (
        OperatorSpec(
            "read",
            "source",
            "Reads JSON lines, CSV or Parquet, cuts it into segments and routes each "
            "record by a field.",
            {
                "format": ParamSpec("jsonl", _one_of(FORMATS), "input format"),
                "route_by": ParamSpec("key", _field_name, "field whose value picks the branch"),
                "segment_mb": ParamSpec(1.0, _number(0.001, 256), "segment size in MB"),
                "schema": ParamSpec(
                    None,
                    _optional(_schema),
                    "the records' fields and types, as in Spark's DDL "
                    '("key string, value double"): checked against every field the '
                    "pipeline names when it is saved",
                ),
            },
        ),
        OperatorSpec(
            "filter",
            "operator",
            "Keeps the records for which a Spark SQL condition holds.",
            {"condition": ParamSpec(None, _expression, "Spark SQL condition", required=True)},
            batch_job=RECORD_JOB,
        ),
        OperatorSpec(
            "project",
            "operator",
            "Computes columns from Spark SQL expressions.",
            {
                "columns": ParamSpec(
                    None, _expressions, "Spark SQL expressions", required=True, list=True
                )
            },
            batch_job=RECORD_JOB,
        ),
        OperatorSpec(
            "deduplicate",
            "operator",
            "Drops a record whose fields equal those of a record the run kept within the "
            "last within_s seconds (a redelivered event); the others go on as they are, "
            "each identity once whatever instance, retry or migration met it.",
            {
                "fields": ParamSpec(
                    None,
                    _field_names,
                    "the fields whose values make a record's identity",
                    required=True,
                    list=True,
                ),
                "within_s": ParamSpec(
                    DEDUP_WITHIN_S[1],
                    _number(DEDUP_WITHIN_S[0], DEDUP_WITHIN_S[2]),
                    "seconds a kept identity is remembered: a copy arriving later goes on",
                    number=True,
                ),
            },
            batch_job="sparkjobs.dedup:dedup_batch",
        ),
        OperatorSpec(
            "join",
            "operator",
            "Adds columns of a reference table (a CSV, JSON lines or Parquet file below the "
            "input folders, or a table of a database the admin named) to each record whose "
            "on fields equal a row's. The table is read when a run starts and that version "
            "is joined throughout the run, its retries and its plain job; with refresh_s, "
            "read again on that period while a landing-folder or stream run goes on, each "
            "file the run takes in (each chunk of a stream) joining the version read last "
            "before it.",
            {
                "reference": ParamSpec(
                    None,
                    _optional(_reference_file),
                    "the table's file, below an input folder (.csv with a header, "
                    ".jsonl or .parquet); or give table and database",
                ),
                "table": ParamSpec(
                    None,
                    _optional(_table_name),
                    "a PostgreSQL table, in database (instead of a file)",
                ),
                "database": ParamSpec(
                    None,
                    _optional(_reference_database),
                    "a database the admin configured in BPCONSOLE_SINK_DATABASES, not the "
                    "console's own",
                ),
                "on": ParamSpec(
                    None,
                    _field_names,
                    "fields equal in the record and the table",
                    required=True,
                    list=True,
                ),
                "columns": ParamSpec(
                    None,
                    _field_names,
                    "the table's columns added to the record",
                    required=True,
                    list=True,
                ),
                "how": ParamSpec(
                    JOINS[0],
                    _one_of(JOINS),
                    "inner: a record without a matching row is dropped; left: kept, its added "
                    "columns null",
                ),
                "refresh_s": ParamSpec(
                    None,
                    _optional(_number(REFRESH_S[0], REFRESH_S[1])),
                    "seconds between two reads of the table while a run over a landing "
                    "folder or a stream goes on (none: the run joins the table as it started)",
                ),
            },
            batch_job=RECORD_JOB,
        ),
        OperatorSpec(
            "aggregate",
            "operator",
            "Grouped measures (group_by and named measures) as partials that merge "
            "exactly (avg as sum and count, a distinct count as its set of values); or, in "
            "the key form, per key: the count, sum, min, max and avg of value and the "
            "distinct count of distinct (read as group_by [key] and those measures).",
            {
                **_KEY_FORM_PARAMS,
                **_GROUPED_PARAMS,
                **_WINDOW_PARAMS,
            },
            batch_job=AGGREGATE_JOB,
            partials=True,
        ),
        OperatorSpec(
            "sql",
            "operator",
            "One SELECT ... FROM input [WHERE ...] [GROUP BY ...] statement: its fields "
            "grouped by, its aggregates (count, sum, min, max, avg, count DISTINCT, "
            "approx_count_distinct, approx_percentile) as measures that merge exactly; "
            "an aggregate that cannot merge is refused saying why.",
            {
                "statement": ParamSpec(
                    None,
                    _statement,
                    "SELECT fields, aggregates AS names FROM input WHERE condition GROUP BY fields",
                    required=True,
                    lines=True,
                ),
                **_WINDOW_PARAMS,
            },
            batch_job=AGGREGATE_JOB,
            partials=True,
        ),
        OperatorSpec(
            "running",
            "operator",
            "Stateful running totals per key (count, sum, min, max), or per group of its "
            "measures, kept across segments (per event-time window too, each dropped once "
            "its window closes), and its groups' partials passed on. keying local_global "
            "(the default): any instance aggregates any segment and keeps partial totals of "
            "the groups it saw, merged when read, so a hot group is spread over every "
            "instance; key_groups: each instance owns a key group and keeps only its groups "
            "(the balancer moves key groups live).",
            {
                **_KEY_FORM_PARAMS,
                **_GROUPED_PARAMS,
                "keying": ParamSpec(
                    KEYINGS[0],
                    _one_of(KEYINGS),
                    "local_global: a key's records go to any instance, its totals merged "
                    "over them; key_groups: to the instance owning its key group",
                ),
                **_WINDOW_PARAMS,
            },
            stateful=True,
            batch_job=AGGREGATE_JOB,
            partials=True,
        ),
        OperatorSpec(
            "merge",
            "sink",
            "Merges partial aggregates into the run's result table, each segment once; "
            "a windowed pipeline's closed windows also go to a PostgreSQL table or Parquet "
            "files, each window once.",
            {
                "sink": ParamSpec("results", _one_of(SINKS), "where closed windows go"),
                "table": ParamSpec(
                    None, _optional(_table_name), "PostgreSQL table (sink: postgres)"
                ),
                "database": ParamSpec(
                    "console",
                    _field_name,
                    "a database the admin configured (BPCONSOLE_SINK_DATABASES)",
                ),
                "path": ParamSpec(
                    None,
                    _optional(_relative_path),
                    "folder below the sink root for Parquet files (sink: parquet)",
                ),
            },
        ),
    )
}


# The operator a node runs when its document names none: one per kind.
DEFAULT_OPERATOR: Mapping[str, str] = {  # node kind -> operator
    "source": "read",
    "operator": "aggregate",
    "sink": "merge",
}


def operator_name(node: Mapping[str, Any]) -> str:
    """The operator a node of a pipeline document runs: its ``operator``, or its kind's
    default (an unknown kind has none: "", which no operator is called)."""
    named = node.get("operator")
    if named:
        return str(named)
    return DEFAULT_OPERATOR.get(str(node.get("kind")), "")


def keyed(node: Mapping[str, Any]) -> bool:
    """Whether each instance of ``node``'s stage owns a key group: its stateful operator
    keeps a key's state at one instance, so a key's records must all go there (the
    balancer may neither shift shares between the stage's instances nor migrate data
    into one; it moves key groups instead). A stateful operator keyed ``local_global``
    is not: any instance takes any record and a key's state is merged over them."""
    spec = OPERATORS.get(operator_name(node))
    params = node.get("params")
    keying = params.get("keying", KEYINGS[0]) if isinstance(params, Mapping) else KEYINGS[0]
    return spec is not None and spec.stateful and keying == "key_groups"


def operator_of(node: Mapping[str, Any]) -> OperatorSpec:
    """The catalog's entry for the operator a node runs; ``KeyError`` when unknown."""
    return OPERATORS[operator_name(node)]


def stored_params(operator: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a node of ``operator`` is kept with, once valid: an aggregating
    stage of the key form as the grouped measures it means (sparkjobs/key_form.py), so
    the editor shows, and a later save keeps, one form."""
    if operator in ("aggregate", "running"):
        return key_form.as_measures(params)
    return dict(params)


def validate_params(operator: str, kind: str, params: Mapping[str, Any]) -> list[str]:
    """Problems with ``params`` for ``operator`` on a node of ``kind``, one per line."""
    spec = OPERATORS.get(operator)
    if spec is None:
        return [f"unknown operator {operator!r}; known: {', '.join(sorted(OPERATORS))}"]
    problems = []
    if spec.kind != kind:
        problems.append(f"operator {operator!r} runs on {spec.kind} nodes, not {kind} nodes")
    for name in params:
        if name not in spec.params:
            allowed = ", ".join(spec.params) or "none"
            problems.append(f"unknown parameter {name!r} for {operator} (allowed: {allowed})")
    for name, pspec in spec.params.items():
        if name not in params:
            if pspec.required:
                problems.append(f"parameter {name!r} is required ({pspec.help})")
            continue
        problem = pspec.check(params[name])
        if problem:
            problems.append(f"parameter {name!r} {problem}")
    if "window_s" in spec.params:
        problems.extend(_window_field_problems(params))
    if "sink" in spec.params and not problems:
        problems.extend(_sink_problems(params))
    if operator == "join" and not problems:
        problems.extend(_join_problems(params))
    if operator in ("aggregate", "running") and not problems:
        problems.extend(measures.problems(params))
    return problems
