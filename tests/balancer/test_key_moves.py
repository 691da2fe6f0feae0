"""Key-group moves (balancer/key_moves.py): a keyed stage whose backpressured instance
holds a hot key group gets its key space cut again, so that no instance takes more of
the records than it must, and only where its instances run on resources of their own."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from balancer.key_moves import MIN_RECORDS, balanced_cut, key_move_step
from balancer.loop import BalancerState, step
from balancer.model import KeyLoad, MoveKeyGroups, Observation
from balancer.policy import Policy
from tests.balancer.builders import layered, observe

SLOTS = 128
TOPOLOGY = layered(("src", 1), ("totals", 3), ("sink", 1))
MEMBERS = ("totals1", "totals2", "totals3")
EVEN = {"totals1": (0, 43), "totals2": (43, 86), "totals3": (86, 128)}


def hot_slot_records(hot: int = 10, weight: float = 35_000.0) -> tuple[float, ...]:
    """One key slot holding 35% of 100,000 records, the rest spread evenly."""
    rest = (100_000.0 - weight) / (SLOTS - 1)
    return tuple(weight if s == hot else rest for s in range(SLOTS))


def observed(
    groups: dict[str, tuple[int, int]] | None = None,
    records: tuple[float, ...] | None = None,
    *,
    flagged: frozenset[str] = frozenset({"totals1"}),
    resources: dict[str, str] | None = None,
) -> Observation:
    base = observe(TOPOLOGY, levels={m: 0.9 if m in flagged else 0.3 for m in MEMBERS})
    where = resources or {m: f"spark-{m}" for m in MEMBERS}
    nodes = {
        n: replace(o, flagged=n in flagged, resource=where.get(n, o.resource))
        for n, o in base.nodes.items()
    }
    load = KeyLoad(groups or EVEN, records if records is not None else hot_slot_records())
    return replace(base, nodes=nodes, key_loads={"totals": load})


def largest(records: tuple[float, ...], cut: list[tuple[int, int]]) -> float:
    return max(sum(records[low:high]) for low, high in cut)


def test_a_backpressured_instance_holding_the_hot_key_group_gives_keys_to_its_peers() -> None:
    # Given totals1 backpressured with the hot slot and a third of the rest: 56% of all
    (move,) = key_move_step(observed(), Policy())
    # Then the key space is cut again: totals1 keeps the hot slot and the ten before it
    # (ranges are contiguous), its peers split the rest
    assert isinstance(move, MoveKeyGroups) and move.stage == "totals"
    assert move.backpressure_node == "totals1"
    assert move.shares_before["totals1"] > 0.56
    assert move.groups["totals1"] == (0, 11)
    assert max(move.shares_after.values()) < 0.41
    assert list(move.groups) == list(MEMBERS)
    assert move.groups["totals1"][0] == 0 and move.groups["totals3"][1] == SLOTS
    assert "totals1 is backpressured holding 56%" in move.reason


def test_a_cut_the_loop_made_is_not_cut_again() -> None:
    (move,) = key_move_step(observed(), Policy())
    assert key_move_step(observed(dict(move.groups)), Policy()) == []


def test_instances_sharing_a_resource_keep_their_key_groups() -> None:
    shared = {m: "spark pool" for m in MEMBERS}
    assert key_move_step(observed(resources=shared), Policy()) == []


def test_no_move_while_the_heaviest_instance_is_not_backpressured() -> None:
    assert key_move_step(observed(flagged=frozenset({"totals2"})), Policy()) == []
    assert key_move_step(observed(flagged=frozenset()), Policy()) == []


def test_a_pool_past_the_threshold_counts_as_backpressure_without_a_flag() -> None:
    obs = observed(flagged=frozenset())
    hot = replace(obs.nodes["totals1"], level=0.95)
    obs = replace(obs, nodes={**obs.nodes, "totals1": hot})
    assert len(key_move_step(obs, Policy(bp_threshold=0.8))) == 1


def test_too_few_records_or_too_small_a_gain_moves_nothing() -> None:
    few = tuple(r * (MIN_RECORDS / 2) / 100_000 for r in hot_slot_records())
    assert key_move_step(observed(records=few), Policy()) == []
    nearly_even = tuple(800.0 + (30.0 if s < 43 else 0.0) for s in range(SLOTS))
    assert key_move_step(observed(records=nearly_even), Policy()) == []


def test_the_loop_moves_key_groups_only_when_the_policy_says_auto() -> None:
    obs = observed()
    kinds = [a.kind for a in step(obs, BalancerState(), Policy(throttling="none")).actions]
    assert kinds.count("move_key_groups") == 1
    off = step(obs, BalancerState(), Policy(throttling="none", key_moves="off")).actions
    assert "move_key_groups" not in [a.kind for a in off]


def test_a_key_load_knows_each_members_share_of_the_records() -> None:
    load = KeyLoad({"a": (0, 2), "b": (2, 4)}, (1.0, 1.0, 2.0, 0.0))
    assert load.shares() == {"a": 0.5, "b": 0.5}
    assert KeyLoad({"a": (0, 2), "b": (2, 4)}, (0.0,) * 4).shares() == {"a": 0.5, "b": 0.5}


def _best_by_brute_force(weights: tuple[float, ...], parts: int) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(weights)), parts - 1):
        bounds = (0, *cuts, len(weights))
        best = min(best, max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@given(
    weights=st.lists(st.integers(0, 1000), min_size=1, max_size=12).map(
        lambda ws: tuple(float(w) for w in ws)
    ),
    parts=st.integers(1, 5),
)
def test_the_cut_is_contiguous_non_empty_and_as_balanced_as_any(
    weights: tuple[float, ...], parts: int
) -> None:
    parts = min(parts, len(weights))
    cut = balanced_cut(weights, parts)
    assert len(cut) == parts
    assert cut[0][0] == 0 and cut[-1][1] == len(weights)
    assert all(low < high for low, high in cut)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    assert largest(weights, cut) <= _best_by_brute_force(weights, parts) + 1e-6


def test_a_slot_cannot_be_split_so_a_hot_one_in_the_middle_ends_alone() -> None:
    records = hot_slot_records(hot=64)
    cut = balanced_cut(records, 3)
    assert cut[1] == (64, 65)
    assert largest(records, cut) == 35_000.0
