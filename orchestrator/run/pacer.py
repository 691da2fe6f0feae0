"""The source of a run: read ahead, paced by what the balancer set, never into a full pool.

The source sends at most its rate coefficient times its speed times its maximum rate
(an unlimited source: the rate it was measured to reach while unthrottled), only what
its credits allow, and never into a pool that cannot take the chunk: the per-node stop
of the reference experiment. Each chunk is written once; every copy of each chunk sent
in a slice is entered in the ledger with the source's new position in one transaction.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from balancer.document import NodeDocument
from balancer.topology import Topology
from balancer.units import MB, MEGABIT
from orchestrator.ledger import segments
from orchestrator.ledger.events import record_event
from orchestrator.models import Run
from orchestrator.pipeline.event_high import segment_high
from orchestrator.pipeline.graph import (
    StoredDocument,
    bandwidth,
    downstreams_of,
    pipeline_windows,
)
from orchestrator.pipeline.inputs import Chunk, write_chunk
from orchestrator.pipeline.layout import segment_path
from orchestrator.pipeline.routes import Routes, tagged_route
from orchestrator.pipeline.watermark import Watermark
from orchestrator.rescale.plan import copy_id, targets
from orchestrator.run.controls import Controls
from orchestrator.run.route_store import RouteStore
from orchestrator.source.base import Source, SourceLag, SourceUnavailable
from orchestrator.source.opener import open_source
from sparkjobs.keygroups import KeyGroup

READ_AHEAD_CHUNKS = 32
READ_AHEAD_BYTES = 32 * MB
# How long one call may keep sending before the loop gets its turn again.
SEND_SLICE_S = 0.2


@dataclass(frozen=True)
class SourceGraph:
    """The graph the source routes with: the one its instance has aligned with."""

    doc: StoredDocument
    config: int
    downstreams: list[str]


class SourcePacer:
    def __init__(
        self,
        run: Run,
        epoch: int,
        source: NodeDocument,
        controls: Controls,
        routes: RouteStore,
    ) -> None:
        self.run_id = run.pk
        self.epoch = epoch
        self.source = source
        self.name = source["name"]
        self.controls = controls
        self.routes = routes
        self.ahead: deque[Chunk] = deque()
        self.sent_by_route: dict[str, int] = {}
        # Demand a full pool could not take this tick: still part of the node's input.
        self.blocked: dict[str, int] = {}
        self.pool: dict[str, int] = {}  # queued bytes per node, as the dispatch last read
        self.tokens = 0.0
        self.last_refill = time.monotonic()
        self.measured_rate = 0.0
        self.input: Source = open_source(run, epoch, source.get("params") or {})
        self.next_index = int((run.source_position or {}).get("chunk", 0))
        # The watermark after the chunks emitted so far: the next one's (windowed).
        self.watermark = Watermark.resumed(self.input.partitions, run.source_position or {})
        self.emitted_bytes = int(run.input_bytes)
        self.done = run.chunks_total is not None
        self.last_lag = SourceLag()
        self.unavailable = ""  # why the source cannot be read now, reported once
        self.draining = False
        # Chunks written and routed, not yet in the ledger (``_enter_sent``), and the
        # source's position after the last of them.
        self.sending: list[tuple[Chunk, list[segments.NewSegment]]] = []
        self.sending_position: dict[str, object] = {}

    def reconfigure(self, topology: Topology, graph: SourceGraph) -> None:
        self.topology = topology
        self.graph = graph

    # -- what the balancer observes of the source -------------------------------------

    def head_by_route(self) -> dict[str, float]:
        """The mix of routes among the chunks read ahead: what is about to leave."""
        routes = self.routes.get(self.name)
        head: dict[str, float] = {}
        for chunk in self.ahead:
            tagged = tagged_route(chunk.tag, self.graph.downstreams, routes)
            head[tagged] = head.get(tagged, 0.0) + chunk.size
        return head

    def take_sent_by_route(self) -> dict[str, int]:
        sent, self.sent_by_route = self.sent_by_route, {}
        return sent

    def take_blocked(self) -> dict[str, int]:
        blocked, self.blocked = self.blocked, {}
        return blocked

    # -- sending ----------------------------------------------------------------------

    def rate(self) -> float | None:
        """Bytes per second the source may send now; None means unlimited."""
        control = self.controls.of(self.name)
        factor = control.coefficient * control.speed.speed
        limit = float(self.source.get("max_rate_mbps", 0.0)) * MEGABIT
        if limit <= 0:
            if factor >= 1.0:
                return None
            # k is a fraction of the maximum rate; unlimited sources use the rate they
            # were measured to reach while unthrottled.
            limit = max(self.measured_rate, MB)
        return factor * limit

    def emit(self, now: float) -> bool:
        """Send what the source may for up to a slice; True when it could send more now.

        The slice's chunks enter the ledger together, in one transaction, once the
        slice ends: one commit (one flush of PostgreSQL's log to disk) for all of them
        instead of one each. A bounded run over 64 files had taken 0.4 to 0.6 s to
        enter them one by one on a slow machine, and the first batch, claimed after the
        first slice, took only part of them: two Spark jobs where one would do
        (docs/benchmarks.md, "the source's chunks in one transaction")."""
        if self.done:
            return False
        rate = self.rate()
        elapsed = now - self.last_refill
        self.last_refill = now
        if rate is not None:
            self.tokens = min(self.tokens + rate * elapsed, max(rate, 4 * MB))
        try:
            more = self._send_for_a_slice(now, rate)
        finally:
            # What was sent before a failure is in the ledger, as when each chunk was
            # entered alone.
            self._enter_sent()
        if not self.ahead and self.input.exhausted:  # everything was read and sent
            self._finish()
        return more

    def _send_for_a_slice(self, began: float, rate: float | None) -> bool:
        sent = 0
        while time.monotonic() - began < SEND_SLICE_S:
            self._read_ahead()
            if not self.ahead:
                self._measure_rate(rate, began, sent)
                return False
            chunk = self.ahead[0]
            if not self._send(chunk, rate):
                self._measure_rate(rate, began, sent)
                return False
            sent += chunk.size
        self._measure_rate(rate, began, sent)
        return True

    def _enter_sent(self) -> None:
        """The chunks sent since the last call, every copy of each, into the ledger with
        the source's position after the last of them, atomically; then acknowledged to
        the source (a stream's entries), which may forget them once the ledger holds
        them."""
        if not self.sending:
            return
        sending, self.sending = self.sending, []
        segments.emit_chunk(
            self.run_id,
            self.epoch,
            [copy for _, copies in sending for copy in copies],
            self.sending_position,
            self.emitted_bytes,
        )
        for chunk, _ in sending:
            self.input.committed(chunk)

    def _send(self, chunk: Chunk, rate: float | None) -> bool:
        seg_id = f"r{self.run_id}.c{chunk.index:07d}"
        routes = self.routes.get(self.name)
        graph = self.graph
        copies = targets(
            graph.doc, self.name, seg_id, tag=chunk.tag, routes=routes, slots=KeyGroup()
        )
        target = copies[0][0]
        if not self._may_send(target, chunk.size, rate):
            spilled = self._spill(copies, routes, chunk.size, rate)
            if spilled is None:
                if self._pool_full(target, chunk.size):
                    # Demand the node could not take: part of its input rate, so a full
                    # pool still reads as "input faster than output".
                    self.blocked[target] = chunk.size
                return False
            copies, target = [spilled], spilled[0]
        path = segment_path(self.run_id, seg_id, chunk.kind)
        write_chunk(path, chunk)
        windows = pipeline_windows(graph.doc)
        found = None if windows is None else segment_high(path, chunk.kind, windows.field)
        # The next chunk's watermark starts from this one's; the ledger keeps it (in the
        # position) with the slice's chunks.
        watermark = self.watermark.copy()
        high_before, high = watermark.advance(chunk.partition, found, chunk.idle)
        self.sending.append(
            (
                chunk,
                [
                    segments.NewSegment(
                        id=copy_id(seg_id, node, slots, len(copies)),
                        chunk=chunk.index,
                        origin_file=chunk.file_index,
                        origin_offset=chunk.offset,
                        origin_length=chunk.length,
                        node=node,
                        upstream=self.name,
                        tag=chunk.tag,
                        path=str(path),
                        bytes=chunk.size,
                        migrated_from=migrated_from,
                        link_mbps=bandwidth(graph.doc, self.name, node),
                        config=graph.config,
                        slots_from=slots.low,
                        slots_to=slots.high,
                        high_before_us=high_before,
                        high_us=high,
                    )
                    for node, migrated_from, slots in copies
                ],
            )
        )
        self.sending_position = {
            "chunk": chunk.index + 1,
            "file": chunk.file_index,
            "offset": chunk.offset + chunk.length,
            **chunk.stream_position(),
            **watermark.to_position(),
        }
        self.emitted_bytes += chunk.size
        for node, _, _ in copies:
            self.pool[node] = self.pool.get(node, 0) + chunk.size
        if rate is not None:
            self.tokens -= chunk.size
        credits = self.controls.of(self.name).credits
        if credits is not None:
            credits[target] = credits.get(target, 0.0) - chunk.size
        self.next_index = chunk.index + 1
        self.watermark = watermark
        self.ahead.popleft()
        tagged = tagged_route(chunk.tag, graph.downstreams, routes)
        self.sent_by_route[tagged] = self.sent_by_route.get(tagged, 0) + chunk.size
        return True

    def _spill(
        self,
        copies: list[tuple[str, str, KeyGroup]],
        routes: Routes,
        size: int,
        rate: float | None,
    ) -> tuple[str, str, KeyGroup] | None:
        """Where a chunk goes whose branch cannot take it now, when the balancer is
        migrating that branch's data: to the migration's light branch with the largest
        share that can (``None``: it waits, and the source with it).

        A migration says the branch has more coming than it can take; a chunk its full
        pool refuses is exactly such data. Waiting for it would hold every chunk behind
        it, for every branch, for as long as the branch's batch runs: seconds on a slow
        worker, while the others drain their pools and idle."""
        if len(copies) != 1:
            return None  # a keyed stage's copies go where their key groups are
        node, migrated_from, slots = copies[0]
        heavy = migrated_from or node
        moves = routes.migrations.get(heavy) or {}
        downstreams = self.graph.downstreams
        for light in sorted(moves, key=lambda n: (-moves[n], n)):
            if (
                light in downstreams
                and light not in (node, heavy)
                and self._may_send(light, size, rate)
            ):
                return light, heavy, slots
        return None

    def drain(self) -> None:
        """Read nothing new: of what was read ahead and not sent, only what the source
        still wants sent is (a landing folder finishes its file; a stream's entries stay
        pending in its group)."""
        if not self.draining:
            self.draining = True
            self.ahead = deque(self.input.stop(list(self.ahead)))

    def lag(self) -> SourceLag:
        """What waits outside the run, read at most once a tick (the last known while
        the source cannot be reached)."""
        try:
            self.last_lag = self.input.lag()
        except SourceUnavailable as exc:
            self._unavailable(str(exc))
        return self.last_lag

    def _unavailable(self, why: str) -> None:
        """Report an outage once; the source is tried again every loop meanwhile."""
        if why and not self.unavailable:
            record_event(self.run_id, "source_unavailable", why, node=self.name)
        elif not why and self.unavailable:
            record_event(
                self.run_id, "source_available", "the source answers again", node=self.name
            )
        self.unavailable = why

    def _finish(self) -> None:
        segments.finish_source(self.run_id, self.epoch, self.next_index)
        self.done = True
        what = "took in" if self.input.unbounded else "read all"
        record_event(
            self.run_id,
            "source_done",
            f"source {what} {self.next_index} chunks",
            node=self.name,
        )

    def _measure_rate(self, rate: float | None, began: float, sent: int) -> None:
        """What an unlimited source reaches: a rate coefficient below 1 is a share of it."""
        if rate is None and sent:
            spent = max(time.monotonic() - began, 1e-3)
            self.measured_rate = max(self.measured_rate * 0.8, sent / spent)

    def _read_ahead(self) -> None:
        """Keep the next chunks read: the source's queue, whose mix of routes the
        balancer sees (what is about to leave, per branch)."""
        ahead_bytes = sum(c.size for c in self.ahead)
        while len(self.ahead) < READ_AHEAD_CHUNKS and ahead_bytes < READ_AHEAD_BYTES:
            try:
                chunk = self.input.next_chunk()
            except SourceUnavailable as exc:
                self._unavailable(str(exc))
                break
            self._unavailable("")
            if chunk is None:  # nothing more now (or ever: the input says which)
                break
            self.ahead.append(chunk)
            ahead_bytes += chunk.size

    def _pool_full(self, target: str, size: int) -> bool:
        queued = self.pool.get(target, 0)
        return queued > 0 and queued + size > self.topology.node(target).capacity_bytes

    def _may_send(self, target: str, size: int, rate: float | None) -> bool:
        if rate is not None and self.tokens < min(size, max(rate, 1.0)):
            return False
        if self._pool_full(target, size):
            return False  # a full pool stops its upstream (reference experiment)
        credits = self.controls.of(self.name).credits
        return credits is None or credits.get(target, 0.0) >= size


def source_graph(doc: StoredDocument, config: int, name: str) -> SourceGraph:
    return SourceGraph(doc, config, downstreams_of(doc, name))
