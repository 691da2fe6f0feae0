"""The run's events as a tick produces them: queued, then written in one statement by
the reporter thread, off the balancer's critical path."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.models import Event

NODE_CHARS = 100  # Event.node's column


class Timeline:
    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.pending: list[Event] = []

    def add(
        self,
        kind: str,
        reason: str,
        *,
        node: str = "",
        actor: str = "balancer",
        data: Mapping[str, object] | None = None,
    ) -> None:
        self.pending.append(
            Event(
                run_id=self.run_id,
                kind=kind,
                reason=reason,
                node=node[:NODE_CHARS],
                actor=actor,
                data=dict(data or {}),
            )
        )

    def take(self) -> list[Event]:
        events, self.pending = self.pending, []
        return events
