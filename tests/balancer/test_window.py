"""Adaptive send windows and cumulative-ack checkpoint (docs/spec/adaptive-window.md)."""

from __future__ import annotations

import heapq

import pytest

from balancer.policy import Policy
from balancer.window import (
    Send,
    SequenceSet,
    WindowState,
    deliver,
    dispatch,
    expire,
    on_ack,
    on_failure,
)

POLICY = Policy()  # window 4 in [1, 64], rt threshold 2 s, timeout 30 s


def start(*consumers: str, policy: Policy = POLICY, checkpoint: int = 0) -> WindowState:
    return WindowState.start(consumers, policy, checkpoint)


def test_window_grows_by_one_per_normal_ack_and_shrinks_by_one_per_slow_ack() -> None:
    sends, state = dispatch(start("c"), 3, time_s=0.0)
    assert [s.seq for s in sends] == [1, 2, 3]

    state = on_ack(state, 1, "c", 2.0, POLICY)  # rt 2 s <= 2 s: normal
    assert state.windows["c"] == 5
    state = on_ack(state, 2, "c", 2.5, POLICY)  # rt 2.5 s: slow
    assert state.windows["c"] == 4


def test_windows_clamp_to_their_bounds() -> None:
    policy = Policy.from_mapping({"window_min": 2, "window_initial": 2, "window_max": 3})
    _, state = dispatch(start("c", policy=policy), 2, time_s=0.0)

    state = on_ack(state, 1, "c", 0.1, policy)
    _, state = dispatch(state, 2, time_s=0.2)
    state = on_ack(state, 2, "c", 0.3, policy)
    assert state.windows["c"] == 3  # not 4

    for seq in (3, 4):
        state = on_ack(state, seq, "c", 10.0, policy)
    assert state.windows["c"] == 2  # not 1


def test_acks_out_of_order_free_their_slot_at_once() -> None:
    policy = Policy.from_mapping({"window_initial": 2})
    _, state = dispatch(start("c", policy=policy), 5, time_s=0.0)
    assert set(state.in_flight) == {1, 2}

    state = on_ack(state, 2, "c", 10.0, policy)  # slow: the window shrinks to 1
    sends, state = dispatch(state, 3, time_s=10.0)

    # batch 1 is still out, so the single slot is taken: nothing to send
    assert sends == []
    state = on_ack(state, 1, "c", 10.5, policy)
    sends, _ = dispatch(state, 3, time_s=10.5)
    assert sends == [Send(3, "c")]


def test_dispatch_goes_to_the_most_idle_consumer_and_ties_round_robin() -> None:
    # Given three idle consumers with windows 4, 4 and 2
    state = WindowState(consumers=("c1", "c2", "c3"), windows={"c1": 4, "c2": 4, "c3": 2})

    sends, state = dispatch(state, 6, time_s=0.0)

    # free shares 4/4, 4/4, 2/2 tie: round robin; then 3/4 and 3/4 beat 1/2; then
    # 2/4, 2/4 and 1/2 tie again and the turn is c3's
    assert [s.consumer for s in sends] == ["c1", "c2", "c3", "c1", "c2", "c3"]
    assert state.round_robin == 0

    sends, _ = dispatch(on_ack(state, 1, "c1", 0.5, POLICY), 1, time_s=0.5)
    # c1's window grew to 5 with 1 in flight (4/5): more idle than c2 (2/4)
    assert sends == [Send(7, "c1")]


def test_a_timed_out_batch_is_resent_to_another_consumer_and_delivered_once() -> None:
    # Given batch 1 at c1 and batch 2 at c2
    sends, state = dispatch(start("c1", "c2"), 2, time_s=0.0)
    assert sends == [Send(1, "c1"), Send(2, "c2")]
    state = on_ack(state, 2, "c2", 1.0, POLICY)

    # When c1 has not answered for 30 s
    late, state = expire(state, 30.0, POLICY)

    # Then c1's window shrinks and batch 1 goes to c2, although c1 is as idle
    assert late == [1]
    assert state.windows == {"c1": 3, "c2": 5}
    sends, state = dispatch(state, 0, time_s=30.0)
    assert sends == [Send(1, "c2", resend=True)]

    # When both copies finish, the output goes downstream once
    delivered = SequenceSet()
    first, delivered = deliver(delivered, 1)  # c2's copy
    state = on_ack(state, 1, "c2", 31.0, POLICY)
    second, delivered = deliver(delivered, 1)  # c1's late copy
    later = on_ack(state, 1, "c1", 32.0, POLICY)

    assert (first, second) == (True, False)
    assert later == state
    assert state.checkpoint == 2
    assert state.in_flight == {}


def test_a_late_ack_from_the_first_consumer_completes_the_batch() -> None:
    _, state = dispatch(start("c1", "c2"), 1, time_s=0.0)
    state = on_failure(state, 1, POLICY)
    sends, state = dispatch(state, 0, time_s=1.0)
    assert sends == [Send(1, "c2", resend=True)]

    # c1 finished after all: the batch is done, c2's copy stays in flight
    state = on_ack(state, 1, "c1", 2.0, POLICY)
    assert state.checkpoint == 1
    assert set(state.in_flight) == {1}
    assert state.windows == {"c1": 3, "c2": 4}

    # c2's copy then fails: it is not re-sent, since batch 1 is acked
    state = on_failure(state, 1, POLICY)
    assert state.resend == ()
    assert state.in_flight == {}
    assert state.windows == {"c1": 3, "c2": 3}


def test_a_waiting_resend_acked_meanwhile_is_not_sent() -> None:
    _, state = dispatch(start("c1", "c2"), 1, time_s=0.0)
    state = on_failure(state, 1, POLICY)
    assert state.resend == (1,)

    state = on_ack(state, 1, "c1", 1.0, POLICY)
    sends, state = dispatch(state, 0, time_s=1.0)

    assert sends == []
    assert (state.resend, state.failed_on) == ((), {})


def test_a_resend_waits_while_only_the_failing_consumer_has_room() -> None:
    policy = Policy.from_mapping({"window_initial": 1})
    _, state = dispatch(start("c1", "c2", policy=policy), 2, time_s=0.0)
    state = on_failure(state, 1, policy)  # c1 still has its one slot (window min 1)

    sends, state = dispatch(state, 1, time_s=1.0)

    # c2 is full: batch 1 waits rather than going back to c1; a new batch takes c1
    assert sends == [Send(3, "c1")]
    assert state.resend == (1,)


def test_with_a_single_consumer_a_failed_batch_goes_back_to_it() -> None:
    _, state = dispatch(start("c"), 1, time_s=0.0)
    state = on_failure(state, 1, POLICY)

    sends, _ = dispatch(state, 0, time_s=1.0)

    assert sends == [Send(1, "c", resend=True)]


def test_failure_of_a_batch_not_in_flight_changes_nothing() -> None:
    state = start("c")
    assert on_failure(state, 7, POLICY) == state


def test_checkpoint_acks_1_3_4_then_2() -> None:
    _, state = dispatch(start("c1", "c2"), 4, time_s=0.0)

    for seq, consumer in ((1, "c1"), (3, "c1"), (4, "c2")):
        state = on_ack(state, seq, consumer, 1.0, POLICY)
    assert state.checkpoint == 1

    state = on_ack(state, 2, "c2", 1.0, POLICY)
    assert state.checkpoint == 4
    assert state.acked == SequenceSet(4)


def test_after_a_crash_the_producer_resumes_after_its_checkpoint_without_double_delivery() -> None:
    # Given batches 1-4 and 6 delivered downstream, the producer's checkpoint 4 persisted
    delivered = SequenceSet()
    for seq in (1, 2, 3, 4, 6):
        _, delivered = deliver(delivered, seq)

    # When the producer restarts from its checkpoint
    sends, _ = dispatch(start("c", checkpoint=4), 3, time_s=100.0)
    assert [s.seq for s in sends] == [5, 6, 7]

    # Then batch 6 is recognised and not delivered again
    outcomes = []
    for send in sends:
        fresh, delivered = deliver(delivered, send.seq)
        outcomes.append(fresh)
    assert outcomes == [True, False, True]
    assert delivered == SequenceSet(7)


def test_a_producer_needs_a_consumer() -> None:
    with pytest.raises(ValueError, match="at least one consumer"):
        start()


def test_sequence_set_membership() -> None:
    seqs = SequenceSet().add(1).add(3)

    assert 1 in seqs
    assert 3 in seqs
    assert 2 not in seqs
    assert "1" not in seqs
    assert seqs.add(3) is seqs


def test_fast_consumer_receives_at_least_60_percent_of_1000_batches() -> None:
    # Given one consumer that takes 0.5 s per batch and one that takes 1 s, each
    # working through what it receives in order, and 1,000 batches ready to send
    service = {"fast": 0.5, "slow": 1.0}
    total = 1000
    state = start("fast", "slow")
    busy_until = dict.fromkeys(service, 0.0)
    acks: list[tuple[float, int, str]] = []
    received = dict.fromkeys(service, 0)

    def send_more(now: float) -> None:
        nonlocal state
        sends, state = dispatch(state, total - (state.next_seq - 1), now)
        for send in sends:
            finish = max(now, busy_until[send.consumer]) + service[send.consumer]
            busy_until[send.consumer] = finish
            heapq.heappush(acks, (finish, send.seq, send.consumer))
            received[send.consumer] += 1

    # When the producer sends whenever an ack frees a slot
    send_more(0.0)
    while acks:
        now, seq, consumer = heapq.heappop(acks)
        state = on_ack(state, seq, consumer, now, POLICY)
        send_more(now)

    # Then every batch is acked and the fast consumer got clearly more of them
    assert state.checkpoint == total
    assert received["fast"] + received["slow"] == total
    assert received["fast"] / total >= 0.6
