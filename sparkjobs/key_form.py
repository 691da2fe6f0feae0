"""The key, value and distinct form of an aggregating stage, read as grouped measures.

A stage may say what it computes in the form of the reference pipeline::

    key: key            # the one field grouped by
    value: value        # the number measured
    distinct: user      # the field counted distinctly
    aggregates: [count, sum, min, max, avg, count_distinct]   # which of them (all)

which is the grouping ``group_by: [key]`` with one measure per aggregate (named as the
form's results always named them: ``count``, ``sum``, ``min``, ``max``, ``avg``,
``distinct_users``) and its three fields ``required``: a record missing one of them is
malformed, as the form has always had it. Every stage of the form, stored or given,
runs as that grouping (sparkjobs/measures.py), so there is one aggregating path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The form's parameters, with the fields each names when a stage leaves it out.
FIELDS: Mapping[str, str] = {"key": "key", "value": "value", "distinct": "user"}
PARAMS: tuple[str, ...] = (*FIELDS, "aggregates")
# Each aggregate the form names, as the measure it is: its name, function and whether it
# reads the value (else, for count_distinct, the distinct field; count reads none).
AGGREGATES: Mapping[str, tuple[str, str]] = {
    "count": ("count", "count"),
    "sum": ("sum", "sum"),
    "min": ("min", "min"),
    "max": ("max", "max"),
    "avg": ("avg", "avg"),
    "count_distinct": ("distinct_users", "count_distinct"),
}


def is_key_form(params: Mapping[str, Any]) -> bool:
    """Whether an aggregating stage's parameters say what it computes in the key form:
    they give neither grouped measures nor a statement."""
    return not any(name in params for name in ("group_by", "measures", "required", "statement"))


def as_measures(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the key form's parameters (or their defaults) replaced by the
    ``group_by``, ``measures`` and ``required`` they mean; parameters of another form,
    and the stage's other parameters, as given. The catalog checks the form's values
    first (sparkjobs/catalog.py): a value of the wrong kind is left for it to refuse."""
    if not is_key_form(params):
        return dict(params)
    named = {param: params.get(param, default) for param, default in FIELDS.items()}
    if not all(isinstance(name, str) for name in named.values()):
        return dict(params)
    wanted = params.get("aggregates") or list(AGGREGATES)
    if not isinstance(wanted, list) or not all(a in AGGREGATES for a in wanted):
        return dict(params)
    measures: list[dict[str, str]] = []
    for aggregate in AGGREGATES:
        if aggregate not in wanted:
            continue
        name, fn = AGGREGATES[aggregate]
        measure = {"name": name, "fn": fn}
        if fn != "count":
            measure["field"] = named["distinct" if fn == "count_distinct" else "value"]
        measures.append(measure)
    rest = {name: value for name, value in params.items() if name not in PARAMS}
    return {
        **rest,
        "group_by": [named["key"]],
        "measures": measures,
        "required": list(dict.fromkeys(named.values())),
    }
