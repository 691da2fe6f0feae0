"""What an adjustment did to its stages' capacity, on the run's timeline.

A scale-out is worth what it adds, and only measurement says that: the instances it
placed may have landed on a slow worker, or on cores the stage already had. So for
every adjustment that changes where a stage runs (a scale-out, a scale-in, a failover,
a hot migration) the stage's measured capacity (balancer/sizing.py
``stage_capacity``: its resources' true rates, each counted once) is noted when the
adjustment begins and again once it completed and every instance of the stage has
been measured where it now runs; one ``capacity_measured`` event then says both. An
adjustment rolled back says nothing; one whose instances are still unmeasured after
:data:`WAIT_S` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from balancer.model import Observation
from balancer.sizing import StageCapacity, stage_capacity
from balancer.units import MB
from orchestrator.ledger.events import record_event
from orchestrator.models import Adjustment, Event

KINDS = frozenset({"scale_out", "scale_in", "failover", "migrate"})
WAIT_S = 300.0


@dataclass
class _Pending:
    version: int
    kind: str
    stages: tuple[str, ...]
    before: dict[str, StageCapacity]
    ended_s: float | None = None


def _mbps(found: StageCapacity) -> str:
    return f"{found.bytes_per_s / MB:.2f} MB/s on {found.resources} resource(s)"


class CapacityLog:
    """A run's adjustments waiting for their stages' capacity after."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.pending: dict[int, _Pending] = {}
        self.last: dict[str, StageCapacity] = {}  # each stage's last known capacity

    def update(self, observation: Observation, current: Adjustment | None, now_s: float) -> None:
        """Once a tick: note an adjustment that began, and say what the ones that ended
        did once it is measured."""
        topology = observation.topology
        measured = {
            stage: found
            for stage, members in topology.stages.items()
            if (found := stage_capacity(observation, members)).known
        }
        if current is not None and current.kind in KINDS and current.version not in self.pending:
            stages = tuple(current.plan.get("changed_stages", ()))
            before = {s: self.last[s] for s in stages if s in self.last}
            self.pending[current.version] = _Pending(current.version, current.kind, stages, before)
        for pending in list(self.pending.values()):
            if current is not None and current.version == pending.version:
                continue
            if pending.ended_s is None:
                pending.ended_s = now_s
                status = (
                    Adjustment.objects.filter(run_id=self.run_id, version=pending.version)
                    .values_list("status", flat=True)
                    .first()
                )
                if status != Adjustment.Status.COMPLETE:
                    del self.pending[pending.version]
                continue  # this tick's observation may predate the new graph
            after = {s: measured[s] for s in pending.stages if s in measured}
            if len(after) == len(pending.stages) or now_s - pending.ended_s > WAIT_S:
                self._record(pending, after)
                del self.pending[pending.version]
        self.last.update(measured)

    def _record(self, pending: _Pending, after: dict[str, StageCapacity]) -> None:
        parts = []
        data: dict[str, dict[str, float | int | None]] = {}
        for stage in pending.stages:
            was, now = pending.before.get(stage), after.get(stage)
            after_text = f"{_mbps(now)} after" if now else f"not measured {WAIT_S:.0f} s after"
            parts.append(
                f"stage {stage}: {_mbps(was) if was else 'not measured'} before, {after_text}"
            )
            data[stage] = {
                "before_bps": round(was.bytes_per_s, 1) if was else None,
                "before_resources": was.resources if was else None,
                "after_bps": round(now.bytes_per_s, 1) if now else None,
                "after_resources": now.resources if now else None,
            }
        record_event(
            self.run_id,
            "capacity_measured",
            f"{pending.kind} (adjustment {pending.version}): " + "; ".join(parts),
            node=pending.stages[0] if pending.stages else "",
            actor=Event.Actor.SYSTEM,
            data={"adjustment": pending.version, "kind": pending.kind, "stages": data},
        )
