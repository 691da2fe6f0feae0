"""Pipelines to and from the documented topology format (docs/topology-format.md)."""

from __future__ import annotations

import json
import math
import re
from typing import Any, cast

import yaml
from django.conf import settings
from django.db import transaction

from orchestrator import service
from webapp.console.models import Edge, Node, Pipeline, Policy
from webapp.console.validation import Problem, TopologyError, validate_document

# -- bounded parsing (docs/security.md, "Bounded documents") ------------------------------
#
# Every document the console takes (API bodies, YAML imports, the editor's form, the
# load_topology command) is parsed here, with three bounds: its size
# (BPCONSOLE_MAX_DOCUMENT_KB), how deeply its lists and mappings nest, and, for YAML, no
# anchors or aliases (a few hundred bytes of aliases expand to gigabytes). A document
# that breaks one is refused with located problems before anything is built from it.

# A pipeline document nests about five levels (document, nodes, node, params, a list);
# anything near this is an attack, not a pipeline. Kept well below Python's recursion
# limit, which json, the YAML composer and the validation would otherwise run into.
MAX_DEPTH = 32
# The most values (scalars, lists, mappings, keys included) one YAML document may hold:
# PyYAML's pure-Python parser handles about 25,000 a second, so this bounds the time an
# import can take to about two seconds, and still allows a pipeline of MAX_NODES nodes.
MAX_YAML_VALUES = 50_000
# At most this many problems of one kind are listed (the rest are counted).
MAX_LISTED = 20


def max_document_bytes() -> int:
    return int(settings.BPCONSOLE_MAX_DOCUMENT_KB) * 1024


def check_size(size: int) -> None:
    """Refuse a document of ``size`` bytes over the cap, before it is parsed."""
    limit = max_document_bytes()
    if size > limit:
        raise TopologyError(
            [
                Problem(
                    "(document)",
                    f"is {size} bytes; a document may have at most {limit} bytes "
                    f"({limit // 1024} KB, BPCONSOLE_MAX_DOCUMENT_KB)",
                )
            ]
        )


def _at(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - text.rfind("\n", 0, index)
    return f"line {line}, column {column}"


class _Refused(Exception):
    """A YAML construct the bounded loader does not take, with where it is."""

    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        self.message = message


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader without anchors and aliases, nested at most ``MAX_DEPTH``
    levels, holding at most ``MAX_YAML_VALUES`` values, building only what a JSON
    document holds: timestamps stay strings, and
    ``!!binary`` and ``!!set`` (bytes and sets, which no pipeline field takes and the
    database cannot store as JSON) are refused."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # types-PyYAML leaves Parser.peek_event unannotated; it returns the next yaml.Event.
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark, "anchors and aliases are not allowed")
        self._values += 1
        if self._values > MAX_YAML_VALUES:
            raise _Refused(
                event.start_mark,
                f"a document may hold at most {MAX_YAML_VALUES} "
                "values (scalars, lists and mappings)",
            )
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_refused(self, node: Any) -> Any:
        raise _Refused(node.start_mark, f"the tag {node.tag} is not allowed")

    def construct_timestamp(self, node: Any) -> str:
        """A timestamp stays the string it was written as. (A method of the loader, not
        ``construct_yaml_str`` itself: types-PyYAML takes only constructors whose first
        argument is a loader, and that one's is the SafeConstructor it is defined on.)"""
        return self.construct_yaml_str(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", BoundedLoader.construct_timestamp)
BoundedLoader.add_constructor("tag:yaml.org,2002:binary", BoundedLoader.construct_refused)
BoundedLoader.add_constructor("tag:yaml.org,2002:set", BoundedLoader.construct_refused)


def parse_yaml(text: str) -> Any:
    """A topology file's document, bounded (size, depth, no aliases); raises
    ``TopologyError`` with located problems."""
    check_size(len(text.encode("utf-8", "surrogatepass")))
    loader = None
    try:
        loader = BoundedLoader(text)  # refuses unprintable characters at once
        doc = loader.get_single_data()
    except _Refused as exc:
        raise TopologyError([Problem(exc.where, exc.message)]) from None
    except yaml.reader.ReaderError as exc:
        where = _at(text, exc.position) if 0 <= exc.position <= len(text) else "(document)"
        reason = str(exc).split("\n")[0]  # "unacceptable character #x009d: ..."
        raise TopologyError([Problem(where, f"not valid YAML: {reason}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise TopologyError([Problem(where, f"not valid YAML: {exc}")]) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise TopologyError([Problem("(document)", f"not valid YAML: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    check_values(doc)
    return doc


# A JSON string (skipped whole, so brackets inside strings do not count) or a bracket.
# The closing quote is optional: a string that never closes runs to the end of the text,
# so a match that starts always succeeds and the scan never starts again inside it. (A
# required closing quote would make each quote of an unterminated string start a scan to
# the end of the text: quadratic on a body of backslash-quote pairs.)
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def check_json_depth(text: str) -> None:
    """Refuse JSON text nested deeper than ``MAX_DEPTH`` without parsing it: Python's
    json module recurses once per level and fails on 100,000 brackets.

    One left-to-right scan, in time linear in the text's length and without recursion;
    the problem names the line and column of the bracket that goes one level too deep.
    Text that is not JSON is left to the parser."""
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        lexeme = match.group()
        if lexeme in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                where = _at(text, match.start())
                raise TopologyError([Problem(where, f"nested more than {MAX_DEPTH} levels deep")])
        elif lexeme in ("]", "}"):
            depth -= 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes | str, encoding: str = "utf-8") -> Any:
    """A JSON document (an API body, the editor's form field), bounded like
    :func:`parse_yaml`; raises ``TopologyError`` with located problems."""
    if isinstance(raw, bytes):
        check_size(len(raw))
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise TopologyError([Problem("(document)", f"not {encoding} text: {exc}")]) from None
    else:
        text = raw
        check_size(len(text.encode("utf-8", "surrogatepass")))
    check_json_depth(text)
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise TopologyError([Problem(where, f"not valid JSON: {exc.msg}")]) from None
    except (ValueError, RecursionError) as exc:  # NaN, Infinity, a 5,000-digit integer
        raise TopologyError([Problem("(document)", f"not valid JSON: {exc}")]) from None
    check_values(doc)
    return doc


def _value_problem(value: Any) -> str | None:
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character, which cannot be stored"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode text (a lone surrogate)"
    elif isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return "is too large a number"
    return None


def check_values(doc: Any) -> None:
    """Refuse what no field may hold and the database cannot store, wherever it is:
    NUL characters, lone surrogates, non-finite or out-of-range numbers; and nesting
    deeper than ``MAX_DEPTH`` (for documents that did not come through a parser here).
    Iterative, so the document's depth cannot exhaust the stack."""
    problems: list[Problem] = []
    stack: list[tuple[str, Any, int]] = [("", doc, 1)]
    while stack:
        at, value, depth = stack.pop()
        if isinstance(value, dict | list | tuple) and depth > MAX_DEPTH:
            problems.append(
                Problem(at or "(document)", f"nested more than {MAX_DEPTH} levels deep")
            )
            continue
        if isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                where = f"{at}.{key}" if at else str(key)
                message = _value_problem(key)
                if message:
                    problems.append(Problem(f"{where} (key)", message))
                stack.append((where, item, depth + 1))
        elif isinstance(value, list | tuple):
            for index in reversed(range(len(value))):
                stack.append((f"{at}[{index}]", value[index], depth + 1))
        else:
            message = _value_problem(value)
            if message:
                problems.append(Problem(at or "(document)", message))
    if problems:
        listed = problems[:MAX_LISTED]
        if len(problems) > MAX_LISTED:
            listed.append(Problem("(document)", f"and {len(problems) - MAX_LISTED} more"))
        raise TopologyError(listed)


def validate_for_save(doc: Any, *, read_tables: bool = True) -> list[Problem]:
    """Document problems plus those that need the database (named policy exists, the
    sink's target is not another pipeline's) and, with ``read_tables``, the joins'
    reference tables (their columns and types)."""
    base: Policy | None = Policy.default()
    problems: list[Problem] = []
    if isinstance(doc, dict) and isinstance(doc.get("policy"), str):
        base = Policy.objects.filter(name=doc["policy"]).first()
        if base is None:
            known = ", ".join(Policy.objects.values_list("name", flat=True)) or "none"
            problems.append(Problem("policy", f"unknown policy {doc['policy']!r} (known: {known})"))
    values = base.values() if base else None
    problems += validate_document(doc, values)
    if not problems:
        owned = service.sink_owner_problem(doc)
        if owned:
            sink = next(n["name"] for n in doc["nodes"] if n["kind"] == "sink")
            problems.append(Problem(f"node {sink}", owned))
    if not problems and read_tables:
        for found in service.reference_problems(doc):
            at = f"nodes[{found.node}] ({doc['nodes'][found.node]['name']}).params"
            problems.append(Problem(f"{at}.{found.param}", found.message))
    return problems


@transaction.atomic
def save_document(doc: Any) -> tuple[Pipeline, bool]:
    """Create or update the pipeline ``doc`` names; nothing is written if it is invalid.

    Returns the pipeline and whether it was created. Existing nodes and edges are kept
    (by name and by endpoints) so that past runs still point at them.
    """
    problems = validate_for_save(doc)
    if problems:
        raise TopologyError(problems)
    pipeline, created = Pipeline.objects.select_for_update().get_or_create(name=doc["name"])
    pipeline.description = doc.get("description", "") or ""
    pipeline.policy = Policy.objects.get(name=doc["policy"]) if doc.get("policy") else None
    pipeline.policy_overrides = dict(doc.get("policy_overrides") or {})
    pipeline.save()

    wanted = {n["name"]: n for n in doc["nodes"]}
    pipeline.nodes.exclude(name__in=wanted).delete()
    nodes: dict[str, Node] = {}
    for name, spec in wanted.items():
        node, _ = Node.objects.update_or_create(
            pipeline=pipeline,
            name=name,
            defaults={
                "kind": spec["kind"],
                "stage": spec.get("stage", "") or "",
                "operator": service.operator_name(spec),
                "params": service.stored_params(
                    service.operator_name(spec), spec.get("params") or {}
                ),
                "buffer_mb": float(spec.get("buffer_mb", service.DEFAULT_BUFFER_MB)),
                "max_rate_mbps": float(spec.get("max_rate_mbps", service.DEFAULT_MAX_RATE_MBPS)),
            },
        )
        nodes[name] = node

    wanted_edges = {(e["from"], e["to"]): e for e in doc.get("edges", [])}
    for edge in pipeline.edges.select_related("source", "target"):
        if (edge.source.name, edge.target.name) not in wanted_edges:
            edge.delete()
    for (src, dst), spec in wanted_edges.items():
        Edge.objects.update_or_create(
            pipeline=pipeline,
            source=nodes[src],
            target=nodes[dst],
            defaults={
                "bandwidth_mbps": float(spec.get("bandwidth_mbps", service.DEFAULT_BANDWIDTH_MBPS))
            },
        )
    return pipeline, created


def export_document(pipeline: Pipeline) -> service.PipelineDocument:
    """The pipeline as a document that :func:`save_document` turns back into it."""
    doc: dict[str, Any] = {"name": pipeline.name}
    if pipeline.description:
        doc["description"] = pipeline.description
    if pipeline.policy is not None:
        doc["policy"] = pipeline.policy.name
    if pipeline.policy_overrides:
        doc["policy_overrides"] = dict(pipeline.policy_overrides)
    doc["nodes"] = []
    for node in pipeline.nodes.order_by("id"):
        item: dict[str, Any] = {"name": node.name, "kind": node.kind}
        if node.stage:
            item["stage"] = node.stage
        item["operator"] = node.operator
        if node.params:
            item["params"] = dict(node.params)
        item["buffer_mb"] = node.buffer_mb
        if node.max_rate_mbps:
            item["max_rate_mbps"] = node.max_rate_mbps
        doc["nodes"].append(item)
    doc["edges"] = []
    for edge in pipeline.edges.select_related("source", "target").order_by("id"):
        item = {"from": edge.source.name, "to": edge.target.name}
        if edge.bandwidth_mbps:
            item["bandwidth_mbps"] = edge.bandwidth_mbps
        doc["edges"].append(item)
    return cast("service.PipelineDocument", doc)


def dump_yaml(doc: service.PipelineDocument | dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
