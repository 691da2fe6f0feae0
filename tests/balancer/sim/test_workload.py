"""The seeded workload generator: reproducible, bursty, skewed."""

from __future__ import annotations

import numpy as np
import pytest

from balancer.policy import MB
from balancer.sim.reference import MBIT, reference_workload
from balancer.sim.workload import WorkloadSpec, generate

TAGS = ("1", "2", "3")


def test_the_same_seed_gives_the_same_packets() -> None:
    spec = reference_workload(200 * MB)

    first, second = generate(spec, TAGS, seed=7), generate(spec, TAGS, seed=7)

    assert np.array_equal(first.arrivals, second.arrivals)
    assert np.array_equal(first.tag_index, second.tag_index)


def test_another_seed_gives_other_packets() -> None:
    spec = reference_workload(200 * MB)

    first, other = generate(spec, TAGS, seed=7), generate(spec, TAGS, seed=8)

    assert not np.array_equal(first.tag_index, other.tag_index)


def test_a_smaller_volume_is_a_prefix_of_a_larger_one() -> None:
    small = generate(reference_workload(100 * MB), TAGS, seed=3)
    large = generate(reference_workload(400 * MB), TAGS, seed=3)

    assert np.array_equal(small.arrivals, large.arrivals[: small.packets])
    assert np.array_equal(small.tag_index, large.tag_index[: small.packets])


def test_the_source_rate_jumps_between_two_levels_around_its_mean() -> None:
    # Mean 150 Mb/s, high = 3 x low: low 75, high 225 Mb/s.
    spec = WorkloadSpec(volume_bytes=4000 * MB, mean_rate_bps=150 * MBIT, burst_ratio=3.0)

    gaps = np.diff(generate(spec, TAGS, seed=1).arrivals)

    low_gap, high_gap = MB / (75 * MBIT), MB / (225 * MBIT)
    at_a_level = np.isclose(gaps, low_gap) | np.isclose(gaps, high_gap)
    # Only gaps straddling a phase boundary lie in between.
    assert at_a_level.mean() > 0.95
    assert np.isclose(gaps, low_gap).any()
    assert np.isclose(gaps, high_gap).any()


def test_without_skew_tags_follow_the_base_weights() -> None:
    spec = WorkloadSpec(
        volume_bytes=20000 * MB, mean_rate_bps=150 * MBIT, weights={"1": 1, "2": 1, "3": 3}
    )

    shares = np.bincount(generate(spec, TAGS, seed=1).tag_index) / 20000

    assert shares == pytest.approx([0.2, 0.2, 0.6], abs=0.01)


def test_in_a_skew_episode_one_tag_dominates_and_the_dominant_tag_changes() -> None:
    # Episodes of 10 s on average; within each the dominant tag has half the packets.
    spec = WorkloadSpec(
        volume_bytes=8000 * MB, mean_rate_bps=150 * MBIT, dominance=0.5, skew_mean_s=10.0
    )
    workload = generate(spec, TAGS, seed=1)

    # Per 5 s window the most frequent tag, and its share.
    window = (workload.arrivals // 5).astype(int)
    leaders, shares = [], []
    for w in np.unique(window):
        counts = np.bincount(workload.tag_index[window == w], minlength=3)
        leaders.append(int(counts.argmax()))
        shares.append(counts.max() / counts.sum())

    assert np.median(shares) > 0.45  # a dominant tag most of the time (1/3 without skew)
    assert len(set(leaders)) == 3  # every tag gets its turn
