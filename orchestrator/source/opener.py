"""The source a run reads, from what was stored with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from orchestrator.models import Run
from orchestrator.source.base import Source
from orchestrator.source.files import FileSource
from orchestrator.source.landing import LandingFolderSource
from orchestrator.source.spec import LandingSpec, StreamSpec, unbounded_spec
from orchestrator.source.stream import RedisStreamSource


def open_source(run: Run, epoch: int, params: Mapping[str, Any]) -> Source:
    """The run's source, positioned where its committed data ends."""
    spec = unbounded_spec(run.input_spec)
    position = run.source_position or {}
    if isinstance(spec, LandingSpec):
        return LandingFolderSource(run.pk, epoch, spec, params, position)
    if isinstance(spec, StreamSpec):
        return RedisStreamSource(run.pk, spec, params, position, url=spec.url or settings.REDIS_URL)
    return FileSource(run.input_spec, params, position)
