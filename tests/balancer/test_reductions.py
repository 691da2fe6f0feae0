"""The driver's estimate of what each operator sends on per byte it takes in."""

from __future__ import annotations

import pytest

from balancer.reductions import ENOUGH_BYTES, Reductions
from balancer.units import MB


def test_nothing_is_given_before_a_node_has_taken_in_enough() -> None:
    reductions = Reductions.of(["agg"])

    assert not reductions.add({"agg": ENOUGH_BYTES / 2}, {"agg": ENOUGH_BYTES / 40})
    assert reductions.give() == {}


def test_the_ratio_is_of_the_totals_over_every_interval() -> None:
    reductions = Reductions.of(["agg"])
    reductions.add({"agg": 1 * MB}, {"agg": 0.10 * MB})

    assert reductions.add({"agg": 3 * MB}, {"agg": 0.02 * MB})
    assert reductions.give() == {"agg": pytest.approx(0.12 / 4)}


def test_a_ratio_that_hardly_moved_is_not_given_again() -> None:
    reductions = Reductions.of(["agg"])
    reductions.add({"agg": 10 * MB}, {"agg": 0.5 * MB})
    reductions.give()

    assert not reductions.add({"agg": 1 * MB}, {"agg": 0.052 * MB})  # 5.02%: within 5%
    assert reductions.add({"agg": 10 * MB}, {"agg": 2 * MB})  # 12.5%: moved


def test_only_operators_are_measured() -> None:
    reductions = Reductions.of(["agg"])
    reductions.add({"agg": 2 * MB, "output": 2 * MB}, {"agg": 1 * MB})

    assert reductions.give() == {"agg": 0.5}


def test_negative_bytes_count_as_none() -> None:
    reductions = Reductions.of(["agg"])
    reductions.add({"agg": 2 * MB}, {"agg": -1 * MB})

    assert reductions.give() == {"agg": 0.0}


def test_a_hot_rescale_forgets_retired_instances_and_starts_new_ones_empty() -> None:
    reductions = Reductions.of(["a", "b"])
    reductions.add({"a": 2 * MB, "b": 2 * MB}, {"a": 1 * MB, "b": 1 * MB})
    reductions.give()

    reductions.keep_only(["a", "c"])

    assert reductions.give() == {"a": 0.5}
    assert not reductions.add({"c": 0.5 * MB}, {"c": 0.1 * MB})
