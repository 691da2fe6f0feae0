"""Each node's true processing rate, measured from its batches.

A node's capacity is what it processes per second of busy time: the bytes (and the
records) of its completed batches over the seconds those batches ran (DS2's *true processing rate*:
Kalavri et al., OSDI 2018). It says what the node can do on the resources it runs on,
whatever it was offered: a node fed a trickle is idle most of the time, and its
observed rate says nothing of its capacity, but its busy seconds do.

A batch that ran several nodes' data in one job (stage siblings on one Spark worker)
counts its whole size against its whole time at each of them: they share the resource
that ran it, and it is the resource's rate that bounds each of them.

The estimate is the ratio of the totals over the most recent batches, back to
``window_busy_s`` seconds of busy time: long enough to smooth a batch's fixed cost and
the jitter of a shared machine, short enough to follow a worker slowed down or added.
``confidence`` says how much busy time the estimate rests on, from 0 (nothing
measured) to 1 (``sure_after_s`` seconds or more). A completed batch is a measure
however short it was: a fast worker's batches take a fraction of a second, and while
a slow sibling's full pool holds the source back it gets no more of them, so waiting
for a second of busy time would keep it unknown, and its data unmoved, for as long as
the slow batch runs (3.5 s of a 30 s run, measured). Running batches alone need
``MIN_CONFIDENCE``; until then a decision treats the node's capacity as unknown.

A batch still running bounds the rate too: having run ``t`` seconds over ``b`` bytes,
it cannot go faster than ``b / t``. Where that is below what the completed batches show
(a worker slowed down), the running batches count as if they ended now: the estimate
rests on what the node is doing, not only on what it did, and stays an upper bound of
its true rate. A node that has completed nothing yet has only that bound, which every
node has while its first batch starts its worker's job: two such bounds compared say
nothing. :func:`stage_bps` lets a bound alone count where it proves something: a
member running below what a peer of its stage was measured doing is slower than that
peer. A worker capped to a fraction of a core is then seen slow while its first batch
runs, once a peer has shown its pace, not only once that batch ends, which may be
after the stage's input has all been routed to it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

WINDOW_BUSY_S = 60.0
SURE_AFTER_S = 5.0
MIN_CONFIDENCE = 0.2  # one second of running batches at the defaults
BUSY_OVER_S = 30.0


@dataclass(frozen=True, slots=True)
class BatchSample:
    """One completed batch: the nodes whose data it ran, its bytes taken in, how long it
    ran (from its claim to its completion), when it ended (seconds on the clock the
    busy share is asked on) and the records it took in (0 where not counted)."""

    nodes: tuple[str, ...]
    bytes: float
    busy_s: float
    ended_s: float = 0.0
    records: float = 0.0  # records its operator counted in what it took in


@dataclass(frozen=True, slots=True)
class Capacity:
    """A node's measured capacity: bytes per second of busy time (``math.inf`` when
    nothing was measured), and how sure the estimate is, in [0, 1]; records per second
    of busy time over the same batches (0 where its batches counted none);
    ``done_s``: the busy seconds of completed batches it rests on (0: it is only the
    bound of batches still running)."""

    bytes_per_s: float
    confidence: float
    busy_s: float
    records_per_s: float = 0.0
    done_s: float = 0.0

    @property
    def known(self) -> bool:
        return math.isfinite(self.bytes_per_s) and (
            self.done_s > 0 or self.confidence >= MIN_CONFIDENCE
        )


UNKNOWN = Capacity(math.inf, 0.0, 0.0)


@dataclass
class CapacityMeter:
    """The recent batches of every node, and the capacity they show."""

    window_busy_s: float = WINDOW_BUSY_S
    sure_after_s: float = SURE_AFTER_S
    busy_over_s: float = BUSY_OVER_S
    # Per node, the (bytes, records, busy seconds) of its recent batches.
    _samples: dict[str, deque[tuple[float, float, float]]] = field(default_factory=dict)
    # Per node, the (start, end) of its batches that ended within ``busy_over_s``.
    _spans: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    # Per node, the (bytes, seconds run so far) of its batches running now.
    _running: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, batches: Iterable[BatchSample]) -> None:
        """Add completed batches; a batch without time or bytes says nothing."""
        for batch in batches:
            if batch.busy_s <= 0 or batch.bytes <= 0:
                continue
            for node in batch.nodes:
                spans = self._spans.setdefault(node, deque())
                spans.append((batch.ended_s - batch.busy_s, batch.ended_s))
                samples = self._samples.setdefault(node, deque())
                samples.append((batch.bytes, batch.records, batch.busy_s))
                busy = sum(s for _, _, s in samples)
                # The oldest go while the rest still cover the window.
                while len(samples) > 1 and busy - samples[0][2] >= self.window_busy_s:
                    busy -= samples.popleft()[2]

    def running(self, batches: Iterable[BatchSample]) -> None:
        """The batches running now, each with ``busy_s`` the seconds it has run so far;
        replaces those given before."""
        self._running = {}
        for batch in batches:
            if batch.busy_s <= 0 or batch.bytes <= 0:
                continue
            for node in batch.nodes:
                self._running.setdefault(node, []).append((batch.bytes, batch.busy_s))

    def forget(self, node: str) -> None:
        """A node whose resources changed (placed elsewhere, retired): its old batches
        say nothing of it any more."""
        self._samples.pop(node, None)
        self._spans.pop(node, None)
        self._running.pop(node, None)

    def busy_share(self, node: str, now_s: float) -> float | None:
        """The share of the last ``busy_over_s`` seconds the node's batches ran, in
        [0, 1] (its resource's, for batches it shared); None before any batch. A batch
        still running counts once it ends."""
        spans = self._spans.get(node)
        if spans is None:
            return None
        start = now_s - self.busy_over_s
        while spans and spans[0][1] <= start:
            spans.popleft()
        busy = sum(max(0.0, min(end, now_s) - max(begin, start)) for begin, end in spans)
        return min(1.0, busy / self.busy_over_s)

    def capacity(self, node: str) -> Capacity:
        samples = self._samples.get(node) or ()
        size = sum(b for b, _, _ in samples)
        records = sum(r for _, r, _ in samples)
        done_s = busy = sum(s for _, _, s in samples)
        running = self._running.get(node, ())
        running_bytes = sum(b for b, _ in running)
        running_s = sum(s for _, s in running)
        if running_s > 0 and (busy <= 0 or running_bytes * busy < size * running_s):
            size += running_bytes
            busy += running_s
        if busy <= 0:
            return UNKNOWN
        per_record = records / done_s if done_s > 0 else 0.0
        return Capacity(size / busy, min(1.0, busy / self.sure_after_s), busy, per_record, done_s)

    def capacities(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        return {node: self.capacity(node) for node in nodes}


def overall(batches: Iterable[BatchSample]) -> dict[str, float]:
    """Each node's capacity over all of ``batches`` (a whole run's): the bytes of its
    batches over their busy seconds."""
    size: dict[str, float] = {}
    busy: dict[str, float] = {}
    for batch in batches:
        if batch.busy_s <= 0:
            continue
        for node in batch.nodes:
            size[node] = size.get(node, 0.0) + batch.bytes
            busy[node] = busy.get(node, 0.0) + batch.busy_s
    return {node: size[node] / busy[node] for node in size if busy[node] > 0}


def stage_bps(capacities: Mapping[str, Capacity], node: str, peers: Iterable[str]) -> float:
    """``node``'s capacity for decisions among its stage's members (``peers``, itself
    among them): its estimate where known and resting on completed batches; a running
    batch's bound alone where some peer's completed batches show a higher rate (it is
    then slower than that peer whatever its true rate); else ``math.inf``."""
    found = capacities.get(node, UNKNOWN)
    if not found.known:
        return math.inf
    if found.done_s > 0:
        return found.bytes_per_s
    for peer in peers:
        seen = capacities.get(peer, UNKNOWN)
        if peer != node and seen.known and seen.done_s > 0 and seen.bytes_per_s > found.bytes_per_s:
            return found.bytes_per_s
    return math.inf
