"""What a run took in, from the ledger alone: what its merged chunks must tile.

A bounded input is its files as measured; a landing folder is every file it took in,
up to where the run's position reached; a stream is the entries the run numbered. The
same answer serves the run's end (coverage) and any later look at it (the summary).
"""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.models import Run, SourceFile
from orchestrator.pipeline.graph import input_extent
from orchestrator.pipeline.inputs import recorded_inputs


def ingested_extent(run: Run) -> list[tuple[int, int]]:
    spec = run.input_spec or {}
    position = run.source_position or {}
    kind = spec.get("kind")
    if kind == "stream":
        return [(0, int(position.get("offset", 0)))]
    if kind == "folder":
        reached = int(position.get("file", 0))
        offset = position.get("offset")
        spans: list[tuple[int, int]] = []
        for index, start, size in SourceFile.objects.filter(run=run).values_list(
            "index", "data_start", "size"
        ):
            # A file cleaned long ago, below the merged prefix, has no row any more
            # (orchestrator/source/landing.py): the prefix covers it.
            spans.extend((0, 0) for _ in range(len(spans), index))
            if index < reached:
                spans.append((start, size))
            elif index == reached and offset is not None:
                spans.append((start, int(offset)))
            else:
                spans.append((start, start))
        return spans
    # A generated input has no paths until the run's driver has written it (a run
    # cancelled or failed before that has nothing to cover).
    paths = spec.get("paths") or []
    return input_extent(recorded_inputs(spec, spec.get("format", "jsonl"))) if paths else []


def streamed_copies(run_id: int, stage: str, chunks: Collection[int]) -> dict[int, str]:
    """The copy of join ``stage``'s refreshed table that each of a stream run's chunks
    ``chunks`` (by index) joins, for the chunks emitted after a refresh
    (orchestrator/run/references.py records the chunk each copy takes effect from, in
    the run's row, before any such chunk is emitted)."""
    references = Run.objects.values_list("references", flat=True).get(pk=run_id) or {}
    since = (references.get(stage) or {}).get("since") or []
    found = {}
    for chunk in chunks:
        later = [str(s["file"]) for s in since if int(s["chunk"]) <= chunk]
        if later:
            found[chunk] = later[-1]
    return found


def joined_copies(run_id: int, stage: str, files: Collection[int]) -> dict[int, str]:
    """The copy of join ``stage``'s refreshed table that each of the landing files
    ``files`` (by index) joins, for the files bound to a copy other than the run's first
    (orchestrator/source/landing.py binds it when it takes a file in)."""
    bound = SourceFile.objects.filter(run_id=run_id, index__in=list(files)).values_list(
        "index", "references"
    )
    return {index: str(refs[stage]) for index, refs in bound if stage in refs}
