"""A join's reference table read again on its period (``refresh_s``) while a run over a
landing folder or a stream goes on.

Each read is a copy in the content-addressed reference store (orchestrator/pipeline/
reference.py), taken on a thread of its own so that a slow database does not hold the
driver's loop up. A copy whose bytes differ from the run's latest becomes the run's
latest (``Run.references``, a version more), under the run's lock; the landing source
binds every file it takes in to the latest copy under that same lock
(orchestrator/source/landing.py). So which copy a record joins is a fact of the ledger,
fixed before any chunk of its file is emitted: a retry, a migrated batch and the plain
job over the run (orchestrator/source/replay.py) join the same one. A stream's entries come
from no file: a copy is recorded with the chunk it takes effect from, and each
partition's entries before it (``since``), read under the run's lock, which every chunk's
emission updates: chunks emitted before join the earlier copy, chunks after join this one,
and a replay splits each partition's entries at the same place. A read is taken only as
the run's creation would take it: not from a table another pipeline's sink has come to
write, and only if the new copy still has the columns the join names. A bounded input is
all there when the run starts: its runs join the copy taken at the start, as a run
without ``refresh_s`` does.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from balancer.document import PipelineDocument
from orchestrator.ledger.events import record_event
from orchestrator.ledger.sink_owners import reader_problem
from orchestrator.models import Run
from orchestrator.pipeline.inputs import InputError
from orchestrator.pipeline.reference import snapshot_columns, snapshot_of
from orchestrator.source.spec import StreamSpec, unbounded_spec
from orchestrator.source.stream import taken_marks
from sparkjobs.catalog import operator_name
from sparkjobs.schemas import table_problems

log = logging.getLogger(__name__)


@dataclass
class _Join:
    stage: str
    first: str  # the copy the run started with
    params: dict[str, object]
    period_s: float
    next_at: float
    reading: Future[str] | None = None
    failed: str = ""  # the last read's error, said once until it changes


class Refresher:
    """The run's refreshed joins: :meth:`poll` from the driver's loop starts a read of
    each table that is due and records each read that finished."""

    def __init__(self, run_id: int, epoch: int, graph: PipelineDocument, *, source: str):
        """``source``: the run's input kind (``folder``, ``stream``; any other is read
        as it is, and joins each table as it was when the run started)."""
        self.run_id, self.epoch, self.pipeline = run_id, epoch, graph["name"]
        now = time.monotonic()
        # One read per stage: its instances (and the ones a rescale adds) join one table.
        stages: dict[str, _Join] = {}
        for n in graph["nodes"]:
            period = (n.get("params") or {}).get("refresh_s")
            if operator_name(n) == "join" and period:
                stage = n.get("stage") or n["name"]
                first = str(n.get("reference_file", ""))
                params = dict(n.get("params") or {})
                stages.setdefault(stage, _Join(stage, first, params, float(period), now + period))
        self.joins = list(stages.values())
        self.pool: ThreadPoolExecutor | None = None
        self.stream = source == "stream"
        if self.joins and source not in ("folder", "stream"):
            names = ", ".join(j.stage for j in self.joins)
            record_event(
                run_id,
                "reference_fixed",
                f"{names}: refresh_s applies to a landing folder or a stream; this run's "
                "input is read as it is, so it joins each table as it was when the run "
                "started",
            )
            self.joins = []
        if self.joins:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"refresh-{run_id}")

    def poll(self, now: float) -> int:
        """Record the reads that finished, start those that are due (``now`` on the
        monotonic clock); returns how many reads finished."""
        finished = 0
        for join in self.joins:
            if join.reading is not None and join.reading.done():
                reading, join.reading = join.reading, None
                self._record(join, reading)
                finished += 1
            if join.reading is None and now >= join.next_at and self.pool is not None:
                join.next_at = now + join.period_s
                # As when the run was created: never a table another pipeline's sink
                # has come to write since (that is the other pipeline's data).
                owned = reader_problem(self.pipeline, join.params)
                if owned:
                    self._failed(join, owned)
                    continue
                join.reading = self.pool.submit(snapshot_of, join.params)
        return finished

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _failed(self, join: _Join, why: str) -> None:
        """Say once (until the reason changes) that the table was not taken again."""
        if why == join.failed:
            return
        join.failed = why
        record_event(
            self.run_id,
            "reference_refresh_failed",
            f"join {join.stage}: the table was not taken again ({why}); files go on "
            "joining the last copy taken",
            data={"stage": join.stage},
        )

    def _record(self, join: _Join, reading: Future[str]) -> None:
        try:
            copy = reading.result()
        except Exception as exc:  # whatever failed, the run goes on with its last copy
            if not isinstance(exc, InputError):
                log.warning("run %s: %s not read again", self.run_id, join.stage, exc_info=exc)
            self._failed(join, str(exc))
            return
        table = snapshot_columns(copy)
        unfit = [] if table is None else table_problems(join.params, table)
        if unfit:
            self._failed(join, "; ".join(p.message for p in unfit))
            return
        join.failed = ""
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=self.run_id, epoch=self.epoch).first()
            if run is None:
                return  # a newer driver refreshes now
            latest = run.references.get(join.stage) or {}
            if copy == latest.get("file", join.first):
                return
            version = int(latest.get("version", 0)) + 1
            taken = timezone.now().isoformat()
            recorded: dict[str, Any] = {"file": copy, "version": version, "taken_at": taken}
            what = "files taken in"
            if self.stream:
                recorded["since"] = [*latest.get("since", []), stream_start(run, copy)]
                what = "chunks emitted"
            run.references = {**run.references, join.stage: recorded}
            run.save(update_fields=["references"])
            record_event(
                self.run_id,
                "reference_refreshed",
                f"join {join.stage}: the table changed; {what} from now on join "
                f"its version {version}",
                data={"stage": join.stage, "version": version, "file": copy},
            )


def stream_start(run: Run, copy: str) -> dict[str, Any]:
    """Where a stream run's new copy of a table takes effect, its row locked: the next
    chunk the source emits, and each partition's entries before it."""
    position = run.source_position or {}
    spec = unbounded_spec(run.input_spec or {})
    marks = taken_marks(spec, position) if isinstance(spec, StreamSpec) else {}
    return {
        "chunk": int(position.get("chunk", 0)),
        "entries": {stream: count for stream, (_, count) in marks.items()},
        "file": copy,
    }
