"""What the balancer has set for each node, as the driver applies it: the source's
pacing (rate coefficient, stepwise speed, credits) and every task's speed, which the
next observation reports back (balancer.runtime.observe)."""

from __future__ import annotations

from dataclasses import dataclass, field

from balancer.stepwise import TaskSpeed


@dataclass
class NodeControl:
    coefficient: float = 1.0
    speed: TaskSpeed = field(default_factory=TaskSpeed)
    # Bytes the node may still send to each downstream (credit-based); None: no limit.
    credits: dict[str, float] | None = None


class Controls:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeControl] = {}

    def of(self, node: str) -> NodeControl:
        return self.nodes.setdefault(node, NodeControl())

    def speeds(self) -> dict[str, TaskSpeed]:
        return {node: control.speed for node, control in self.nodes.items()}
