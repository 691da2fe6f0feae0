"""Adaptive send windows for one producer feeding parallel consumers (adaptive-window.md).

A state machine driven by batch events, not by balancer ticks: the dispatcher calls
:func:`dispatch` when it has batches ready, :func:`on_ack` and :func:`on_failure` as
consumers answer, and :func:`expire` as time passes. Time is always an argument.

    ack, rt <= rt_threshold   -> window + 1        (linear increase only, no slow start)
    ack, rt >  rt_threshold   -> window - 1
    failure or timeout        -> window - 1, batch back to the send buffer, re-sent to
                                 another consumer with a free slot
    windows clamp to [window_min, window_max]

Dispatch sends the next batch (re-sends first, oldest first) to the consumer with the
largest free share of its window; ties go round robin. The producer's checkpoint is the
highest ``s`` with every batch ``<= s`` acked; after a crash it resumes from ``s + 1``
and the consumer side recognises batches it already delivered by sequence number
(:func:`deliver`), so nothing is delivered twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from balancer.policy import Policy


@dataclass(frozen=True)
class SequenceSet:
    """A set of sequence numbers (from 1) kept as ``1..through`` plus the ones above."""

    through: int = 0
    above: frozenset[int] = frozenset()

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and (seq <= self.through or seq in self.above)

    def add(self, seq: int) -> SequenceSet:
        if seq in self:
            return self
        through, above = self.through, set(self.above)
        above.add(seq)
        while through + 1 in above:
            through += 1
            above.remove(through)
        return SequenceSet(through, frozenset(above))


@dataclass(frozen=True, slots=True)
class InFlight:
    seq: int
    consumer: str
    sent_s: float


@dataclass(frozen=True, slots=True)
class Send:
    """Send batch ``seq`` to ``consumer`` now; ``resend`` if it failed elsewhere before."""

    seq: int
    consumer: str
    resend: bool = False


@dataclass(frozen=True)
class WindowState:
    """One producer's view: a window per consumer, the batches out, the batches waiting
    to be re-sent (and where they failed), and which sequence numbers are acked."""

    consumers: tuple[str, ...]
    windows: Mapping[str, int]
    in_flight: Mapping[int, InFlight] = field(default_factory=dict)
    resend: tuple[int, ...] = ()
    failed_on: Mapping[int, str] = field(default_factory=dict)
    acked: SequenceSet = SequenceSet()
    next_seq: int = 1
    round_robin: int = 0  # index in ``consumers`` where the next tie-break starts

    @classmethod
    def start(cls, consumers: Iterable[str], policy: Policy, checkpoint: int = 0) -> WindowState:
        """A fresh producer, or one resuming after a crash from its persisted checkpoint."""
        names = tuple(consumers)
        if not names:
            raise ValueError("a producer needs at least one consumer")
        return cls(
            consumers=names,
            windows=dict.fromkeys(names, policy.window_initial),
            acked=SequenceSet(through=checkpoint),
            next_seq=checkpoint + 1,
        )

    @property
    def checkpoint(self) -> int:
        """Highest sequence number with every batch up to it acked."""
        return self.acked.through


def dispatch(state: WindowState, available: int, time_s: float) -> tuple[list[Send], WindowState]:
    """Assign batches to free window slots at ``time_s``: waiting re-sends first, then up
    to ``available`` new batches numbered from ``next_seq``, until no slot is free."""
    in_flight = dict(state.in_flight)
    busy = dict.fromkeys(state.consumers, 0)
    for batch in in_flight.values():
        busy[batch.consumer] += 1
    cursor = state.round_robin
    sends: list[Send] = []

    def place(seq: int, avoid: str | None) -> bool:
        nonlocal cursor
        chosen = _most_idle(state, busy, avoid, cursor)
        if chosen is None:
            return False
        busy[chosen] += 1
        in_flight[seq] = InFlight(seq, chosen, time_s)
        cursor = (state.consumers.index(chosen) + 1) % len(state.consumers)
        sends.append(Send(seq, chosen, resend=avoid is not None))
        return True

    waiting: list[int] = []
    for seq in state.resend:
        if not place(seq, avoid=state.failed_on[seq]):
            waiting.append(seq)
    next_seq = state.next_seq
    while next_seq < state.next_seq + available and place(next_seq, avoid=None):
        next_seq += 1
    return sends, replace(
        state,
        in_flight=in_flight,
        resend=tuple(waiting),
        failed_on={seq: c for seq, c in state.failed_on.items() if seq in waiting},
        next_seq=next_seq,
        round_robin=cursor,
    )


def on_ack(
    state: WindowState, seq: int, consumer: str, time_s: float, policy: Policy
) -> WindowState:
    """``consumer`` acked batch ``seq`` at ``time_s``; acks may come in any order.

    Only an ack for the copy in flight at that consumer moves its window. A late ack
    from a consumer the batch timed out on still completes the batch (its window already
    shrank at the timeout); the copy re-sent elsewhere stays in flight until answered.
    """
    in_flight = dict(state.in_flight)
    windows = dict(state.windows)
    batch = in_flight.get(seq)
    if batch is not None and batch.consumer == consumer:
        del in_flight[seq]
        normal = time_s - batch.sent_s <= policy.rt_threshold_s
        windows[consumer] = _clamp(windows[consumer] + (1 if normal else -1), policy)
    elif seq in state.acked:
        return state
    return replace(
        state,
        windows=windows,
        in_flight=in_flight,
        resend=tuple(s for s in state.resend if s != seq),
        failed_on={s: c for s, c in state.failed_on.items() if s != seq},
        acked=state.acked.add(seq),
    )


def on_failure(state: WindowState, seq: int, policy: Policy) -> WindowState:
    """Batch ``seq`` failed (or timed out) where it was sent: shrink that window and, unless
    another copy was acked meanwhile, put the batch back in the send buffer."""
    batch = state.in_flight.get(seq)
    if batch is None:
        return state
    in_flight = {s: b for s, b in state.in_flight.items() if s != seq}
    windows = {**state.windows, batch.consumer: _clamp(state.windows[batch.consumer] - 1, policy)}
    if seq in state.acked:
        return replace(state, windows=windows, in_flight=in_flight)
    return replace(
        state,
        windows=windows,
        in_flight=in_flight,
        resend=(*state.resend, seq),
        failed_on={**state.failed_on, seq: batch.consumer},
    )


def expire(state: WindowState, time_s: float, policy: Policy) -> tuple[list[int], WindowState]:
    """Fail every batch unacked for ``batch_timeout_s`` or longer (the consumer is busy)."""
    late = sorted(
        seq
        for seq, batch in state.in_flight.items()
        if time_s - batch.sent_s >= policy.batch_timeout_s
    )
    for seq in late:
        state = on_failure(state, seq, policy)
    return late, state


def deliver(delivered: SequenceSet, seq: int) -> tuple[bool, SequenceSet]:
    """Consumer side: should batch ``seq``'s output go downstream? False if it already did
    (a re-sent copy, or a batch re-sent after the producer resumed from its checkpoint)."""
    if seq in delivered:
        return False, delivered
    return True, delivered.add(seq)


def _most_idle(
    state: WindowState, busy: Mapping[str, int], avoid: str | None, start: int
) -> str | None:
    consumers = state.consumers
    best: str | None = None
    best_free, best_window = 0, 1
    # Scanning from the round-robin cursor and keeping the first of equals makes ties
    # rotate; free/window is compared by cross-multiplying to stay exact.
    for offset in range(len(consumers)):
        consumer = consumers[(start + offset) % len(consumers)]
        if consumer == avoid and len(consumers) > 1:
            continue
        window = state.windows[consumer]
        free = window - busy[consumer]
        if free > 0 and free * best_window > best_free * window:
            best, best_free, best_window = consumer, free, window
    return best


def _clamp(window: int, policy: Policy) -> int:
    return max(policy.window_min, min(policy.window_max, window))
