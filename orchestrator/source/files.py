"""Bounded input: files or a glob, measured when the run was created, read once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.conf import settings

from balancer.units import MB
from orchestrator.pipeline.beneath import Roots
from orchestrator.pipeline.inputs import Chunk, InputFile, chunks, recorded_inputs
from orchestrator.source.base import SourceLag


class FileSource:
    unbounded = False
    partitions = 1

    def __init__(
        self, input_spec: Mapping[str, Any], params: Mapping[str, Any], position: Mapping[str, Any]
    ) -> None:
        fmt = input_spec.get("format", "jsonl")
        self.files: list[InputFile] = recorded_inputs(input_spec, fmt)
        # Every file is opened by a walk from its input root's descriptor, held from
        # here to the run's end, no component followed if it is a link (ADR 12).
        self.roots = Roots(settings.INPUT_ROOTS)
        self._chunks: Iterator[Chunk] | None = chunks(
            self.files,
            fmt,
            segment_bytes=max(1, int(float(params.get("segment_mb", 1.0)) * MB)),
            route_by=params.get("route_by", "key"),
            start_file=int(position.get("file", 0)),
            start_offset=position.get("offset"),
            start_index=int(position.get("chunk", 0)),
            # The run's input files are the user's, named when it was created and not
            # changed under it: a whole one is read where it is (ADR 11).
            in_place=True,
            opener=self.roots,
        )

    def next_chunk(self) -> Chunk | None:
        if self._chunks is None:
            return None
        chunk = next(self._chunks, None)
        if chunk is None:
            self._chunks = None
        return chunk

    @property
    def exhausted(self) -> bool:
        return self._chunks is None

    def committed(self, chunk: Chunk) -> None:
        """Nothing to acknowledge: the files stay as they are."""

    def stop(self, ahead: Sequence[Chunk]) -> list[Chunk]:
        """A bounded run is cancelled, never drained: its coverage is the whole input."""
        return list(ahead)

    def lag(self) -> SourceLag:
        return SourceLag()

    def housekeeping(self, *, now: bool = False) -> None:
        """Input files are the user's: nothing to clean."""

    def close(self) -> None:
        self._chunks = None
        self.roots.close()
