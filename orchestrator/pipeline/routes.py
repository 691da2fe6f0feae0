"""Where an upstream sends a segment: its tagged branch, the traffic shares, migrations.

Pure and deterministic: the same segment and routes always give the same target, so a
batch re-run after a crash sends its outputs where the first attempt would have.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def _unit(text: str) -> float:
    """A stable pseudo-random number in [0, 1) for ``text``."""
    return zlib.crc32(text.encode()) / 2**32


def tagged_target(tag: str, downstreams: Sequence[str]) -> str:
    return downstreams[zlib.crc32(tag.encode()) % len(downstreams)]


@dataclass(frozen=True)
class Routes:
    """An upstream's routing table, as kept in ZooKeeper under ``routes/<node>``."""

    shares: Mapping[str, float] | None = None
    # heavy child -> {light child: share of the heavy child's traffic sent there}
    migrations: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "shares": dict(self.shares) if self.shares is not None else None,
            "migrations": {k: dict(v) for k, v in self.migrations.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Routes:
        if not data:
            return cls()
        return cls(shares=data.get("shares"), migrations=data.get("migrations") or {})


def tagged_route(tag: str, downstreams: Sequence[str], routes: Routes) -> str:
    """The downstream a segment is meant for before any migration moves it."""
    if len(downstreams) == 1:
        return downstreams[0]
    return tagged_target(tag, downstreams) if not routes.shares else ""


def route(segment_id: str, tag: str, downstreams: Sequence[str], routes: Routes) -> tuple[str, str]:
    """The downstream for a segment, and the branch it was migrated from ("" if none)."""
    if len(downstreams) == 1:
        return downstreams[0], ""
    if routes.shares:
        target = _weighted(_unit("share:" + segment_id), downstreams, routes.shares)
    else:
        target = tagged_target(tag, downstreams)
    moves = routes.migrations.get(target)
    if moves:
        draw = _unit("migrate:" + segment_id)
        cumulative = 0.0
        for light, share in sorted(moves.items()):
            cumulative += share
            if draw < cumulative and light in downstreams:
                return light, target
    return target, ""


def _weighted(draw: float, downstreams: Sequence[str], shares: Mapping[str, float]) -> str:
    total = sum(max(0.0, shares.get(d, 0.0)) for d in downstreams)
    if total <= 0:
        return downstreams[0]
    cumulative = 0.0
    for node in downstreams:
        cumulative += max(0.0, shares.get(node, 0.0)) / total
        if draw < cumulative:
            return node
    return downstreams[-1]
