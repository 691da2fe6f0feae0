"""How long each batch of a run kept its worker busy, from the ledger: what the nodes'
measured capacities (balancer/capacity.py) are made of.

A batch is the segments one lease owner completed: at one node, or at several stage
siblings whose data one job ran (``orchestrator/worker/batch.py``). It was busy from its
claim to its completion, both stamped by the worker that ran it (so a batch waiting in
a queue is not busy); its size is the bytes it took in, and the records its operator
counted in them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection

from balancer.capacity import BatchSample, overall
from orchestrator.models import Run, Segment

_TABLE = Segment._meta.db_table


@dataclass(frozen=True)
class Completed:
    """Batches completed after a moment, and the latest completion among them."""

    batches: list[BatchSample]
    latest: dt.datetime | None


def completed_since(run_id: int, after: dt.datetime | None) -> Completed:
    """The run's batches completed after ``after`` (all of them for None).

    The driver asks every tick from the latest completion it saw. A batch committing
    after a later one was read, with an earlier completion time, is not seen: one sample
    fewer for an estimate, never a wrong one.
    """
    window = "" if after is None else "AND done_at > %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT array_agg(DISTINCT node ORDER BY node), SUM(bytes),
                   EXTRACT(EPOCH FROM MAX(done_at) - MIN(claimed_at)), MAX(done_at),
                   SUM(records)
            FROM {_TABLE}
            WHERE run_id = %s AND state = 'done' AND NOT marker
              AND claimed_at IS NOT NULL AND lease_owner <> '' {window}
            GROUP BY lease_owner
            ORDER BY 4
            """,  # noqa: S608 - the model's own table; values are parameters
            [run_id] if after is None else [run_id, after],
        )
        rows = cursor.fetchall()
    batches = [
        BatchSample(tuple(nodes), float(size), float(busy), ended.timestamp(), float(records))
        for nodes, size, busy, ended, records in rows
    ]
    latest = max((row[3] for row in rows), default=after)
    return Completed(batches, latest)


def running(run_id: int) -> list[BatchSample]:
    """The run's batches running now (claimed under a live lease), each with the seconds
    it has run so far as its ``busy_s`` (from its claim to the database's clock, which
    the leases are compared with too)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT array_agg(DISTINCT node ORDER BY node), SUM(bytes),
                   EXTRACT(EPOCH FROM now() - MIN(claimed_at))
            FROM {_TABLE}
            WHERE run_id = %s AND state = 'claimed' AND lease_expires > now()
              AND NOT marker AND claimed_at IS NOT NULL AND lease_owner <> ''
            GROUP BY lease_owner
            """,  # noqa: S608 - the model's own table; values are parameters
            [run_id],
        )
        rows = cursor.fetchall()
    return [BatchSample(tuple(nodes), float(size), float(ran)) for nodes, size, ran in rows]


def measured_capacities(run: Run) -> dict[str, float]:
    """Each node's true processing rate over the run's batches still in the ledger:
    bytes taken in per second of busy time (balancer.capacity.overall)."""
    return overall(completed_since(run.pk, None).batches)
