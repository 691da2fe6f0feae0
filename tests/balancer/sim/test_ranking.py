"""A simulator has the live ranking when it orders every pair the live rounds set apart."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancer.sim.ranking import check_ranking

# The policies bench of 2026-11-29 (docs/benchmarks.md): rounds in seconds.
LIVE = {
    "ours": [22.0, 20.6, 21.6],
    "credit": [31.5, 31.3, 31.4],
    "pressure": [21.6, 21.4, 22.1],
    "watermark": [22.3, 23.9, 26.1],
}


def test_pairs_whose_rounds_overlap_are_not_ranked_live() -> None:
    check = check_ranking(LIVE, {"ours": 20.4, "credit": 31.0, "pressure": 22.6, "watermark": 24})

    assert ("ours", "pressure") in check.overlapping
    assert ("pressure", "watermark") in check.separated
    assert ("ours", "credit") in check.separated
    assert check.same_ranking


def test_a_separated_pair_predicted_the_other_way_is_a_different_ranking() -> None:
    # That run's simulator put watermark (21.6 s) before published migration (22.6 s).
    check = check_ranking(LIVE, {"ours": 20.4, "credit": 31.0, "pressure": 22.6, "watermark": 21.6})

    assert check.misordered == (("pressure", "watermark"),)
    assert not check.same_ranking
    assert not check.medians_in_order


def test_a_tie_in_the_prediction_does_not_rank_a_separated_pair() -> None:
    check = check_ranking({"a": [1.0], "b": [2.0]}, {"a": 5.0, "b": 5.0})

    assert check.misordered == (("a", "b"),)


def test_the_order_of_the_medians_is_reported_beside_the_ranking() -> None:
    check = check_ranking({"a": [1.0, 3.0], "b": [2.0, 2.5]}, {"a": 2.0, "b": 1.0})

    assert check.overlapping == (("a", "b"),)
    assert check.same_ranking  # nothing separated, nothing misordered
    assert not check.medians_in_order  # medians 2.0 and 2.25, predicted the other way


@pytest.mark.parametrize(
    ("rounds", "predicted"),
    [
        ({"a": [], "b": [1.0]}, {"a": 1.0, "b": 1.0}),
        ({"a": [1.0], "b": [1.0]}, {"a": 1.0}),
        ({"a": [1.0]}, {"a": 1.0, "z": 2.0}),
    ],
)
def test_a_policy_without_rounds_or_prediction_is_refused(
    rounds: dict[str, list[float]], predicted: dict[str, float]
) -> None:
    with pytest.raises(ValueError, match="every policy"):
        check_ranking(rounds, predicted)


times = st.lists(st.floats(1.0, 100.0), min_size=1, max_size=5)


@given(st.dictionaries(st.sampled_from("abcde"), times, min_size=2))
def test_predicting_the_live_medians_always_has_the_live_ranking(
    rounds: dict[str, list[float]],
) -> None:
    medians = {n: statistics.median(r) for n, r in rounds.items()}
    # Distinct predictions in the medians' order (a tie in medians broken by name).
    order = sorted(rounds, key=lambda n: (medians[n], n))
    check = check_ranking(rounds, {n: float(i) for i, n in enumerate(order)})

    assert check.same_ranking
    pairs = len(rounds) * (len(rounds) - 1) // 2
    assert len(check.separated) + len(check.overlapping) == pairs
