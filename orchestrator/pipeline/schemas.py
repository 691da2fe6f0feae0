"""Each node's fields, from the schema its source declares, and the problems of every
parameter that names a field its input does not have (``sparkjobs/schemas.py``).

Walked in the order data flows (sources first), once per node and edge: linear in the
document. A node downstream of no declared schema has no fields here and is not
checked; one with inputs that carry different fields is checked against each, and
writes what it writes from the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkjobs.catalog import operator_name
from sparkjobs.schemas import Schema, declared, output


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


def derive(nodes: Any, edges: Any) -> Schemas:
    """Every node's output fields and every field problem of a document's ``nodes`` and
    ``edges``. Whatever they hold: entries that are not a node or a link are left out
    (the document's own checks say why), and a cycle's nodes are never reached."""
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
    waiting = {name: len(ups[name]) for name in index}
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        name = ready.pop()
        i = index[name]
        _walk(name, i, nodes[i], ups[name], found)
        for down in downs[name]:
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    found.problems.sort(key=lambda p: (p.node, p.param, p.message))
    return found


def _walk(name: str, i: int, node: Mapping[str, Any], ups: list[str], found: Schemas) -> None:
    """Node ``name``'s fields and problems, against each of the field lists it reads:
    its source's declared schema, or each of its inputs' (a stage fed by two branches
    reads the records of both)."""
    params = node.get("params") or {}
    if not isinstance(params, Mapping):
        return
    if node.get("kind") == "source":
        schema, _ = declared(params.get("schema"))  # its own problems: the catalog's
        inputs = [] if schema is None else [schema]
    else:
        inputs = list(dict.fromkeys(found.by_node[up] for up in ups if up in found.by_node))
    if not inputs:
        return
    problems: dict[tuple[str, str], None] = {}
    for given in inputs:
        written, said = output(operator_name(node), params, given)
        problems.update(dict.fromkeys((p.param, p.message) for p in said))
        found.by_node.setdefault(name, written)
    found.problems += [SchemaProblem(i, param, message) for param, message in problems]
