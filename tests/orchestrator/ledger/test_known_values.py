"""The sink sends PostgreSQL only the distinct values it does not know to be in the result:
one it skips has always been committed, and what it remembers is bounded."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.ledger import segments
from orchestrator.ledger.known_values import KNOWN, KnownValues
from orchestrator.models import ResultKey, Run, Segment
from sparkjobs.merge import MergedKey
from tests.orchestrator.runs import pending_run, segment_row


def test_a_run_s_pairs_once_remembered_are_not_sent_again() -> None:
    known = KnownValues()
    assert known.unknown(1, [("a", ("u1", "u2")), ("b", ())]) == {"a": ("u1", "u2")}
    known.remember(1, {"a": ["u1"]})
    assert known.unknown(1, [("a", ("u1", "u2")), ("b", ("u1",))]) == {"a": ["u2"], "b": ("u1",)}
    assert known.unknown(1, [("a", ("u1",))]) == {}  # nothing new: the key is left out
    assert known.unknown(2, [("a", ("u1",))]) == {"a": ("u1",)}  # another run's result


def test_the_least_recently_merged_run_is_forgotten_first_past_the_bound() -> None:
    known = KnownValues(max_pairs=4)
    known.remember(1, {"a": ["u1", "u2"]})
    known.remember(2, {"a": ["u1", "u2"]})
    known.unknown(1, [])  # run 1 merged again: run 2 is now the older
    known.remember(3, {"k": ["v1", "v2", "v3"]})
    assert known.pairs <= 4
    assert known.unknown(2, [("a", ("u1",))]) == {"a": ("u1",)}
    assert known.unknown(3, [("k", ("v1", "v2"))]) == {}
    # A run alone past the bound remembers what fits.
    known.remember(4, {"k": [f"v{n}" for n in range(10)], "j": ["w"]})
    assert known.pairs == 4
    assert known.unknown(4, [("k", ("v0", "v3", "v4")), ("j", ("w",))]) == {
        "k": ["v4"],
        "j": ("w",),
    }


def test_a_value_remembered_twice_counts_once() -> None:
    known = KnownValues(max_pairs=3)
    known.remember(1, {"a": ["u1", "u2"]})
    known.remember(1, {"a": ["u2"], "b": ["u2"]})
    assert known.pairs == 3
    assert known.unknown(1, [("a", ("u1", "u2")), ("b", ("u2",))]) == {}


def _sink_batch(run: Run, chunk: int, users: list[str]) -> None:
    row = segment_row(
        run, f"p{chunk}-{len(users)}", node="output", upstream="task1", size=1, chunk=chunk
    )
    Segment.objects.filter(pk=row.pk).update(state=Segment.State.CLAIMED, lease_owner="w")
    row.refresh_from_db()
    delta = MergedKey("k", len(users), Decimal(1), Decimal(1), Decimal(1), tuple(users))
    segments.complete_sink_batch(run.pk, "output", "w", [row], [delta])


@pytest.mark.django_db(transaction=True)
def test_a_value_of_a_batch_rolled_back_is_sent_again_and_kept() -> None:
    run = pending_run("reference")
    _sink_batch(run, 0, ["u1"])
    # A chunk merged twice is refused, and its transaction rolled back: u2 with it.
    with pytest.raises(segments.AlreadyMergedError):
        _sink_batch(run, 0, ["u1", "u2"])
    assert KNOWN.unknown(run.pk, [("k", ("u1", "u2"))]) == {"k": ["u2"]}
    _sink_batch(run, 1, ["u1", "u2"])
    assert sorted(ResultKey.objects.get(run=run, key="k").values or []) == ["u1", "u2"]


@pytest.mark.django_db(transaction=True)
def test_a_run_s_last_merge_is_not_remembered_one_with_more_to_come_is() -> None:
    # Given a run whose source has finished, with a segment still waiting upstream
    run = pending_run("reference")
    Run.objects.filter(pk=run.pk).update(chunks_total=3)
    waiting = segment_row(run, "up2", node="task1", upstream="source", size=1, chunk=2)
    # When the sink merges while it waits, what it brought is remembered
    _sink_batch(run, 0, ["u1"])
    assert KNOWN.unknown(run.pk, [("k", ("u1",))]) == {}
    # ...and when the last data has been merged, nothing more is: no later batch asks
    Segment.objects.filter(pk=waiting.pk).update(state=Segment.State.DONE)
    _sink_batch(run, 1, ["u2"])
    assert list(KNOWN.unknown(run.pk, [("k", ("u2",))])["k"]) == ["u2"]
    # The result has both, whatever the process remembers
    assert sorted(ResultKey.objects.get(run=run, key="k").values or []) == ["u1", "u2"]


@pytest.mark.django_db(transaction=True)
def test_a_merge_before_the_source_has_finished_is_remembered() -> None:
    run = pending_run("reference")  # chunks_total unknown: the source may send more
    _sink_batch(run, 0, ["u1"])
    assert KNOWN.unknown(run.pk, [("k", ("u1",))]) == {}
