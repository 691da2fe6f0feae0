"""The run's backpressure flags as the driver holds them, and the changes ZooKeeper has
yet to be told: a tick may set and clear dozens, written in one pipelined round."""

from __future__ import annotations

from orchestrator.zk.control_plane import ControlPlane


class Flags:
    def __init__(self, flagged: set[str] | None = None) -> None:
        self.flagged: set[str] = set(flagged or ())
        self.to_set: set[str] = set()
        self.to_clear: set[str] = set()

    def set(self, node: str) -> None:
        self.flagged.add(node)
        self.to_clear.discard(node)
        self.to_set.add(node)

    def clear(self, node: str) -> None:
        self.flagged.discard(node)
        self.to_set.discard(node)
        self.to_clear.add(node)

    def flush(self, control: ControlPlane, run_key: str) -> None:
        if self.to_set or self.to_clear:
            control.update_flags(run_key, self.to_set, self.to_clear)
            self.to_set.clear()
            self.to_clear.clear()
