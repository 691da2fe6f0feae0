"""The end of a run, and what its balancer ticks cost.

A run completes when the source is exhausted (a bounded input read to its end, an
unbounded one stopped by an operator), no batch is in flight, no hot rescale is
under way, no segment is unfinished, and the sink merged every chunk of the input
exactly once (the coverage check); anything less fails it, saying what is missing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from orchestrator.ledger import segments
from orchestrator.ledger.events import record_event
from orchestrator.ledger.ingested import ingested_extent
from orchestrator.models import Run
from orchestrator.run.wakeups import announce


@dataclass
class TickStats:
    """How long each balancer tick took, and each phase of it, summed."""

    ticks: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + (time.perf_counter() - began)

    def summary(self) -> dict[str, float]:
        ticks = sorted(self.ticks)
        if not ticks:
            return {"ticks": 0}
        return {
            "ticks": len(ticks),
            "p50_ms": 1000 * ticks[len(ticks) // 2],
            "p99_ms": 1000 * ticks[min(len(ticks) - 1, int(len(ticks) * 0.99))],
            "max_ms": 1000 * ticks[-1],
            **{f"{k}_ms_per_tick": 1000 * v / len(ticks) for k, v in self.phases.items()},
        }

    def text(self) -> str:
        stats = self.summary()
        if not stats["ticks"]:
            return "no balancer tick ran"
        return (
            f"{stats['ticks']:.0f} balancer ticks: p50 {stats['p50_ms']:.1f} ms, "
            f"p99 {stats['p99_ms']:.1f} ms, max {stats['max_ms']:.1f} ms"
        )


def settle(run: Run, epoch: int, stats: TickStats) -> None:
    """Complete or fail ``run`` by its coverage of what it took in; only the owner of
    ``epoch`` may."""
    with transaction.atomic():
        # The run's row first, as every end of a run: a merge in flight commits before
        # the coverage is counted, and one after it is refused (segments._refuse_ended).
        list(Run.objects.select_for_update().filter(pk=run.pk).values_list("pk", flat=True))
        run.refresh_from_db()
        result = segments.coverage(run, ingested_extent(run))
        status = Run.Status.COMPLETED if result.exact else Run.Status.FAILED
        error = "" if result.exact else f"coverage incomplete: {result.to_json()}"
        Run.objects.filter(pk=run.pk, epoch=epoch).update(
            status=status, finished_at=timezone.now(), error=error
        )
        announce(run.pk)  # whoever waits for the run's end sees it now
    summary = result.to_json()
    record_event(
        run.pk, "run_" + status, f"run {status}: coverage {summary['status']}", data=summary
    )
    record_event(run.pk, "driver_stats", stats.text(), data=stats.summary())
    run.refresh_from_db()
