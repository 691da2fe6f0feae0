"""Credit-based flow control and the stop/resume rule (docs/spec/pressure-migration.md)."""

from __future__ import annotations

import pytest

from balancer.credit import (
    CreditState,
    StopResumeState,
    credit_grants,
    credit_step,
    stop_resume_step,
)
from balancer.model import SetCredits, SetRate
from balancer.policy import MB, Policy
from tests.balancer.builders import CAPACITY, layered, observe

POLICY = Policy()  # credit interval 100 ms


def test_an_upstreams_credit_is_its_downstreams_free_queue_space() -> None:
    # Given s1 -> b1, b2 with b1 holding 60 MB of 64 and b2 empty
    topology = layered(("s", 1), ("b", 2))

    actions, state = credit_step(
        observe(topology, 1.0, buffered={"b1": 60 * MB}), CreditState(), POLICY
    )

    assert actions == [
        SetCredits(
            reason=(
                "free queue space of 2 downstream(s), shared with their other upstreams: "
                "68.00 MB in all, least 4.00 MB to b1"
            ),
            upstream="s1",
            credits={"b1": 4 * MB, "b2": CAPACITY},
        )
    ]
    assert state == CreditState(1.0)


def test_upstreams_sharing_a_queue_split_its_free_space_so_it_cannot_overfill() -> None:
    topology = layered(("a", 2), ("b", 1))

    actions, _ = credit_step(
        observe(topology, 0.0, buffered={"b1": 32 * MB}), CreditState(), POLICY
    )

    credits = {a.upstream: a.credits["b1"] for a in actions}
    assert credits == {"a1": 16 * MB, "a2": 16 * MB}
    assert sum(credits.values()) == CAPACITY - 32 * MB


def test_a_full_or_unobserved_downstream_grants_no_credit() -> None:
    topology = layered(("s", 1), ("b", 2))
    observation = observe(topology, 0.0, buffered={"b1": 70 * MB}, omit=frozenset({"b2"}))

    actions, _ = credit_step(observation, CreditState(), POLICY)

    assert actions[0].credits == {"b1": 0.0, "b2": 0.0}


def test_a_grant_between_ticks_is_the_free_space_of_the_queues_as_they_are_now() -> None:
    # A runtime reads its queues more often than the balancer ticks: what a batch just
    # emptied is credit at once, the same grant a tick would make.
    topology = layered(("s", 1), ("b", 2))

    grants = credit_grants(topology, {"b1": 0.0, "b2": 60 * MB})

    assert [(g.upstream, dict(g.credits)) for g in grants] == [
        ("s1", {"b1": CAPACITY, "b2": 4 * MB})
    ]
    assert (
        grants
        == credit_step(observe(topology, 1.0, buffered={"b2": 60 * MB}), CreditState(), POLICY)[0]
    )


def test_credit_is_granted_once_per_credit_interval() -> None:
    topology = layered(("s", 1), ("b", 1))
    _, state = credit_step(observe(topology, 1.0), CreditState(), POLICY)

    early, same = credit_step(observe(topology, 1.05), state, POLICY)
    due, later = credit_step(observe(topology, 1.1), state, POLICY)

    assert (early, same) == ([], state)
    assert len(due) == 1
    assert later == CreditState(1.1)


def test_a_full_queue_stops_its_upstreams_until_it_drains_to_half() -> None:
    # Given a1, a2 -> b1
    topology = layered(("a", 2), ("b", 1))
    state = StopResumeState()

    stop, state = stop_resume_step(observe(topology, 0.0, {"b1": 1.0}), state)
    assert stop == [
        SetRate(reason="queue full (b1 1.00): upstream a1 stopped", node="a1", coefficient=0.0),
        SetRate(reason="queue full (b1 1.00): upstream a2 stopped", node="a2", coefficient=0.0),
    ]

    # draining but above half: they stay stopped, nothing new is said
    still, state = stop_resume_step(observe(topology, 1.0, {"b1": 0.6}), state)
    assert still == []
    assert state.holding == {"b1"}

    resume, state = stop_resume_step(observe(topology, 2.0, {"b1": 0.5}), state)
    assert [(a.node, a.coefficient) for a in resume] == [("a1", 1.0), ("a2", 1.0)]
    assert resume[0].reason == "b1 drained to 50% or less: upstream a1 resumed"
    assert state.holding == frozenset()


def test_an_upstream_stays_stopped_while_any_downstream_is_still_holding() -> None:
    topology = layered(("a", 1), ("b", 2))
    _, state = stop_resume_step(observe(topology, 0.0, {"b1": 1.0}), StopResumeState())

    # b2 fills while b1 drains: still stopped, no flapping
    actions, state = stop_resume_step(observe(topology, 1.0, {"b1": 0.4, "b2": 1.0}), state)
    assert actions == []
    assert state.holding == {"b2"}

    actions, _ = stop_resume_step(observe(topology, 2.0, {"b1": 0.4, "b2": 0.3}), state)
    assert [(a.node, a.coefficient) for a in actions] == [("a1", 1.0)]


@pytest.mark.parametrize("level", [0.0, 0.5, 0.99])
def test_a_queue_that_is_not_full_stops_nothing(level: float) -> None:
    topology = layered(("a", 1), ("b", 1))

    actions, state = stop_resume_step(observe(topology, 0.0, {"b1": level}), StopResumeState())

    assert actions == []
    assert state.holding == frozenset()
