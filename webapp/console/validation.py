"""Validation of a pipeline document (the YAML topology format, or the editor's form).

Every problem is reported at once with where it is (``nodes[2].params.condition``,
``edges[0].to``), so a user fixes a file in one pass. Nothing here touches the
database: saving happens only after this returns no problem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from orchestrator.service import (
    DEFAULT_BANDWIDTH_MBPS,
    DEFAULT_BUFFER_MB,
    DEFAULT_MAX_RATE_MBPS,
    DEFAULT_OPERATOR,
    Policy,
    derive_schemas,
    keyed,
    operator_name,
    validate_params,
    validate_policy,
    window_problems,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
KINDS = ("source", "operator", "sink")
NODE_KEYS = {"name", "kind", "stage", "operator", "params", "buffer_mb", "max_rate_mbps"}
EDGE_KEYS = {"from", "to", "bandwidth_mbps"}
TOP_KEYS = {"name", "description", "policy", "policy_overrides", "nodes", "edges"}
# What the database holds (Pipeline.name, Node.name and Node.stage are 100 characters)
# and bounds on a document's size in nodes and edges: a pipeline has tens of nodes, and
# validating and saving are linear in these, so a document cannot keep a worker busy.
MAX_NAME = 100
MAX_NODES = 1000
MAX_EDGES = 5000


@dataclass(frozen=True)
class Problem:
    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


class TopologyError(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def validate_document(doc: Any, base_policy: Mapping[str, Any] | None = None) -> list[Problem]:
    """Every problem of a pipeline document; an empty list means it can be saved.

    ``base_policy`` holds the values the overrides apply to (the named or default
    policy); without it the shipped defaults are assumed.
    """
    if not isinstance(doc, Mapping):
        return [Problem("(document)", "must be a mapping with name, nodes and edges")]
    problems = [Problem(str(key), "unknown key") for key in doc if key not in TOP_KEYS]
    name = doc.get("name")
    if not _is_name(name):
        problems.append(
            Problem(
                "name",
                f"must be a name (letters, digits, _ . -; at most {MAX_NAME}), got {shown(name)}",
            )
        )
    description = doc.get("description", "")
    if description is not None and not isinstance(description, str):
        problems.append(Problem("description", f"must be text, got {shown(description)}"))
    problems += _check_policy(doc, base_policy)
    nodes = doc.get("nodes")
    edges = doc.get("edges", [])
    if not isinstance(nodes, list) or not nodes:
        problems.append(Problem("nodes", "must be a non-empty list of nodes"))
        return problems
    if not isinstance(edges, list):
        problems.append(Problem("edges", "must be a list of edges"))
        return problems
    if len(nodes) > MAX_NODES or len(edges) > MAX_EDGES:
        problems.append(
            Problem(
                "nodes" if len(nodes) > MAX_NODES else "edges",
                f"at most {MAX_NODES} nodes and {MAX_EDGES} edges, "
                f"got {len(nodes)} and {len(edges)}",
            )
        )
        return problems
    names, kinds, node_problems = _check_nodes(nodes)
    problems += node_problems
    if not node_problems:
        tick = _tick_ms(doc, base_policy)
        problems += [Problem("nodes", message) for message in window_problems(doc, tick)]
    pairs, edge_problems = _check_edges(edges, names)
    problems += edge_problems
    problems += _check_shape(names, kinds, pairs)
    problems += _check_stages(nodes)
    problems += _check_keyed(nodes, pairs)
    problems += _check_fields(nodes, edges, node_problems)
    return problems


def _check_fields(nodes: list[Any], edges: list[Any], earlier: list[Problem]) -> list[Problem]:
    """Every field a parameter names, against what the node reads (from its source's
    declared schema); not for a node whose parameters have a problem already, which
    says what to fix first."""
    flawed = {p.location.split(" ")[0] for p in earlier if p.location.endswith(".params")}
    problems = []
    for found in derive_schemas(nodes, edges).problems:
        if f"nodes[{found.node}]" in flawed:
            continue
        at = f"nodes[{found.node}] ({nodes[found.node]['name']})"
        problems.append(Problem(f"{at}.params.{found.param}" if found.param else at, found.message))
    return problems


def _is_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= MAX_NAME and bool(NAME_RE.match(value))


def shown(value: Any) -> str:
    """``repr`` of a value for a message, cut short: it may be a whole sub-document."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number_problem(value: Any) -> str | None:
    """Why ``value`` is not a finite number a float column holds, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {shown(value)}"
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if not finite:
        return f"must be a finite number, got {shown(value)}"
    return None


def _tick_ms(doc: Mapping[str, Any], base: Mapping[str, Any] | None) -> int | None:
    """The balancer tick the document's policy gives, if it can be read."""
    overrides = doc.get("policy_overrides") or {}
    value = overrides.get("tick_ms") if isinstance(overrides, Mapping) else None
    if value is None:
        value = (base if base is not None else Policy().to_dict()).get("tick_ms")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_policy(doc: Mapping[str, Any], base: Mapping[str, Any] | None) -> list[Problem]:
    overrides = doc.get("policy_overrides", {}) or {}
    if not isinstance(overrides, Mapping):
        return [Problem("policy_overrides", "must be a mapping of parameter: value")]
    policy = doc.get("policy")
    problems = []
    if policy is not None and not isinstance(policy, str):
        problems.append(Problem("policy", f"must be the name of a policy, got {shown(policy)}"))
    # The policy's checks compare and format numbers as floats: an integer beyond a
    # float's range is reported here rather than raising there.
    too_large = [
        key
        for key, value in overrides.items()
        if isinstance(value, int) and not isinstance(value, bool) and _number_problem(value)
    ]
    if too_large:
        return [Problem(f"policy_overrides.{key}", "is too large a number") for key in too_large]
    merged = {**(base if base is not None else Policy().to_dict()), **overrides}
    for problem in validate_policy(merged):
        param, _, message = problem.partition(": ")
        problems.append(Problem(f"policy_overrides.{param}", message))
    return problems


def _check_nodes(nodes: list[Any]) -> tuple[list[str], dict[str, str], list[Problem]]:
    problems: list[Problem] = []
    names: list[str] = []
    kinds: dict[str, str] = {}
    for i, node in enumerate(nodes):
        at = f"nodes[{i}]"
        if not isinstance(node, Mapping):
            problems.append(Problem(at, "must be a mapping"))
            continue
        problems += [Problem(f"{at}.{k}", "unknown key") for k in node if k not in NODE_KEYS]
        name = node.get("name")
        if not _is_name(name):
            problems.append(Problem(f"{at}.name", f"must be a node name, got {shown(name)}"))
            continue
        at = f"nodes[{i}] ({name})"
        if name in kinds:
            problems.append(Problem(f"{at}.name", f"duplicate node name {name!r}"))
            continue
        kind = node.get("kind")
        if kind not in KINDS:
            problems.append(Problem(f"{at}.kind", f"must be one of {', '.join(KINDS)}"))
            kind = "operator"
        names.append(name)
        kinds[name] = kind
        stage = node.get("stage")
        if stage not in (None, "") and not _is_name(stage):
            problems.append(Problem(f"{at}.stage", f"must be a stage name, got {shown(stage)}"))
        operator = node.get("operator", DEFAULT_OPERATOR[kind])
        params = node.get("params", {}) or {}
        if not isinstance(operator, str):
            problems.append(
                Problem(f"{at}.operator", f"must be an operator's name, got {shown(operator)}")
            )
        elif not isinstance(params, Mapping):
            problems.append(Problem(f"{at}.params", "must be a mapping"))
        else:
            for message in validate_params(operator, kind, params):
                problems.append(Problem(f"{at}.params", message))
        problems += _check_number(node, "buffer_mb", at, minimum=0.001, default=DEFAULT_BUFFER_MB)
        problems += _check_number(
            node, "max_rate_mbps", at, minimum=0.0, default=DEFAULT_MAX_RATE_MBPS
        )
    return names, kinds, problems


def _check_number(
    item: Mapping[str, Any], key: str, at: str, *, minimum: float, default: float
) -> list[Problem]:
    value = item.get(key, default)
    problem = _number_problem(value)
    if problem:
        return [Problem(f"{at}.{key}", problem)]
    if value < minimum:
        return [Problem(f"{at}.{key}", f"must be at least {minimum:g}, got {value:g}")]
    return []


def _check_edges(edges: list[Any], names: list[str]) -> tuple[list[tuple[str, str]], list[Problem]]:
    known = set(names)
    problems: list[Problem] = []
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for i, edge in enumerate(edges):
        at = f"edges[{i}]"
        if not isinstance(edge, Mapping):
            problems.append(Problem(at, "must be a mapping with from and to"))
            continue
        problems += [Problem(f"{at}.{k}", "unknown key") for k in edge if k not in EDGE_KEYS]
        ends: list[str] = []
        for end in ("from", "to"):
            value = edge.get(end)
            if isinstance(value, str) and value in known:
                ends.append(value)
            else:
                problems.append(Problem(f"{at}.{end}", f"unknown node {shown(value)}"))
        problems += _check_number(
            edge, "bandwidth_mbps", at, minimum=0.0, default=DEFAULT_BANDWIDTH_MBPS
        )
        if len(ends) < 2:
            continue
        src, dst = ends
        if src == dst:
            problems.append(Problem(at, f"links {src!r} to itself"))
        elif (src, dst) in seen:
            problems.append(Problem(at, f"duplicate edge {src} -> {dst}"))
        else:
            pairs.append((src, dst))
            seen.add((src, dst))
    return pairs, problems


def _check_shape(
    names: list[str], kinds: Mapping[str, str], pairs: list[tuple[str, str]]
) -> list[Problem]:
    down: dict[str, list[str]] = {n: [] for n in names}
    up: dict[str, list[str]] = {n: [] for n in names}
    for src, dst in pairs:
        down[src].append(dst)
        up[dst].append(src)
    problems: list[Problem] = []
    sources = [n for n in names if kinds[n] == "source"]
    sinks = [n for n in names if kinds[n] == "sink"]
    if not sources:
        problems.append(Problem("nodes", "no source node (kind: source)"))
    if not sinks:
        problems.append(Problem("nodes", "no sink node (kind: sink)"))
    for n in names:
        if kinds[n] == "source" and up[n]:
            problems.append(Problem(f"node {n}", f"a source has no inputs, but {up[n]} feed it"))
        if kinds[n] == "sink" and down[n]:
            problems.append(Problem(f"node {n}", f"a sink has no outputs, but feeds {down[n]}"))
    cycle = find_cycle(names, down)
    if cycle:
        problems.append(Problem("edges", "cycle " + " -> ".join([*cycle, cycle[0]])))
        return problems
    reached = _reach(sources, down)
    problems += [
        Problem(f"node {n}", "unreachable from any source") for n in names if n not in reached
    ]
    feeds_sink = _reach(sinks, up)
    problems += [
        Problem(f"node {n}", "its data never reaches a sink")
        for n in names
        if n in reached and n not in feeds_sink
    ]
    return problems


def find_cycle(names: list[str], down: Mapping[str, list[str]]) -> list[str] | None:
    """The nodes of one cycle in order, or None when the graph is acyclic."""
    colour = dict.fromkeys(names, 0)  # 0 new, 1 on the current path, 2 done
    for start in names:
        if colour[start]:
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                colour[node] = 1
                path.append(node)
            children = down[node]
            if index < len(children):
                stack.append((node, index + 1))
                child = children[index]
                if colour[child] == 1:
                    return path[path.index(child) :]
                if colour[child] == 0:
                    stack.append((child, 0))
            else:
                colour[node] = 2
                path.pop()
    return None


def _reach(starts: list[str], step: Mapping[str, list[str]]) -> set[str]:
    seen = set(starts)
    frontier = list(starts)
    while frontier:
        for nxt in step[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def _check_stages(nodes: list[Any]) -> list[Problem]:
    """Nodes of one stage are interchangeable: same kind, operator and parameters."""
    first: dict[str, tuple[int, Any, Any, Any]] = {}
    problems = []
    for i, node in enumerate(nodes):
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            continue
        stage = node.get("stage") or node["name"]
        if not isinstance(stage, str):  # reported by _check_nodes
            continue
        signature = (node.get("kind"), operator_name(node), node.get("params") or {})
        if stage in first:
            j, *sig = first[stage]
            if tuple(sig) != signature:
                problems.append(
                    Problem(
                        f"nodes[{i}] ({node['name']}).stage",
                        f"stage {stage!r} mixes different operators or parameters "
                        f"(compare nodes[{j}])",
                    )
                )
        else:
            first[stage] = (i, *signature)
    return problems


def _check_keyed(nodes: list[Any], pairs: list[tuple[str, str]]) -> list[Problem]:
    """A keyed stage (:func:`sparkjobs.catalog.keyed`) splits every upstream's records
    among its members by key group, so each of its upstreams must feed all of them."""
    stages: dict[str, list[str]] = {}
    for node in nodes:
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            continue
        operator, stage = operator_name(node), node.get("stage") or node["name"]
        if not isinstance(operator, str) or not isinstance(stage, str):
            continue  # reported by _check_nodes
        if keyed(node):
            stages.setdefault(stage, []).append(node["name"])
    feeding: dict[str, set[str]] = {}
    for src, dst in pairs:
        feeding.setdefault(dst, set()).add(src)
    problems = []
    for stage, members in stages.items():
        feeds = {m: feeding.get(m, set()) for m in members}
        upstreams = set().union(*feeds.values())
        for member, ups in feeds.items():
            if ups != upstreams:
                missing = ", ".join(sorted(upstreams - ups))
                problems.append(
                    Problem(
                        f"node {member}",
                        f"keyed stage {stage!r}: every upstream must feed every member "
                        f"(records are split by key group); {missing} does not feed {member}",
                    )
                )
    return problems
