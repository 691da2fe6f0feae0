"""Recording what happens to a run, as rows that feed the event timeline."""

from __future__ import annotations

from typing import Any

from orchestrator.models import Event


def record_event(
    run_id: int | None,
    kind: str,
    reason: str,
    *,
    node: str = "",
    actor: str = Event.Actor.SYSTEM,
    user: Any = None,
    data: dict[str, Any] | None = None,
) -> Event:
    return Event.objects.create(
        run_id=run_id,
        kind=kind,
        reason=reason,
        node=node[:100],
        actor=Event.Actor.USER if user is not None else actor,
        user=user,
        data=data or {},
    )
