"""Pipelines to and from the documented topology format (docs/topology-format.md)."""

from __future__ import annotations

from typing import Any

import yaml
from django.db import transaction

from webapp.console.models import Edge, Node, Pipeline, Policy
from webapp.console.topology import Problem, TopologyError, validate_document

DEFAULT_OPERATOR = {"source": "read", "sink": "merge"}


def parse_yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise TopologyError([Problem(where, f"not valid YAML: {exc}")]) from None


def validate_for_save(doc: Any) -> list[Problem]:
    """Document problems plus those that need the database (named policy exists)."""
    base: Policy | None = Policy.default()
    problems: list[Problem] = []
    if isinstance(doc, dict) and isinstance(doc.get("policy"), str):
        base = Policy.objects.filter(name=doc["policy"]).first()
        if base is None:
            known = ", ".join(Policy.objects.values_list("name", flat=True)) or "none"
            problems.append(Problem("policy", f"unknown policy {doc['policy']!r} (known: {known})"))
    values = base.values() if base else None
    return problems + validate_document(doc, values)


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
                "operator": spec.get("operator", DEFAULT_OPERATOR.get(spec["kind"], "")),
                "params": dict(spec.get("params") or {}),
                "buffer_mb": float(spec.get("buffer_mb", 64.0)),
                "max_rate_mbps": float(spec.get("max_rate_mbps", 0.0)),
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
            defaults={"bandwidth_mbps": float(spec.get("bandwidth_mbps", 0.0))},
        )
    return pipeline, created


def export_document(pipeline: Pipeline) -> dict[str, Any]:
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
    return doc


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
