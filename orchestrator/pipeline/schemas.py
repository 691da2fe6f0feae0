"""Each node's fields, from the schema its source declares, and the problems of every
parameter that names a field its input does not have (``sparkjobs/schemas.py``).

Walked in the order data flows (sources first), once per node and edge: linear in the
document. A node downstream of no declared schema has no fields here and is not
checked; one with inputs that carry different fields is checked against each, and
writes what it writes from the first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.pipeline.inputs import InputError
from sparkjobs.catalog import operator_name
from sparkjobs.schemas import Schema, declared, output, table_problems


@dataclass(frozen=True)
class SchemaProblem:
    """A problem at ``nodes[node].params.<param>`` (``param`` empty: the node's own)."""

    node: int
    param: str
    message: str


@dataclass
class Schemas:
    """What each node writes, by node name, where a source's schema reaches it."""

    by_node: dict[str, Schema] = field(default_factory=dict)
    problems: list[SchemaProblem] = field(default_factory=list)


# Reads a join's reference table's columns (orchestrator/pipeline/reference.py,
# ``columns_of``): None when they cannot be told; raises InputError when the table cannot
# be read.
TableColumns = Callable[[Mapping[str, Any]], Schema | None]
# The reference tables one document may have looked up when it is checked: each is a
# file read or a database asked.
MAX_TABLES = 16


def derive(nodes: Any, edges: Any, *, tables: TableColumns | None = None) -> Schemas:
    """Every node's output fields and every field problem of a document's ``nodes`` and
    ``edges``. Whatever they hold: entries that are not a node or a link are left out
    (the document's own checks say why), and a cycle's nodes are never reached.

    With ``tables``, each join is also checked against its reference table's columns,
    and adds them with their types."""
    nodes = nodes if isinstance(nodes, list) else []
    edges = edges if isinstance(edges, list) else []
    index = {
        n["name"]: i
        for i, n in enumerate(nodes)
        if isinstance(n, Mapping) and isinstance(n.get("name"), str)
    }
    ups: dict[str, list[str]] = {name: [] for name in index}
    downs: dict[str, list[str]] = {name: [] for name in index}
    for edge in edges:
        if not isinstance(edge, Mapping):
            continue
        src, dst = edge.get("from"), edge.get("to")
        if isinstance(src, str) and isinstance(dst, str) and src in index and dst in index:
            ups[dst].append(src)
            downs[src].append(dst)
    found = Schemas()
    looked = _TableLookups(tables)
    waiting = {name: len(ups[name]) for name in index}
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        name = ready.pop()
        i = index[name]
        _walk(name, i, nodes[i], ups[name], found, looked=looked)
        for down in downs[name]:
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    found.problems.sort(key=lambda p: (p.node, p.param, p.message))
    return found


def _walk(
    name: str,
    i: int,
    node: Mapping[str, Any],
    ups: list[str],
    found: Schemas,
    *,
    looked: _TableLookups,
) -> None:
    """Node ``name``'s fields and problems, against each of the field lists it reads:
    its source's declared schema, or each of its inputs' (a stage fed by two branches
    reads the records of both)."""
    params = node.get("params") or {}
    if not isinstance(params, Mapping):
        return
    table = None
    if operator_name(node) == "join":
        table, why = looked.columns(params)
        if why is not None:
            found.problems.append(SchemaProblem(i, why[0], why[1]))
    if node.get("kind") == "source":
        schema, _ = declared(params.get("schema"))  # its own problems: the catalog's
        inputs = [] if schema is None else [schema]
    else:
        inputs = list(dict.fromkeys(found.by_node[up] for up in ups if up in found.by_node))
    if not inputs:
        if table is not None:
            said = table_problems(params, table)
            found.problems += [SchemaProblem(i, p.param, p.message) for p in said]
        return
    problems: dict[tuple[str, str], None] = {}
    for given in inputs:
        written, said = output(operator_name(node), params, given, table=table)
        problems.update(dict.fromkeys((p.param, p.message) for p in said))
        found.by_node.setdefault(name, written)
    found.problems += [SchemaProblem(i, param, message) for param, message in problems]


class _TableLookups:
    """Each reference table a document names, looked up once, at most
    :data:`MAX_TABLES` of them."""

    def __init__(self, tables: TableColumns | None) -> None:
        self._tables = tables
        self._seen: dict[tuple[str, str, str], tuple[Schema | None, tuple[str, str] | None]] = {}

    def columns(self, params: Mapping[str, Any]) -> tuple[Schema | None, tuple[str, str] | None]:
        """The table's columns, or None; and the (parameter, message) of why it cannot be
        read, or None."""
        if self._tables is None:
            return None, None
        param = "table" if "table" in params else "reference"
        named = (param, str(params.get(param, "")), str(params.get("database", "")))
        if named not in self._seen:
            if len(self._seen) >= MAX_TABLES:
                return None, (param, f"a pipeline joins at most {MAX_TABLES} reference tables")
            try:
                self._seen[named] = (self._tables(params), None)
            except InputError as exc:
                self._seen[named] = (None, (param, str(exc)))
        return self._seen[named]
