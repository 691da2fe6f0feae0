"""Recording what happens to a run, as rows that feed the event timeline."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connection
from django.utils import timezone

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


def thin_events(run_id: int, *, older_than_s: float, limit: int = 5000) -> int:
    """Down-sample a continuous run's old balancer events: of those older than
    ``older_than_s``, keep the first of each kind at each node in each hour; returns how
    many went. The balancer acts every tick, so a run that goes on for days would keep
    millions; what users and the system did (operators' actions, drivers, failures) and
    the recent timeline are kept whole."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            DELETE FROM orchestrator_event WHERE id IN (
                SELECT id FROM (
                    SELECT id, row_number() OVER (
                        PARTITION BY kind, node, date_trunc('hour', time) ORDER BY id
                    ) AS nth
                    FROM orchestrator_event
                    WHERE run_id = %s AND actor = %s AND time < %s
                ) ranked
                WHERE nth > 1
                LIMIT %s
            )
            """,
            [run_id, Event.Actor.BALANCER, cutoff, limit],
        )
        return int(cursor.rowcount)
