"""The plain Spark batch job over a run's input, printed like a run's result."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from balancer.document import NodeDocument, PipelineDocument
from orchestrator.ledger.groups import GroupRow, shown_row
from orchestrator.pipeline import generator as generator_module
from orchestrator.pipeline.generator import (
    GeneratorFields,
    GeneratorSpec,
    write_input_atomically,
)
from orchestrator.pipeline.graph import RunGraph
from orchestrator.pipeline.inputs import resolve_inputs
from orchestrator.pipeline.reference import job_params
from sparkjobs.catalog import OPERATORS, operator_name, operator_of
from sparkjobs.event_time import WindowSpec, iso
from sparkjobs.measures import Grouping
from sparkjobs.merge import group_order
from sparkjobs.schemas import declared_ddl
from sparkjobs.sql_stage import query_of

if TYPE_CHECKING:
    from sparkjobs.plain_job import GroupedResult


class BatchJobError(ValueError):
    """The batch job cannot compute this pipeline or input as asked."""


def stage_chain(topology: PipelineDocument) -> list[NodeDocument]:
    """The operators every source-to-sink path runs, in order (one node per stage)."""
    graph = RunGraph.of(topology)
    chains: set[tuple[str, ...]] = set()
    examples: dict[tuple[str, ...], list[NodeDocument]] = {}

    def walk(name: str, path: list[NodeDocument]) -> None:
        outs = graph.downstreams_of(name)
        if not outs:
            key = tuple(graph.stage_of[n["name"]] for n in path)
            chains.add(key)
            examples[key] = path
            return
        for nxt in outs:
            node = graph.node(nxt)
            walk(nxt, path if node["kind"] == "sink" else [*path, node])

    walk(graph.source, [])
    if len(chains) != 1:
        raise BatchJobError("the batch job needs every source-to-sink path to run the same stages")
    return examples[chains.pop()]


def generated_input(topology: PipelineDocument, generator: str | GeneratorFields) -> str:
    """The generator's file for this spec (the same file a run with it reads)."""
    spec = GeneratorSpec.parse(generator)
    graph = RunGraph.of(topology)
    params = graph.node(graph.source).get("params") or {}
    branches = list(graph.downstreams_of(graph.source))
    # The generator's own code is part of the key: a file made by an older version of
    # it is not this spec's input any more.
    code = hashlib.sha256(Path(generator_module.__file__).read_bytes()).hexdigest()
    digest = hashlib.sha256(
        json.dumps([spec.to_json(), branches, params.get("segment_mb", 1.0), code]).encode()
    ).hexdigest()[:16]
    path = Path(settings.DATA_DIR) / "generated" / f"{digest}.jsonl"
    if not path.exists():
        # Written aside and renamed: a process killed half-way, or two writing at once,
        # must not leave a file that later batch jobs would take for the input.
        write_input_atomically(path, spec, branches, float(params.get("segment_mb", 1.0)))
    return str(path)


def batch_summary(
    *,
    topology: PipelineDocument,
    input_path: str | list[str] | None,
    generator: str | GeneratorFields | None,
    copies: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """The plain Spark job's summary of ``topology`` over the input. ``copies``: for a
    join whose table a run refreshed, the copy each input file's records join (node ->
    file name -> copy's name: orchestrator/source/replay.py)."""
    import time

    from sparkjobs.plain_job import batch_grouped
    from sparkjobs.session import spark_session

    if (input_path is None) == (generator is None):
        raise BatchJobError("give exactly one of an input path (or glob) and a generator spec")
    graph = RunGraph.of(topology)
    fmt = (graph.node(graph.source).get("params") or {}).get("format", "jsonl")
    if generator is not None:
        input_path = generated_input(topology, generator)
    files = resolve_inputs(input_path, fmt)  # type: ignore[arg-type]
    chain = stage_chain(topology)
    if not chain or not operator_of(chain[-1]).partials:
        ending = " or ".join(name for name, spec in OPERATORS.items() if spec.partials)
        raise BatchJobError(f"the batch job computes pipelines that end in an {ending} stage")
    steps = [
        (operator_name(n), job_params(n, (copies or {}).get(n.get("stage") or n["name"])))
        for n in chain[:-1]
    ]
    began = time.monotonic()
    # The records the first stage reads straight from the input, with the source's
    # declared fields, as the live run's first stage reads them.
    source = graph.node(graph.source).get("params") or {}
    schema = declared_ddl(source.get("schema")) if "schema" in source else None
    query = query_of(chain[-1].get("params") or {})
    if query is None:
        raise BatchJobError(f"stage {chain[-1]['name']!r} names no valid grouping")
    if query.where is not None:
        steps.append(("filter", {"condition": query.where}))
    spec = WindowSpec.from_params(chain[-1].get("params") or {})
    grouped = batch_grouped(
        spark_session(),
        [f.path for f in files],
        fmt,
        query.grouping,
        steps,
        windows=spec,
        schema=schema,
    )
    return _summary(
        rows=_grouped_rows(query.grouping, grouped),
        seconds=time.monotonic() - began,
        malformed=grouped.malformed,
        **({} if spec is None else {"late_records": 0}),
    )


def _grouped_rows(grouping: Grouping, grouped: GroupedResult) -> list[GroupRow]:
    """The plain job's groups as a run's result rows show them, in the same order."""
    if grouped.windows is None:
        in_order = sorted(grouped.rows, key=lambda row: group_order(row[0]))
        return [shown_row(grouping, group, values) for group, values in in_order]
    windows = sorted(grouped.windows, key=lambda w: (w[0], group_order(w[2][0])))
    return [
        {"window_start": iso(start), "window_end": iso(end), **shown_row(grouping, *g)}
        for start, end, g in windows
    ]


def _summary(
    *, rows: list[GroupRow], seconds: float, malformed: int, **windows: Any
) -> dict[str, Any]:
    """The plain job's result in the shape of a run's (orchestrator/ledger/results.py)."""
    return {
        "run": None,
        "status": "completed",
        "seconds": round(seconds, 3),
        "segments": None,
        "migrated_segments": 0,
        "malformed_records": malformed,
        "coverage": "exact",
        "error": None,
        "rows": rows,
        **windows,
    }
