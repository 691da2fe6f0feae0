"""Grouped measures: an ``aggregate`` stage's ``group_by`` fields and named ``measures``,
each kept as a partial state that merges exactly.

A measure is a name, a function and the field it reads::

    group_by: [carrier, origin]
    measures:
      - {name: flights, fn: count}
      - {name: mean_delay, fn: avg, field: dep_delay}
      - {name: tails, fn: count_distinct, field: tailnum}

Null follows SQL: a record whose measured field is null counts in ``count`` (without a
field) and nowhere else; a null group field makes a group of its own. A partial state
of each function merges with another of any grouping of the input into the state of
the whole: counts and sums add (sums are decimals, exact in any order), min and max
fold, an average is its sum and count (divided only when read), a distinct count is
its set of values. So a stage's partials may be split by segment, batch, branch or
instance, and merged in any order, and still equal one aggregation of the whole.

Pure Python: the console checks a stage's measures without a JVM, and the sink merges
partials without one (sparkjobs/grouped.py computes them on Spark).
"""

from __future__ import annotations

import base64
import decimal
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, TypeAlias, TypeGuard, get_args

import datasketches

from sparkjobs import expression_budget, expressions, key_form
from sparkjobs.reserved import reserved

Function = Literal[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "count_distinct",
    "approx_count_distinct",
    "approx_percentile",
    "first",
    "last",
]
FUNCTIONS: tuple[Function, ...] = get_args(Function)
# The functions of a number, read as DECIMAL(38,10) (sparkjobs/records.py).
OF_NUMBERS: frozenset[str] = frozenset({"sum", "min", "max", "avg", "approx_percentile"})
# The functions whose value is an exact decimal (kept as its text once finished).
DECIMAL_VALUED: frozenset[str] = frozenset({"sum", "min", "max", "avg"})
# The sketches' sizes, as Spark's own functions take them: an HLL sketch of 2^12
# registers (relative standard error 1.6%), a KLL sketch of k = 200 (normalized rank
# error 1.65%).
HLL_LG_K = 12
KLL_K = 200
MAX_GROUP_FIELDS = 16
MAX_FIELD_NAME = 128
MAX_MEASURES = 32
MAX_REQUIRED = 64
MAX_NAME = 64
# Wide enough that sums of DECIMAL(38,10) values over any number of partials stay exact;
# an inexact or overflowing operation raises instead of rounding.
EXACT = decimal.Context(prec=80, traps=[decimal.Inexact, decimal.Overflow])

# A measure's partial state as JSON holds it: a count; a sum, min or max as decimal text
# (None before any non-null value); an average's {"sum": ..., "count": ...}; a distinct
# count's sorted values; a sketch's bytes in base64 (Apache DataSketches' format, as
# Spark's hll_sketch_agg and kll_sketch_agg_double write it); a first or last value's
# [time in microseconds, value as text] (None before any record with a time).
State: TypeAlias = int | str | list[Any] | dict[str, Any] | None
# A finished measure: what a result row shows.
Value: TypeAlias = int | float | Decimal | str | None
# The functions of a value at an event time, and the field that time is (``by``).
BY_TIME: frozenset[str] = frozenset({"first", "last"})


@dataclass(frozen=True)
class Measure:
    name: str
    fn: Function
    field: str | None = None  # None: count counts records
    percentile: float | None = None  # approx_percentile's, in (0, 1]
    by: str | None = None  # first's and last's event time field


@dataclass(frozen=True)
class Grouping:
    """What a grouped ``aggregate`` computes: per value of ``group_by`` (field names),
    ``measures``. ``computed``: the group fields computed from each record, each as an
    admitted ``expression AS name`` (sparkjobs/expressions.py), its name in ``group_by``."""

    group_by: tuple[str, ...]
    measures: tuple[Measure, ...]
    computed: tuple[str, ...] = ()
    # Fields a record must have (not missing, not null) to be aggregated: a record
    # without one is malformed, counted and quarantined, not aggregated.
    required: tuple[str, ...] = ()

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Grouping | None:
        """The grouping a stage's parameters name (the key form's too: sparkjobs/
        key_form.py); None for measures that are not valid (:func:`problems` says
        why)."""
        params = key_form.as_measures(params)
        if "measures" not in params or _shape_problems(params):
            return None
        return cls._of_valid(params)

    @classmethod
    def _of_valid(cls, params: Mapping[str, Any]) -> Grouping:
        items = [str(f) for f in params.get("group_by") or []]
        return cls(
            group_by=tuple(_group_name(item) for item in items),
            computed=tuple(item for item in items if _group_name(item) != item),
            required=tuple(str(f) for f in params.get("required") or []),
            measures=tuple(
                Measure(
                    str(m["name"]),
                    m["fn"],
                    str(m["field"]) if m.get("field") else None,
                    float(m["percentile"]) if "percentile" in m else None,
                    str(m["by"]) if m.get("by") else None,
                )
                for m in params["measures"]
            ),
        )

    @property
    def computing(self) -> dict[str, str]:
        """Each computed group field's ``expression AS name``, by its name."""
        return {_group_name(item): item for item in self.computed}

    @property
    def times(self) -> list[str]:
        """The event time fields of first and last measures, each once."""
        return _unique(m.by for m in self.measures if m.by)

    @property
    def fields(self) -> list[str]:
        """The fields the measures read, each once."""
        return _unique(m.field for m in self.measures if m.field)

    @property
    def numbers(self) -> list[str]:
        """The fields read as numbers (decimals)."""
        return _unique(m.field for m in self.measures if m.fn in OF_NUMBERS and m.field)

    @property
    def strings(self) -> list[str]:
        """The fields read as text: the group's, those counted or taken first or last,
        the times those are taken by, and the required ones no measure reads."""
        counted = (m.field for m in self.measures if m.fn not in OF_NUMBERS and m.field)
        times = (m.by for m in self.measures if m.by)
        named = _unique([*self.group_by, *counted, *times, *self.required])
        return [f for f in named if f not in self.numbers]

    def merge(self, into: Mapping[str, State], other: Mapping[str, State]) -> dict[str, State]:
        """The state of two partials' records together."""
        return {m.name: _merge(m.fn, into[m.name], other[m.name]) for m in self.measures}

    def finish(self, states: Mapping[str, State]) -> dict[str, Value]:
        """Each measure's value from its state."""
        return {m.name: _finish(m, states[m.name]) for m in self.measures}


def _group_name(item: str) -> str:
    """A group_by item's field name: itself, or a computed one's alias."""
    if _is_name(item, MAX_FIELD_NAME):
        return item
    tree = expressions.parse(item, project=True)
    return tree.name if tree is not None and tree.kind == "alias" else item


def _unique(names: Any) -> list[str]:
    return list(dict.fromkeys(n for n in names if n))


def _merge(fn: str, a: Any, b: Any) -> State:
    """Two partial states of ``fn`` (JSON, as :data:`State` says) as one."""
    if fn == "count":
        return int(a) + int(b)
    if fn == "approx_count_distinct":
        union = datasketches.hll_union(HLL_LG_K)
        union.update(_hll(a))
        union.update(_hll(b))
        return _b64(union.get_result(datasketches.tgt_hll_type.HLL_8).serialize_compact())
    if fn == "approx_percentile":
        merged = _kll(a)
        merged.merge(_kll(b))
        return _b64(merged.serialize())
    if fn == "count_distinct":
        # Both sorted: the values ``b`` adds, sorted, after ``a`` make two runs that
        # Python's sort merges in one pass (a kept set is large, a batch adds few).
        kept = set(a)
        added = sorted(v for v in set(b) if v not in kept)
        return sorted(a + added) if added else list(a)
    if fn == "avg":
        return {"sum": _number("sum", a["sum"], b["sum"]), "count": a["count"] + b["count"]}
    if fn in BY_TIME:
        return _at_time(fn, a, b)
    return _number(fn, a, b)


def _at_time(fn: str, a: list[Any] | None, b: list[Any] | None) -> list[Any] | None:
    """Two first (or last) values, each [time, value], as one: the earliest (latest)
    time's; at one time, the smaller (larger) value, a null one smallest, as Spark
    orders min(struct(time, value)) (max)."""
    if a is None or b is None:
        return b if a is None else a
    earliest = min(a, b, key=_time_order)
    return earliest if fn == "first" else max(a, b, key=_time_order)


def _time_order(state: list[Any]) -> tuple[int, bool, str]:
    time, value = state
    return int(time), value is not None, value or ""


def _number(fn: str, a: str | None, b: str | None) -> str | None:
    """Two sums, minima or maxima (decimal text, None for none) as one."""
    if a is None or b is None:
        return b if a is None else a
    x, y = Decimal(a), Decimal(b)
    if fn == "sum":
        return str(EXACT.add(x, y))
    return a if (x <= y) == (fn == "min") else b


def _finish(measure: Measure, state: Any) -> Value:
    fn = measure.fn
    if fn == "count":
        return int(state)
    if fn == "count_distinct":
        return len(state)
    if fn in BY_TIME:
        return None if state is None else state[1]
    if fn == "avg":
        return average(state["sum"], state["count"])
    if fn == "approx_count_distinct":
        # Rounded half up, as Spark's hll_sketch_estimate rounds (Math.round)
        return math.floor(float(_hll(state).get_estimate()) + 0.5)
    if fn == "approx_percentile":
        # The inclusive rank, as Spark's kll_sketch_get_quantile_double reads it
        sketch = _kll(state)
        if sketch.is_empty():
            return None
        return float(sketch.get_quantile(measure.percentile, inclusive=True))
    return None if state is None else Decimal(state)


def _hll(state: str) -> datasketches.hll_sketch:
    return datasketches.hll_sketch.deserialize(base64.b64decode(state))


def _kll(state: str) -> datasketches.kll_doubles_sketch:
    return datasketches.kll_doubles_sketch.deserialize(base64.b64decode(state))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def average(total: str | Decimal | None, count: int) -> Decimal | None:
    """An average from its exact sum and count (None, as SQL has it, of no value): the
    one division, wherever the sum was made."""
    return None if total is None or not count else Decimal(total) / Decimal(count)


# -- what a document may say ------------------------------------------------------------


def problems(params: Mapping[str, Any]) -> list[str]:
    """What is wrong with a stage's ``group_by``, ``measures`` and ``required`` (the key
    form's as the measures they are), each saying where: linear in their size."""
    params = key_form.as_measures(params)
    said = _shape_problems(params)
    if said or "measures" not in params:
        return said
    grouping = Grouping._of_valid(params)
    said += _required_problems(grouping)
    grouped = {f.lower() for f in grouping.group_by}
    both = sorted({f.lower() for f in grouping.numbers} & grouped)
    if both:
        said.append(
            f"group_by field(s) {', '.join(both)} also read as numbers by a sum, min, "
            "max or avg: group by a copy (a project stage's column)"
        )
    return said


def _shape_problems(params: Mapping[str, Any]) -> list[str]:
    if key_form.is_key_form(params):
        return []
    said: list[str] = []
    legacy = [p for p in key_form.PARAMS if p in params]
    if legacy:
        said.append(
            f"{', '.join(legacy)} and measures are two ways to say what to compute; "
            "give one (group_by and measures, or key, value and distinct)"
        )
    if "measures" not in params:
        given = [p for p in ("group_by", "required") if p in params]
        return [*said, f"{' and '.join(given)} given without measures"] if given else said
    required = params.get("required", [])
    if (
        not isinstance(required, list)
        or len(required) > MAX_REQUIRED
        or not all(_is_name(f, MAX_FIELD_NAME) for f in required)
    ):
        said.append(f"required must be a list of at most {MAX_REQUIRED} field names")
    group_by = params.get("group_by", [])
    if not isinstance(group_by, list) or len(group_by) > MAX_GROUP_FIELDS:
        said.append(
            f"group_by must be a list of at most {MAX_GROUP_FIELDS} field names or "
            "'expression AS name' items"
        )
        group_by = []
    sizes = []
    for index, item in enumerate(group_by):
        if _is_name(item, MAX_FIELD_NAME):
            if reserved(item):
                said.append(f"group_by[{index}]: {reserved(item)}")
            continue
        problem = _computed_problem(item)
        if problem:
            said.append(f"group_by[{index}] {problem}")
        else:
            sizes.append(expressions.measure(item, project=True))
    row = expression_budget.row_problem([s for s in sizes if s is not None])
    if row:
        said.append(f"group_by: {row}")
    lowered = [_group_name(str(f)).lower() for f in group_by]
    if len(set(lowered)) != len(lowered):
        said.append("group_by names a field twice")
    said += _measure_problems(params["measures"], set(lowered))
    return said


def _required_problems(grouping: Grouping) -> list[str]:
    """A required field is one of the records (a record missing it is malformed), not
    one a group_by item computes."""
    said = []
    for index, name in enumerate(grouping.required):
        if name in grouping.computing:
            said.append(
                f"required[{index}]: {name!r} is computed by group_by, not a field of the records"
            )
        elif reserved(name):
            said.append(f"required[{index}]: {reserved(name)}")
    return said


def _computed_problem(item: object) -> str | None:
    """Why ``item`` is neither a field name nor an admitted ``expression AS name``."""
    if not isinstance(item, str) or not item.strip():
        return "must be a field name (letters, digits, _) or 'expression AS name'"
    found = expressions.check(item, project=True)
    if found:
        return "; ".join(str(p) for p in found)
    tree = expressions.parse(item, project=True)
    said = [t for t in expressions.tokens(item) if t.kind != "end"]
    if tree is None or tree.kind != "alias" or len(said) < 2 or said[-2].word() != "as":
        return "must be a field name, or an expression named with AS ('hour(t) AS hour')"
    if not _is_name(tree.name, MAX_FIELD_NAME):
        return f"names its field {tree.name[:40]!r}: a name is letters, digits and _"
    return reserved(tree.name)


def _measure_problems(measures: Any, groups: set[str]) -> list[str]:
    if not isinstance(measures, list) or not 0 < len(measures) <= MAX_MEASURES:
        return [f"measures must be a list of 1 to {MAX_MEASURES} measures"]
    said: list[str] = []
    seen: set[str] = set()
    for index, measure in enumerate(measures):
        at = f"measures[{index}]"
        if not isinstance(measure, Mapping):
            said.append(f"{at} must be a mapping with name, fn and (but for count) field")
            continue
        unknown = sorted(str(k)[:40] for k in measure if k not in _MEASURE_KEYS)
        if unknown:
            allowed = ", ".join(_MEASURE_KEYS)
            said.append(f"{at}: unknown key(s) {', '.join(unknown)} (allowed: {allowed})")
        said += _percentile_problems(at, measure)
        said += _by_problems(at, measure)
        name, fn, field = measure.get("name"), measure.get("fn"), measure.get("field")
        if not _is_name(name, MAX_NAME):
            said.append(f"{at}.name must be an identifier of at most {MAX_NAME} characters")
        elif name.lower() in groups:
            said.append(f"{at}.name {name!r} is also a group_by field")
        elif name.lower() in seen:
            said.append(f"{at}.name {name!r} names two measures")
        else:
            seen.add(name.lower())
        if fn not in FUNCTIONS:
            shown = repr(fn) if len(repr(fn)) <= 40 else repr(fn)[:37] + "..."
            said.append(f"{at}.fn must be one of {', '.join(FUNCTIONS)}, got {shown}")
        elif field is None and fn != "count":
            said.append(f"{at}: {fn} needs a field")
        if field is not None and not _is_name(field, 128):
            said.append(f"{at}.field must be a field name (letters, digits, _)")
        elif field is not None and reserved(field):
            said.append(f"{at}.field: {reserved(field)}")
    return said


_MEASURE_KEYS = ("name", "fn", "field", "percentile", "by")


def _by_problems(at: str, measure: Mapping[str, Any]) -> list[str]:
    """first and last take the event time field they are first and last by (``by``), and
    no other function does."""
    by = measure.get("by")
    if measure.get("fn") not in BY_TIME:
        return [] if by is None else [f"{at}.by is for first and last only"]
    if not _is_name(by, MAX_FIELD_NAME):
        return [f"{at}.by must name the event time field it is {measure.get('fn')} by"]
    return [f"{at}.by: {reserved(by)}"] if reserved(by) else []


def _percentile_problems(at: str, measure: Mapping[str, Any]) -> list[str]:
    """approx_percentile takes a percentile in (0, 1], and no other function does."""
    value = measure.get("percentile")
    if measure.get("fn") != "approx_percentile":
        return [] if value is None else [f"{at}.percentile is for approx_percentile only"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        return [f"{at}.percentile must be a number in (0, 1], e.g. 0.95; got {value!r:.40}"]
    return []


def _is_name(value: Any, longest: int) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and 0 < len(value) <= longest
        and not value[0].isdigit()
        and all(c.isascii() and (c.isalnum() or c == "_") for c in value)
    )
