"""A source's watermark is the smallest of its partitions' largest event times, never
moves back, waits for a partition with nothing yet unless it is idle, and with one
partition is the largest event time read so far."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.pipeline.watermark import Watermark

# (partition, the chunk's largest event time or None) in the order chunks are read.
chunks = st.lists(
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 10**12))), max_size=60
)


def test_a_lagging_partition_holds_the_watermark_at_its_own_time() -> None:
    mark = Watermark(partitions=2)
    assert mark.advance(0, 1_000) == (None, None), "partition 1 has read nothing yet"
    assert mark.advance(1, 10) == (None, 10)
    assert mark.advance(0, 2_000) == (10, 10), "the leading partition moves nothing"
    assert mark.advance(1, 50) == (10, 50)
    assert mark.advance(1, 5_000) == (50, 2_000), "now partition 0 is the one behind"


def test_an_idle_partition_stops_holding_the_watermark_back() -> None:
    mark = Watermark(partitions=3)
    mark.advance(0, 100)
    mark.advance(1, 200)
    assert mark.high_us is None, "partition 2 has given nothing"
    assert mark.advance(0, 300, idle=(2,)) == (None, 200)
    # Once it gives records again it counts, but the watermark does not go back
    assert mark.advance(2, 7) == (200, 200)
    assert mark.advance(1, 900) == (200, 200)
    assert mark.advance(2, 1_000) == (200, 300)


def test_the_chunk_s_own_partition_is_never_idle() -> None:
    mark = Watermark(partitions=2)
    mark.advance(1, 40)
    assert mark.advance(0, 90, idle=(0, 1)) == (None, 90)


@given(chunks)
def test_one_partition_s_watermark_is_the_largest_event_time_so_far(
    read: list[tuple[int, int | None]],
) -> None:
    mark = Watermark()
    largest: int | None = None
    for _, found in read:
        before, after = mark.advance(0, found)
        assert before == largest
        if found is not None:
            largest = found if largest is None else max(largest, found)
        assert after == largest


@given(chunks, st.lists(st.sets(st.integers(0, 3)), max_size=60))
def test_the_watermark_never_moves_back_nor_past_a_partition_that_counts(
    read: list[tuple[int, int | None]], idles: list[set[int]]
) -> None:
    mark = Watermark(partitions=4)
    highs: dict[int, int] = {}
    for (partition, found), idle in zip(read, idles + [set()] * len(read), strict=False):
        before, after = mark.advance(partition, found, sorted(idle))
        if found is not None:
            highs[partition] = max(highs.get(partition, found), found)
        assert before is None or (after is not None and after >= before)
        if after != before:
            counting = [p for p in range(4) if p not in idle or p == partition]
            assert all(p in highs for p in counting)
            assert after == min(highs[p] for p in counting)


def test_a_driver_that_takes_over_goes_on_from_the_position() -> None:
    mark = Watermark(partitions=2)
    mark.advance(0, 500)
    mark.advance(1, 300)
    resumed = Watermark.resumed(2, {"chunk": 2, **mark.to_position()})
    assert resumed == mark
    assert resumed.advance(1, 800) == (300, 500)
    # A position from before partitions (one partition) or without event times
    assert Watermark.resumed(1, {"high_us": 42}).advance(0, None) == (42, 42)
    assert Watermark.resumed(2, {}).to_position() == {}


def test_a_partition_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="partition 2 of a source of 2"):
        Watermark(partitions=2).advance(2, 1)
