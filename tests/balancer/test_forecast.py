"""Time to full: when a node's pool reaches its high water, at the rate it fills."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancer.forecast import Forecast, Pacing, time_to_full
from balancer.policy import MB
from tests.balancer.builders import CAPACITY, layered, node, observe

TOPOLOGY = layered(("s", 1), ("a", 2), ("k", 1))  # s1 -> a1, a2 -> k1
HIGH = {n: 0.8 for n in ("a1", "a2", "k1")}
STEADY = {"s1": Pacing(1.0, None)}


def tick(
    forecast: Forecast,
    a1: dict[str, float],
    before: Mapping[str, Pacing] = STEADY,
    after: Mapping[str, Pacing] = STEADY,
    t: float = 0.0,
) -> float | None:
    """One tick observing a1 (held bytes, rates in and out): its time to full."""
    nodes = {"a1": node("a1", buffered_bytes=a1["buffered"], in_rate=a1["in"], out_rate=a1["out"])}
    return forecast.update(observe(TOPOLOGY, t, nodes=nodes), HIGH, before, after)["a1"]


def test_a_pool_filling_steadily_is_full_when_predicted() -> None:
    # 2 MB/s in, 1 MB/s out: 10 MB held, 0.8 x 64 MB = 51.2 MB is the high water
    forecast, buffered = Forecast(), 10 * MB
    predicted = tick(forecast, {"buffered": buffered, "in": 2 * MB, "out": MB})
    assert predicted == pytest.approx(41.2)
    # Ticks later the pool has grown as measured, and the moment foreseen has not moved
    for t in range(1, 30):
        buffered += MB
        later = tick(forecast, {"buffered": buffered, "in": 2 * MB, "out": MB}, t=float(t))
        assert later is not None
        assert t + later == pytest.approx(41.2)


def test_a_draining_pool_has_no_time_to_full_and_a_pool_past_its_high_water_has_none_left() -> None:
    assert tick(Forecast(), {"buffered": 10 * MB, "in": MB, "out": 2 * MB}) is None
    assert tick(Forecast(), {"buffered": 10 * MB, "in": MB, "out": MB}) is None
    assert tick(Forecast(), {"buffered": 0.9 * CAPACITY, "in": 0.0, "out": MB}) == 0.0


def test_an_upstream_slowed_this_tick_changes_the_forecast_at_once() -> None:
    forecast = Forecast()
    assert tick(forecast, {"buffered": 0.0, "in": 3 * MB, "out": MB}) == pytest.approx(25.6)
    # The balancer halves the source's rate coefficient: 1.5 MB/s in from now on, not 3
    slowed = {"s1": Pacing(0.5, None)}
    halved = tick(forecast, {"buffered": 2 * MB, "in": 3 * MB, "out": MB}, after=slowed, t=1.0)
    assert halved == pytest.approx((51.2 - 2) / 0.5)
    # ...and the measurement, when it follows, agrees with the corrected rate
    same = tick(forecast, {"buffered": 2.5 * MB, "in": 1.5 * MB, "out": MB}, slowed, slowed, t=2.0)
    assert same == pytest.approx((51.2 - 2.5) / 0.5)


def test_a_share_moved_away_from_a_node_lowers_its_rate_in_by_that_ratio() -> None:
    forecast = Forecast()
    even = {"s1": Pacing(1.0, {"a1": 0.5, "a2": 0.5})}
    assert tick(forecast, {"buffered": 0.0, "in": 3 * MB, "out": MB}, even, even) == pytest.approx(
        25.6
    )
    # Half of a1's share goes to a2: 1.5 MB/s less in, filling at 0.5 MB/s instead of 2
    shifted = {"s1": Pacing(1.0, {"a1": 0.25, "a2": 0.75})}
    moved = tick(forecast, {"buffered": 2 * MB, "in": 3 * MB, "out": MB}, even, shifted, t=1.0)
    assert moved == pytest.approx((51.2 - 2) / 0.5)


def test_the_trend_of_the_bytes_held_wins_over_a_burst_that_has_passed() -> None:
    # A burst came in at 4 MB/s; since then the pool holds what it held: nothing fills it
    forecast = Forecast()
    assert tick(forecast, {"buffered": 8 * MB, "in": 4 * MB, "out": 0.0}) == pytest.approx(10.8)
    for t in (0.2, 0.4, 0.6):
        assert tick(forecast, {"buffered": 8 * MB, "in": 0.0, "out": 0.0}, t=t) is None


@given(
    held=st.floats(0, CAPACITY),
    more=st.floats(1, CAPACITY),
    filling=st.floats(-1e9, 1e9),
    high=st.floats(0.05, 1.0),
)
def test_more_data_held_never_leaves_more_time(
    held: float, more: float, filling: float, high: float
) -> None:
    first = time_to_full(held, CAPACITY, high, filling)
    second = time_to_full(held + more, CAPACITY, high, filling)
    if first is None:  # not filling: it stays so, unless already full
        assert second in (None, 0.0)
        assert filling <= 0
    else:
        assert second is not None and 0.0 <= second <= first
