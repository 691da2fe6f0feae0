"""The built-in input: the simulator's seeded bursty/skewed workload as JSON lines.

Packets come from :func:`balancer.sim.workload.generate` (same seed, same packets); each
packet becomes about one segment of records ``{"key", "value", "user"}`` whose keys route
to the packet's branch, so the skew of the workload is the skew the source sees.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from balancer.sim.workload import Workload, WorkloadSpec, generate
from balancer.units import MB
from orchestrator.pipeline.routes import tagged_target

RECORD_BYTES = 52  # typical length of one generated line
VALUE_CENTS = 10_000_000  # a value is a whole number of cents below this
DEFAULT_MAX_MB = 4096  # BPCONSOLE_GENERATOR_MAX_MB when no setting is configured
MAX_SPEC_CHARS = 512  # the longest spec text: every field's name and value fit many times
MAX_VALUE_CHARS = 64  # the longest value of one field


# A generator spec given as fields by name (an API body, say): checked by
# :meth:`GeneratorSpec.parse` like the text form.
GeneratorFields = Mapping[str, object]


class GeneratorError(ValueError):
    pass


@dataclass(frozen=True)
class Bound:
    """The values a field may take: from ``low`` to ``high``, each end included unless
    it is open."""

    low: float
    high: float
    open_low: bool = False
    open_high: bool = False
    unit: str = ""

    def admits(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f"{left}{_shown(self.low)}, {_shown(self.high)}{right}{unit}"


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# Each bound keeps one generation's work proportional to its volume (volume_mb's bound is
# the setting BPCONSOLE_GENERATOR_MAX_MB): key names are searched one by one per branch,
# the skew's episodes are drawn one by one over the input's length in time (volume at
# 10 MB/s), so neither a tiny skew_mean_s nor a huge keys_per_branch can stall a worker.
BOUNDS: dict[str, Bound] = {
    "seed": Bound(0, 2**32 - 1),
    "dominance": Bound(0, 1, open_high=True),
    "skew_mean_s": Bound(0.1, 86_400, unit="s"),
    "keys_per_branch": Bound(1, 10_000),
    "users": Bound(1, 1_000_000),
    "malformed_every": Bound(0, 1_000_000_000),
}


def max_volume_mb() -> float:
    """The largest generated input, in MB (setting BPCONSOLE_GENERATOR_MAX_MB)."""
    from django.conf import settings

    if not settings.configured:
        return float(DEFAULT_MAX_MB)
    return float(getattr(settings, "BPCONSOLE_GENERATOR_MAX_MB", DEFAULT_MAX_MB))


@dataclass(frozen=True)
class GeneratorSpec:
    seed: int = 7
    volume_mb: float = 32.0
    dominance: float = 0.8
    skew_mean_s: float = 20.0
    keys_per_branch: int = 16
    users: int = 400
    malformed_every: int = 0  # every n-th record is garbage; 0 = none

    @classmethod
    def parse(cls, text: str | GeneratorFields, *, max_mb: float | None = None) -> GeneratorSpec:
        """From ``"seed=7,volume_mb=64,dominance=0.8"`` or a mapping; every field checked
        against its bound (volume_mb against ``max_mb``, by default the setting
        BPCONSOLE_GENERATOR_MAX_MB) before anything is written. Raises
        :class:`GeneratorError` naming the field, the value and the limit."""
        items = _items(text)
        known = cls.__dataclass_fields__
        unknown = sorted(set(items) - set(known))
        if unknown:
            raise GeneratorError(f"unknown generator field(s) {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, raw in items.items():
            whole = known[name].type in {"int", int}
            values[name] = _number(name, raw, whole=whole)
        spec = cls(**values)
        spec.check(max_volume_mb() if max_mb is None else max_mb)
        return spec

    def check(self, max_mb: float) -> None:
        """Raise :class:`GeneratorError` for the first field out of its bound."""
        if not 0 < self.volume_mb <= max_mb:
            raise GeneratorError(
                f"generator field volume_mb: {_shown(self.volume_mb)} MB is "
                + ("over the limit of " if self.volume_mb > 0 else "not positive; the limit is ")
                + f"{_shown(max_mb)} MB (BPCONSOLE_GENERATOR_MAX_MB)"
            )
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if not bound.admits(value):
                raise GeneratorError(
                    f"generator field {name}: {_shown(value)} is out of range; "
                    f"it must lie in {bound.text()}"
                )

    def to_json(self) -> dict[str, float]:
        return dict(self.__dict__)


def _items(text: str | GeneratorFields) -> GeneratorFields:
    if isinstance(text, str):
        if len(text) > MAX_SPEC_CHARS:
            raise GeneratorError(
                f"generator spec is {len(text)} characters long; the limit is {MAX_SPEC_CHARS}"
            )
        pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise GeneratorError(f"generator spec {shown!r}: use name=value,name=value")
        items: dict[str, object] = {}
        for name, value in pairs:
            if name.strip() in items:
                raise GeneratorError(f"generator field {name.strip()} is given twice")
            items[name.strip()] = value.strip()
        return items
    if not isinstance(text, Mapping) or not all(isinstance(k, str) for k in text):
        raise GeneratorError("a generator spec is text (name=value,...) or a mapping by name")
    return text


def _number(name: str, raw: object, *, whole: bool) -> int | float:
    """``raw`` as the field's type; never NaN or infinite, never silently rounded."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise GeneratorError(f"generator field {name}: {raw!r} is not a number")
    if isinstance(raw, str) and len(raw) > MAX_VALUE_CHARS:
        raise GeneratorError(
            f"generator field {name}: the value is {len(raw)} characters long; "
            f"the limit is {MAX_VALUE_CHARS}"
        )
    try:
        value = float(raw)
    except ValueError:
        raise GeneratorError(f"generator field {name}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise GeneratorError(f"generator field {name}: {raw!r} is not a finite number")
    if not whole:
        return value
    if not value.is_integer():
        raise GeneratorError(f"generator field {name}: {raw!r} is not a whole number")
    if isinstance(raw, str):
        try:
            return int(raw)  # exact, beyond float's 2**53
        except ValueError:
            pass  # "1e3", "7.0": whole, written as a float
    return int(value)


def keys_for(branches: Sequence[str], per_branch: int) -> dict[str, list[str]]:
    """Key names whose routing hash sends them to each branch."""
    keys: dict[str, list[str]] = {b: [] for b in branches}
    index = 0
    while any(len(v) < per_branch for v in keys.values()):
        name = f"key-{index}"
        branch = tagged_target(name, branches)
        if len(keys[branch]) < per_branch:
            keys[branch].append(name)
        index += 1
    return keys


def record_line(key: str, cents: int, user: int) -> str:
    """One generated record as a JSON line: the format :func:`write_input` and the
    producer (:mod:`orchestrator.pipeline.producer`) both write."""
    return f'{{"key":"{key}","value":{cents / 100},"user":"u{user}"}}\n'


Progress = Callable[[int, int], None]


def generated_workload(spec: GeneratorSpec, branches: Sequence[str], segment_mb: float) -> Workload:
    """The packets the input is written from, in order, each tagged with the branch its
    records' keys route to: about one source segment each. The simulator's policy lab
    takes them as the input's chunks."""
    packet_bytes = max(1024.0, segment_mb * MB)
    return generate(
        WorkloadSpec(
            volume_bytes=max(spec.volume_mb * MB, packet_bytes),
            mean_rate_bps=10 * MB,
            packet_bytes=packet_bytes,
            dominance=spec.dominance,
            skew_mean_s=spec.skew_mean_s,
        ),
        list(branches),
        spec.seed,
    )


def write_input(
    path: Path,
    spec: GeneratorSpec,
    branches: Sequence[str],
    segment_mb: float,
    progress: Progress | None = None,
) -> int:
    """Write the generated input; returns its size in bytes.

    ``progress(written, total)`` is called after every packet (``total`` is the planned
    size, which the written size may pass by a little); it may raise to stop the writing.
    """
    workload = generated_workload(spec, branches, segment_mb)
    packet_bytes = workload.packet_bytes
    keys = keys_for(branches, spec.keys_per_branch)
    rng = np.random.default_rng(spec.seed + 1)
    per_packet = max(1, int(packet_bytes // RECORD_BYTES))
    planned = len(workload.tag_index) * int(packet_bytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    count = 0
    with path.open("w") as out:
        for tag_index in workload.tag_index:
            pool = keys[workload.tags[int(tag_index)]]
            key_ix = rng.integers(len(pool), size=per_packet)
            cents = rng.integers(0, VALUE_CENTS, size=per_packet)
            users = rng.integers(spec.users, size=per_packet)
            lines = [
                record_line(pool[k], c, u)
                for k, c, u in zip(key_ix.tolist(), cents.tolist(), users.tolist(), strict=True)
            ]
            if spec.malformed_every:
                for i in range(per_packet):
                    if (count + i + 1) % spec.malformed_every == 0:
                        lines[i] = "this is not a record\n"
            count += per_packet
            body = "".join(lines)
            out.write(body)
            written += len(body)
            if progress is not None:
                progress(written, max(planned, written))
        out.flush()
        os.fsync(out.fileno())
    return written


def partial_paths(path: Path) -> list[Path]:
    """Files :func:`write_input_atomically` left beside ``path`` when killed half-way."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def write_input_atomically(
    path: Path,
    spec: GeneratorSpec,
    branches: Sequence[str],
    segment_mb: float,
    progress: Progress | None = None,
    *,
    before_rename: Callable[[], None] | None = None,
) -> int:
    """:func:`write_input` aside, then renamed onto ``path``: ``path`` either does not
    exist or holds the whole input. A writer stopped by an exception removes its own
    partial file; one killed leaves it under a name no reader takes for the input
    (:func:`partial_paths` finds it). ``before_rename`` may raise to keep the finished
    file from being renamed (its writer no longer owns the input)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        size = write_input(partial, spec, branches, segment_mb, progress)
        if before_rename is not None:
            before_rename()
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return size
