"""Hot-rescale planning: adjustment subgraph and key-group hand-off (hot-rescale.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.rescale import (
    GraphUpdate,
    Transfer,
    even_key_groups,
    plan_adjustment,
    plan_handoff,
)
from balancer.topology import LinkSpec, NodeSpec, Topology
from tests.balancer.builders import layered

# a1, a2 feed b1; b1 feeds c1, c2; c feeds d1
PIPELINE = layered(("a", 2), ("b", 1), ("c", 2), ("d", 1))


def test_worked_example_subgraph_b_scales_out_c_scales_in() -> None:
    # When stage b scales out b1 -> b1, b2 and stage c scales in c1, c2 -> c1
    plan = plan_adjustment(PIPELINE, added=[NodeSpec("b2", stage="b")], removed=["c2"])

    # Then
    assert plan.changed_stages == ("b", "c")
    assert plan.v_changed == {"b1", "b2", "c1", "c2"}
    assert plan.v_up == {"a1", "a2", "b1", "b2"}
    assert plan.v_down == {"c1", "c2", "d1"}
    assert plan.sources == {"a1", "a2"}
    assert plan.tails == {"d1"}
    assert plan.connect == {("a1", "b2"), ("a2", "b2"), ("b2", "c1")}
    assert plan.disconnect == {("b1", "c2"), ("c2", "d1")}
    assert ("b2", "c2") not in plan.connect
    assert plan.subgraph == ("a1", "a2", "b1", "b2", "c1", "c2", "d1")


def test_the_plan_tells_each_instance_whose_connections_change_what_to_do() -> None:
    plan = plan_adjustment(PIPELINE, added=[NodeSpec("b2", stage="b")], removed=["c2"])

    assert set(plan.updates) == {"a1", "a2", "b1", "b2", "c1", "c2", "d1"}
    assert plan.updates["b2"] == GraphUpdate(
        instance="b2",
        upstreams=("a1", "a2"),
        downstreams=("c1",),
        connect=(("a1", "b2"), ("a2", "b2"), ("b2", "c1")),
        disconnect=(),
    )
    assert plan.updates["c2"] == GraphUpdate(
        instance="c2",
        upstreams=(),
        downstreams=(),
        connect=(),
        disconnect=(("b1", "c2"), ("c2", "d1")),
    )
    assert plan.updates["d1"].upstreams == ("c1",)


def test_the_graph_after_the_change() -> None:
    plan = plan_adjustment(PIPELINE, added=[NodeSpec("b2", stage="b")], removed=["c2"])

    after = plan.after
    assert not after.has_node("c2")
    assert after.stage_members("b") == ("b1", "b2")
    assert {(lk.src, lk.dst) for lk in after.links} == {
        ("a1", "b1"),
        ("a2", "b1"),
        ("b1", "c1"),
        ("c1", "d1"),
        ("a1", "b2"),
        ("a2", "b2"),
        ("b2", "c1"),
    }


def test_new_links_borrow_the_settings_of_their_stages_links() -> None:
    topology = Topology.build(
        [NodeSpec("s1", kind="source", stage="s"), NodeSpec("m1", stage="m")],
        [LinkSpec("s1", "m1", bandwidth_bps=25.0, latency_s=0.02)],
    )

    plan = plan_adjustment(topology, added=[NodeSpec("m2", stage="m")], removed=[])

    assert plan.after.link("s1", "m2") == LinkSpec("s1", "m2", bandwidth_bps=25.0, latency_s=0.02)


def test_hot_migration_of_c2_to_c3_inside_the_running_pipeline() -> None:
    plan = plan_adjustment(PIPELINE, added=[NodeSpec("c3", stage="c")], removed=["c2"])

    assert plan.changed_stages == ("c",)
    assert plan.connect == {("b1", "c3"), ("c3", "d1")}
    assert plan.disconnect == {("b1", "c2"), ("c2", "d1")}
    assert plan.sources == {"b1"}
    assert plan.tails == {"d1"}


def test_two_new_instances_of_neighbouring_stages_connect_to_each_other() -> None:
    plan = plan_adjustment(
        PIPELINE, added=[NodeSpec("b2", stage="b"), NodeSpec("c3", stage="c")], removed=[]
    )

    assert ("b2", "c3") in plan.connect
    assert plan.disconnect == frozenset()


@pytest.mark.parametrize(
    ("added", "removed", "message"),
    [
        ([], ["zz"], "cannot remove unknown instance"),
        ([NodeSpec("b1", stage="b")], [], "already taken"),
        ([NodeSpec("x", stage="b"), NodeSpec("x", stage="b")], [], "already taken"),
        ([NodeSpec("q1", stage="q")], [], "no stage q"),
        ([], ["b1"], "leave stage(s) b without instances"),
    ],
)
def test_impossible_changes_are_refused(
    added: list[NodeSpec], removed: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_adjustment(PIPELINE, added=added, removed=removed)


def test_worked_example_key_groups_a1_a2_a3() -> None:
    # Given a1 owns {1,2,3} and a2 owns {4,5,6}; after the scale-out a1 {1,2}, a2 {3,4},
    # a3 {5,6} (even ranges of the key space)
    original = even_key_groups(range(1, 7), ["a1", "a2"])
    new = even_key_groups(range(1, 7), ["a1", "a2", "a3"])
    assert original == {"a1": {1, 2, 3}, "a2": {4, 5, 6}}
    assert new == {"a1": {1, 2}, "a2": {3, 4}, "a3": {5, 6}}

    plan = plan_handoff(original, new)

    # Then a1 keeps its state ({1,2} overlaps 2) and a3 takes a2's ({5,6} overlaps 2)
    assert plan.second_group == {"a1": "a1", "a2": "a3"}
    assert plan.takeovers == (Transfer("a2", "a3", frozenset({4, 5, 6})),)
    assert plan.holders == {1: "a1", 2: "a1", 3: "a1", 4: "a3", 5: "a3", 6: "a3"}
    # After completion a2 fetches 3 from a1 and 4 from a3; a1 drops 3, a3 drops 4
    assert set(plan.fetches) == {
        Transfer("a1", "a2", frozenset({3})),
        Transfer("a3", "a2", frozenset({4})),
    }
    assert plan.drops == {"a1": {3}, "a3": {4}}


def test_even_key_groups_give_the_remainder_to_the_first_instances() -> None:
    groups = even_key_groups([7, 1, 2, 3, 4, 5, 6], ["x", "y", "z"])

    assert groups == {"x": {1, 2, 3}, "y": {4, 5}, "z": {6, 7}}
    with pytest.raises(ValueError, match="at least one instance"):
        even_key_groups([1], [])


def test_a_tie_in_overlap_prefers_the_instance_keeping_its_own_state() -> None:
    plan = plan_handoff({"a1": frozenset({1, 2})}, {"a0": frozenset({1}), "a1": frozenset({2})})

    assert plan.second_group == {"a1": "a1"}
    assert plan.takeovers == ()


def test_scale_in_hands_the_removed_instances_state_over() -> None:
    plan = plan_handoff(
        {"a1": frozenset({1, 2}), "a2": frozenset({3, 4}), "a3": frozenset()},
        {"a1": frozenset({1, 2, 3, 4})},
    )

    assert plan.second_group == {"a1": "a1", "a2": "a1"}
    assert plan.takeovers == (Transfer("a2", "a1", frozenset({3, 4})),)
    assert plan.fetches == ()
    assert plan.drops == {}


@pytest.mark.parametrize(
    ("original", "new", "message"),
    [
        ({"a1": {1, 2}, "a2": {2}}, {"a1": {1, 2}}, "original key groups overlap"),
        ({"a1": {1, 2}}, {"a1": {1}, "a2": {1, 2}}, "new key groups overlap"),
        ({"a1": {1, 2}}, {"a1": {1, 2, 3}}, "cover the same keys"),
    ],
)
def test_inconsistent_key_groups_are_refused(
    original: dict[str, set[int]], new: dict[str, set[int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_handoff(
            {k: frozenset(v) for k, v in original.items()},
            {k: frozenset(v) for k, v in new.items()},
        )


@st.composite
def changes(draw: st.DrawFn) -> tuple[Topology, list[NodeSpec], list[str]]:
    widths = draw(st.lists(st.integers(1, 4), min_size=2, max_size=5))
    stages = [(chr(ord("a") + i), w) for i, w in enumerate(widths)]
    topology = layered(*stages)
    added: list[NodeSpec] = []
    removed: list[str] = []
    for stage, width in stages:
        members = [f"{stage}{i}" for i in range(1, width + 1)]
        gone = draw(st.lists(st.sampled_from(members), unique=True, max_size=width))
        extra = draw(st.integers(0, 2))
        if len(gone) == width and extra == 0:
            gone = gone[1:]
        removed.extend(gone)
        added.extend(NodeSpec(f"{stage}{width + i}", stage=stage) for i in range(1, extra + 1))
    return topology, added, removed


@settings(max_examples=200, deadline=None)
@given(change=changes())
def test_the_plan_never_connects_a_new_instance_to_a_removed_one(
    change: tuple[Topology, list[NodeSpec], list[str]],
) -> None:
    topology, added, removed = change
    plan = plan_adjustment(topology, added=added, removed=removed)
    new = {n.id for n in added}

    for src, dst in plan.connect:
        assert {src, dst} & new, "only new instances get new connections"
        assert not {src, dst} & set(removed)
    for src, dst in plan.disconnect:
        assert not {src, dst} & new
        assert {src, dst} & set(removed)
    after_links = {(lk.src, lk.dst) for lk in plan.after.links}
    before_links = {(lk.src, lk.dst) for lk in topology.links}
    assert after_links == (before_links - plan.disconnect) | plan.connect
    assert not any(plan.after.has_node(r) for r in removed)
    assert plan.sources | plan.tails <= set(plan.subgraph)


@st.composite
def key_groups(draw: st.DrawFn) -> tuple[dict[str, frozenset[int]], dict[str, frozenset[int]]]:
    keys = range(1, draw(st.integers(1, 40)) + 1)
    before = draw(st.lists(st.sampled_from("pqrstu"), min_size=1, max_size=6, unique=True))
    after = draw(st.lists(st.sampled_from("pqrstuvw"), min_size=1, max_size=8, unique=True))
    return even_key_groups(keys, before), even_key_groups(keys, after)


@settings(max_examples=200, deadline=None)
@given(groups=key_groups())
def test_the_key_group_hand_off_loses_no_key_and_duplicates_none(
    groups: tuple[dict[str, frozenset[int]], dict[str, frozenset[int]]],
) -> None:
    original, new = groups
    plan = plan_handoff(original, new)

    # Play the plan: takeovers move state on the marker ...
    held = {instance: set(keys) for instance, keys in original.items()}
    moved = {t.source for t in plan.takeovers}
    for instance in moved:
        held[instance] = set()
    for transfer in plan.takeovers:
        held.setdefault(transfer.target, set()).update(transfer.keys)
    # ... every key has exactly one holder in between ...
    holders = [k for keys in held.values() for k in keys]
    assert sorted(holders) == sorted(set(holders))
    # ... fetches copy on completion, then drops remove
    for transfer in plan.fetches:
        assert transfer.keys <= held[transfer.source]
        held.setdefault(transfer.target, set()).update(transfer.keys)
    for instance, keys in plan.drops.items():
        held[instance] -= keys

    final = {instance: frozenset(keys) for instance, keys in held.items() if keys}
    assert final == {instance: keys for instance, keys in new.items() if keys}
