"""Waiting data moves between a stage's members (balancer/queued.py): a member that would
finish well after its stage's pools could empty together gives what waits in its pool
to the members that would finish early, never more than waits, never past a receiver's
high water, never between members of one resource or of a stage that cannot merge. And
its batches are bounded so that what it could give stays waiting: a member not measured
yet takes a first batch of at most FIRST_BATCH_BYTES, a late one its share of the
common drain time."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from balancer.loop import BalancerState, step
from balancer.model import BoundBatches, MoveQueued
from balancer.policy import MB, Policy
from balancer.queued import (
    FIRST_BATCH_BYTES,
    MIN_BATCH_S,
    MOVE_AFTER_S,
    batch_bounds,
    queued_moves,
)
from tests.balancer.builders import CAPACITY, layered, node, observe

POLICY = Policy(migration="proportional")


def stage(
    buffered: dict[str, float],
    rates: dict[str, float],
    *,
    waiting: dict[str, float] | None = None,
    resources: dict[str, str] | None = None,
    mergeable: bool = True,
):
    topology = layered(("s", 1), ("a", len(buffered)), ("k", 1), mergeable=mergeable)
    waiting = waiting or {}
    resources = resources or {}
    nodes = {
        m: node(
            m,
            buffered_bytes=buffered[m],
            level=buffered[m] / CAPACITY,
            capacity_bps=rates[m],
            waiting_bytes=waiting.get(m),
            resource=resources.get(m),
        )
        for m in buffered
    }
    return observe(topology, nodes=nodes)


def test_a_slow_member_s_waiting_data_goes_to_the_idle_fast_one() -> None:
    # a1 holds 8 MB at 0.1 MB/s (80 s); a2 is empty at 1 MB/s: together 8 MB / 1.1 MB/s.
    seen = stage({"a1": 8 * MB, "a2": 0.0}, {"a1": 0.1 * MB, "a2": 1 * MB})
    (move,) = queued_moves(seen, POLICY)
    drain_s = 8 / 1.1
    assert move.node == "a1" and move.stage == "a"
    assert math.isclose(move.moves["a2"], 1 * MB * drain_s)  # a2 then finishes at T too
    assert "a1 (8.0 MB in its pool at 0.10 MB/s) would finish" in move.reason


def test_only_what_waits_moves_and_never_past_the_receiver_s_high_water() -> None:
    seen = stage(
        {"a1": 40 * MB, "a2": 0.0},
        {"a1": 0.1 * MB, "a2": 10 * MB},
        waiting={"a1": 30 * MB},  # 10 MB are in the batch it runs
    )
    (move,) = queued_moves(seen, POLICY)
    assert math.isclose(move.moves["a2"], min(30 * MB, POLICY.high_water * CAPACITY))


def test_pools_close_to_draining_together_stay_put() -> None:
    # a1 finishes 1.5 s after the common drain time: under MOVE_AFTER_S, nothing moves.
    rates = {"a1": 1 * MB, "a2": 1 * MB}
    assert MOVE_AFTER_S > 1.5
    assert queued_moves(stage({"a1": 3 * MB, "a2": 0.0}, rates), POLICY) == []
    # and a quarter of a long drain time is noise too
    assert queued_moves(stage({"a1": 110 * MB, "a2": 90 * MB}, rates), POLICY) == []


def test_nothing_moves_while_a_member_s_capacity_is_unknown() -> None:
    seen = stage({"a1": 8 * MB, "a2": 0.0}, {"a1": 0.1 * MB, "a2": math.inf})
    assert queued_moves(seen, POLICY) == []


def test_members_of_one_resource_or_a_stage_that_cannot_merge_never_move() -> None:
    rates = {"a1": 0.1 * MB, "a2": 1 * MB}
    shared = stage({"a1": 8 * MB, "a2": 0.0}, rates, resources={"a1": "w", "a2": "w"})
    assert queued_moves(shared, POLICY) == []
    keyed = stage({"a1": 8 * MB, "a2": 0.0}, rates, mergeable=False)
    assert queued_moves(keyed, POLICY) == []


def test_a_member_being_drained_is_left_to_its_adjustment() -> None:
    seen = stage({"a1": 8 * MB, "a2": 0.0}, {"a1": 0.1 * MB, "a2": 1 * MB})
    drained = observe(seen.topology, nodes=seen.nodes, draining=frozenset({"a2"}))
    assert queued_moves(drained, POLICY) == []


def test_the_loop_moves_waiting_data_only_with_proportional_migration() -> None:
    seen = stage({"a1": 8 * MB, "a2": 0.0}, {"a1": 0.1 * MB, "a2": 1 * MB})
    moved = [a for a in step(seen, BalancerState(), POLICY).actions if isinstance(a, MoveQueued)]
    assert [a.node for a in moved] == ["a1"]
    for migration in ("off", "pressure"):
        decided = step(seen, BalancerState(), Policy(migration=migration)).actions
        assert not any(isinstance(a, MoveQueued) for a in decided), migration


@given(
    st.lists(
        st.tuples(st.floats(0, 60 * MB), st.floats(0, 1), st.floats(0.01 * MB, 100 * MB)),
        min_size=2,
        max_size=6,
    )
)
def test_moves_never_exceed_what_waits_and_never_make_the_stage_finish_later(
    members: list[tuple[float, float, float]],
) -> None:
    names = [f"a{i}" for i in range(1, len(members) + 1)]
    buffered = {n: q for n, (q, _, _) in zip(names, members, strict=True)}
    waiting = {n: q * w for n, (q, w, _) in zip(names, members, strict=True)}
    rates = {n: c for n, (_, _, c) in zip(names, members, strict=True)}
    moves = queued_moves(stage(buffered, rates, waiting=waiting), POLICY)
    after = dict(buffered)
    for move in moves:
        given_away = sum(move.moves.values())
        assert given_away <= waiting[move.node] * (1 + 1e-9) + 1e-6
        assert move.node not in move.moves and all(v > 0 for v in move.moves.values())
        after[move.node] -= given_away
        for to, size in move.moves.items():
            after[to] += size
            assert after[to] <= max(buffered[to], POLICY.high_water * CAPACITY) * (1 + 1e-9)
    finish = max(buffered[n] / rates[n] for n in names)
    assert max(after[n] / rates[n] for n in names) <= finish * (1 + 1e-9) + 1e-9


def test_a_member_not_measured_yet_takes_a_first_batch_of_at_most_first_batch_bytes() -> None:
    seen = stage({"a1": 32 * MB, "a2": 32 * MB}, {"a1": math.inf, "a2": 10 * MB})
    (bound,) = batch_bounds(seen)
    assert bound.stage == "a" and bound.members == ("a1", "a2")
    assert bound.bounds == {"a1": FIRST_BATCH_BYTES}  # a2 is measured: its whole pool
    assert "not measured yet: a1" in bound.reason


def test_a_late_member_takes_its_share_of_the_common_drain_time_and_leaves_the_rest() -> None:
    # a1 holds 14 MB at 1 MB/s (14 s); a2 and a3 hold 8 MB each at 15 MB/s: together
    # 30 MB in under a second, and a2 and a3 have room for 6.5 MB each before it.
    rates = {"a1": 1 * MB, "a2": 15 * MB, "a3": 15 * MB}
    (bound,) = batch_bounds(stage({"a1": 14 * MB, "a2": 8 * MB, "a3": 8 * MB}, rates))
    assert MIN_BATCH_S > 30 / 31  # so a1 still takes MIN_BATCH_S of its capacity
    assert bound.bounds == {"a1": 1 * MB * MIN_BATCH_S}
    # With more everywhere (80 MB, a drain time over MIN_BATCH_S) the drain time sets it
    (bound,) = batch_bounds(stage({"a1": 40 * MB, "a2": 20 * MB, "a3": 20 * MB}, rates))
    assert math.isclose(bound.bounds["a1"], 1 * MB * 80 / 31)


def test_members_on_time_are_not_bounded_and_the_bound_covers_every_member() -> None:
    rates = {"a1": 1 * MB, "a2": 10 * MB}
    (bound,) = batch_bounds(stage({"a1": 4 * MB, "a2": 40 * MB}, rates))
    # Every member is named: a bound of an earlier tick no longer holds.
    assert bound.members == ("a1", "a2") and bound.bounds == {}


def test_no_bound_between_members_of_one_resource_or_of_a_stage_that_cannot_merge() -> None:
    rates = {"a1": math.inf, "a2": 1 * MB}
    shared = stage({"a1": 8 * MB, "a2": 0.0}, rates, resources={"a1": "w", "a2": "w"})
    assert batch_bounds(shared) == []
    assert batch_bounds(stage({"a1": 8 * MB, "a2": 0.0}, rates, mergeable=False)) == []


def test_the_loop_bounds_batches_only_with_proportional_migration() -> None:
    seen = stage({"a1": 8 * MB, "a2": 0.0}, {"a1": math.inf, "a2": 1 * MB})
    bounded = [
        a for a in step(seen, BalancerState(), POLICY).actions if isinstance(a, BoundBatches)
    ]
    assert [a.bounds for a in bounded] == [{"a1": FIRST_BATCH_BYTES}]
    for migration in ("off", "pressure"):
        decided = step(seen, BalancerState(), Policy(migration=migration)).actions
        assert not any(isinstance(a, BoundBatches) for a in decided), migration


@given(
    st.lists(
        st.tuples(st.floats(0, 60 * MB), st.floats(0.01 * MB, 100 * MB)),
        min_size=2,
        max_size=6,
    )
)
def test_a_bound_leaves_waiting_what_a_move_can_take_and_never_falls_below_a_second(
    members: list[tuple[float, float]],
) -> None:
    names = [f"a{i}" for i in range(1, len(members) + 1)]
    buffered = {n: q for n, (q, _) in zip(names, members, strict=True)}
    rates = {n: c for n, (_, c) in zip(names, members, strict=True)}
    (bound,) = batch_bounds(stage(buffered, rates))
    assert bound.members == tuple(names)
    for member, size in bound.bounds.items():
        assert size < buffered[member]
        assert size >= rates[member] * MIN_BATCH_S * (1 - 1e-9)
