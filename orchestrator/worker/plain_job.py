"""The plain Spark batch job over a run's input, printed like a run's result."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from orchestrator.ledger.results import format_row, sorted_rows
from orchestrator.pipeline import generator as generator_module
from orchestrator.pipeline.generator import GeneratorSpec, write_input_atomically
from orchestrator.pipeline.graph import downstreams_of
from orchestrator.pipeline.inputs import resolve_inputs
from orchestrator.run.lifecycle import RunError


def stage_chain(topology: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The operators every source-to-sink path runs, in order (one node per stage)."""
    nodes = {n["name"]: n for n in topology["nodes"]}
    source = next(n for n in topology["nodes"] if n["kind"] == "source")
    chains: set[tuple[str, ...]] = set()
    examples: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}

    def walk(name: str, path: list[Mapping[str, Any]]) -> None:
        outs = downstreams_of(topology, name)
        if not outs:
            key = tuple((n.get("stage") or n["name"]) for n in path)
            chains.add(key)
            examples[key] = path
            return
        for nxt in outs:
            node = nodes[nxt]
            walk(nxt, path if node["kind"] == "sink" else [*path, node])

    walk(source["name"], [])
    if len(chains) != 1:
        raise RunError("the batch job needs every source-to-sink path to run the same stages")
    return examples[chains.pop()]


def generated_input(topology: Mapping[str, Any], generator: str | Mapping[str, Any]) -> str:
    """The generator's file for this spec (the same file a run with it reads)."""
    spec = GeneratorSpec.parse(generator)
    source = next(n for n in topology["nodes"] if n["kind"] == "source")
    params = source.get("params") or {}
    branches = downstreams_of(topology, source["name"])
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
    topology: Mapping[str, Any],
    input_path: str | list[str] | None,
    generator: str | Mapping[str, Any] | None,
) -> dict[str, Any]:
    import time

    from sparkjobs.aggregate import AggregateParams
    from sparkjobs.batch import batch_aggregate
    from sparkjobs.session import spark_session

    if (input_path is None) == (generator is None):
        raise RunError("give exactly one of an input path (or glob) and a generator spec")
    source = next(n for n in topology["nodes"] if n["kind"] == "source")
    fmt = (source.get("params") or {}).get("format", "jsonl")
    if generator is not None:
        input_path = generated_input(topology, generator)
    files = resolve_inputs(input_path, fmt)  # type: ignore[arg-type]
    chain = stage_chain(topology)
    if not chain or chain[-1]["operator"] not in ("aggregate", "running"):
        raise RunError("the batch job computes pipelines that end in an aggregate or running stage")
    steps = [(n["operator"], n.get("params") or {}) for n in chain[:-1]]
    began = time.monotonic()
    result = batch_aggregate(
        spark_session(),
        [f.path for f in files],
        fmt,
        AggregateParams.from_params(chain[-1].get("params") or {}),
        steps,
    )
    rows = sorted_rows(
        format_row(r.key, r.count, r.sum, r.min, r.max, distinct=r.distinct) for r in result.rows
    )
    return {
        "run": None,
        "status": "completed",
        "seconds": round(time.monotonic() - began, 3),
        "segments": None,
        "migrated_segments": 0,
        "malformed_records": result.malformed,
        "coverage": "exact",
        "error": None,
        "rows": rows,
    }
