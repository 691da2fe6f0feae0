"""The built-in input: the simulator's seeded bursty/skewed workload as JSON lines.

Packets come from :func:`balancer.sim.workload.generate` (same seed, same packets); each
packet becomes about one segment of records ``{"key", "value", "user"}`` whose keys route
to the packet's branch, so the skew of the workload is the skew the source sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from balancer.sim.workload import WorkloadSpec, generate
from orchestrator.routing import tagged_target

MB = 1024 * 1024
RECORD_BYTES = 52  # typical length of one generated line


class GeneratorError(ValueError):
    pass


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
    def parse(cls, text: str | Mapping[str, Any]) -> GeneratorSpec:
        """From ``"seed=7,volume_mb=64,dominance=0.8"`` or a mapping."""
        items: Mapping[str, Any]
        if isinstance(text, str):
            pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise GeneratorError(f"generator spec {text!r}: use name=value,name=value")
            items = {k.strip(): v.strip() for k, v in pairs}
        else:
            items = text
        known = cls.__dataclass_fields__
        unknown = sorted(set(items) - set(known))
        if unknown:
            raise GeneratorError(f"unknown generator field(s) {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, raw in items.items():
            kind = int if known[name].type in {"int", int} else float
            try:
                values[name] = kind(raw)
            except (TypeError, ValueError):
                raise GeneratorError(f"generator field {name}: {raw!r} is not a number") from None
        spec = cls(**values)
        if spec.volume_mb <= 0 or spec.keys_per_branch < 1 or spec.users < 1:
            raise GeneratorError("volume_mb, keys_per_branch and users must be positive")
        if not 0 <= spec.dominance < 1:
            raise GeneratorError("dominance must lie in [0, 1)")
        return spec

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


def write_input(path: Path, spec: GeneratorSpec, branches: Sequence[str], segment_mb: float) -> int:
    """Write the generated input; returns its size in bytes."""
    packet_bytes = max(1024.0, segment_mb * MB)
    workload = generate(
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
    keys = keys_for(branches, spec.keys_per_branch)
    rng = np.random.default_rng(spec.seed + 1)
    per_packet = max(1, int(packet_bytes // RECORD_BYTES))
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    count = 0
    with path.open("w") as out:
        for tag_index in workload.tag_index:
            pool = keys[workload.tags[int(tag_index)]]
            key_ix = rng.integers(len(pool), size=per_packet)
            cents = rng.integers(0, 10_000_000, size=per_packet)
            users = rng.integers(spec.users, size=per_packet)
            lines = [
                f'{{"key":"{pool[k]}","value":{c / 100},"user":"u{u}"}}\n'
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
    return written
