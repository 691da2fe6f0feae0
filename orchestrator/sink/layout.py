"""The columns a windowed run's sink writes: the window's bounds, then what the last
stage computes, then the run.

Each group field is written with the type its stage's output schema gives it
(orchestrator/pipeline/schemas.py; text where no schema says), then each measure by its
name: counts as integers, sums, minima, maxima and averages as exact decimals,
percentiles as doubles. A row's key is its window's start and its group: a window
written again, after a crash, replaces its rows rather than adding to them.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from orchestrator.pipeline.graph import aggregating_nodes, result_grouping
from orchestrator.pipeline.schemas import derive
from sparkjobs.measures import BY_TIME, OF_NUMBERS, Grouping
from sparkjobs.schemas import FieldType

Kind = Literal["text", "bigint", "double", "numeric", "boolean"]
# Decimals are written as NUMERIC(38, 10) / decimal128(38, 10); an average is rounded
# to the scale (half even), in a context wide enough for any 38-digit value.
SCALE = Decimal("1.0000000000")
_WIDE = decimal.Context(prec=80)
Cell = str | int | float | Decimal | bool | None
_OF_FIELD: Mapping[FieldType, Kind] = {"long": "bigint", "double": "double", "boolean": "boolean"}


class CellError(ValueError):
    """A value that does not fit its column's type; the message says which and why."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    nullable: bool = True

    def cell(self, value: Cell) -> Cell:
        """``value`` as this column keeps it: a group value's text read as the column's
        type, a decimal at the column's scale."""
        if value is None:
            return None
        if self.kind == "numeric":
            return Decimal(str(value)).quantize(SCALE, context=_WIDE)
        if not isinstance(value, str):
            return value
        try:
            if self.kind == "bigint":
                return int(value)
            if self.kind == "double":
                return float(value)
        except ValueError:
            raise CellError(
                f"column {self.name}: {value[:80]!r} is not a {self.kind}, as the "
                "pipeline's schema says it is"
            ) from None
        if self.kind == "boolean":
            if value not in ("true", "false"):
                raise CellError(f"column {self.name}: {value[:80]!r} is not a boolean")
            return value == "true"
        return value


@dataclass(frozen=True)
class Layout:
    """``columns`` after the window's bounds (and before the run's id); ``key`` those
    of them that, with the window's start, identify a row."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]

    def cells(self, values: Sequence[Cell]) -> tuple[Cell, ...]:
        return tuple(c.cell(v) for c, v in zip(self.columns, values, strict=True))


def grouped_layout(grouping: Grouping, types: Mapping[str, FieldType]) -> Layout:
    """The columns of grouped measures: each group field typed by ``types`` (the
    stage's output types by column name; text for a type a sink keeps as written, such
    as a date), then each measure (a first or last value typed by ``types`` too)."""
    columns = [
        Column(name, _OF_FIELD.get(types.get(name, "string"), "text")) for name in grouping.group_by
    ]
    for m in grouping.measures:
        if m.fn in BY_TIME:  # a value of its field, typed as the field
            columns.append(Column(m.name, _OF_FIELD.get(types.get(m.name, "string"), "text")))
        elif m.fn == "approx_percentile":
            columns.append(Column(m.name, "double"))
        elif m.fn in OF_NUMBERS:
            columns.append(Column(m.name, "numeric"))
        else:  # a count of records, of values, of distinct values: never null
            columns.append(Column(m.name, "bigint", nullable=False))
    return Layout(tuple(columns), grouping.group_by)


def layout_of(topology: Mapping[str, object]) -> Layout:
    """The columns a pipeline's windowed sink writes."""
    grouping = result_grouping(topology)
    schemas = derive(topology.get("nodes"), topology.get("edges"))
    types: dict[str, FieldType] = {}
    for node in aggregating_nodes(topology):
        schema = schemas.by_node.get(node["name"])
        for name in [*grouping.group_by, *(m.name for m in grouping.measures)]:
            found = None if schema is None else schema.find(name)
            if found is not None and found.type != "unknown":
                types.setdefault(name, found.type)
    return grouped_layout(grouping, types)
