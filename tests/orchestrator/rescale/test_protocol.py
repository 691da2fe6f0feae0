"""The hot-rescale protocol on the ledger (docs/spec/hot-rescale.md), step by step, on
the real PostgreSQL: markers, alignment, state hand-off, completion, rollback, fencing.

Instances are driven by their claims, as their Spark workers drive them in a run; no
Spark job is needed because these tests move markers and state, not records.
"""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest

from orchestrator.ledger import keystate, segments
from orchestrator.ledger.groups import digest
from orchestrator.models import Adjustment, Event, Instance, Run, Segment
from orchestrator.rescale.alignment import AlignedClaim, claim_batch, tails_reported
from orchestrator.rescale.completion import complete, rollback
from orchestrator.rescale.plan import Change, NewInstance, RescaleError, key_groups
from orchestrator.rescale.start import begin
from sparkjobs.keygroups import KEY_SLOTS, KeyGroup, slot_of
from sparkjobs.merge import GroupPartial
from tests.orchestrator.key_form import KEY_FORM, key_partial, key_states
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _claim(run: Run, node: str) -> AlignedClaim:
    return claim_batch(run.pk, node, f"test-{node}", max_segments=64, max_bytes=1 << 30, lease_s=60)


def _keys_per_slot_range() -> dict[str, Decimal]:
    # A key in every slot, so every key group holds state.
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < KEY_SLOTS:
        keys.setdefault(slot_of(f"k{i}"), f"k{i}")
        i += 1
    return {key: Decimal(slot) for slot, key in keys.items()}


# Each key's slot by the digest its state is kept by.
SLOTS = {digest([key]): slot_of(key) for key in _keys_per_slot_range()}


def _slot(state: keystate.StateKey) -> int:
    """The key slot of the key whose state is kept at ``state``."""
    return SLOTS[state.key]


def _totals(key: str, count: int, value: Decimal, window: int | None = None) -> GroupPartial:
    """A batch's partial of ``count`` records of ``key``, from ``value - 1`` to ``value + 1``,
    by two users."""
    states = key_states(count, value * count, value - 1, value + 1, [f"u{value}", "u"])
    return key_partial(key, states, window=window)


def _fold(run: Run, holder: str, partials: list[GroupPartial]) -> None:
    keystate.fold(run.pk, "totals", holder, KEY_FORM, keystate.group_deltas(partials))


def _seed_state(run: Run) -> dict[keystate.StateKey, keystate.Kept]:
    """totals1 and totals2 hold the keys of their even key groups, over all time and
    in an event-time window."""
    groups = key_groups(run.topology, "totals")
    by_holder: dict[str, list[GroupPartial]] = {}
    for key, value in _keys_per_slot_range().items():
        holder = next(m for m, g in groups.items() if slot_of(key) in g.slots)
        for window in (None, 60_000_000):
            by_holder.setdefault(holder, []).append(_totals(key, 3, value, window))
    for holder, partials in by_holder.items():
        _fold(run, holder, partials)
    return keystate.totals(run.pk, "totals")


def test_worked_example_subgraph_marker_path_and_tail_report() -> None:
    # Given the reference pipeline and a new instance of stage agg
    run = pending_run("reference")
    adjustment = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("agg-5", "agg"),)),
        epoch=1,
        source="source",
    )
    plan = adjustment.plan
    # Then the subgraph is the whole stage, its upstream and its downstream
    assert plan["subgraph"] == ["source", "task1", "task2", "task3", "agg-5", "output"]
    assert plan["sources"] == ["source"] and plan["tails"] == ["output"]
    assert ["agg-5", "output"] in plan["connect"] and ["source", "agg-5"] in plan["connect"]
    # The source (in the driver) took the injected marker and forwarded it at once
    source = Instance.objects.get(run=run, name="source")
    assert source.config == adjustment.version
    markers = set(Segment.objects.filter(run=run, marker=True).values_list("upstream", "node"))
    assert markers == {("source", n) for n in ("task1", "task2", "task3", "agg-5")}
    # When every operator instance claims, each aligns and forwards to the sink
    for node in ("task1", "task2", "task3", "agg-5"):
        claim = _claim(run, node)
        assert claim.aligned is not None and claim.aligned.forwarded == ("output",)
    assert not tails_reported(adjustment)
    aligned = _claim(run, "output").aligned
    # Then the sink, the only tail, reports, and the adjustment completes
    assert aligned is not None and aligned.tail
    assert tails_reported(adjustment) == ["output"]
    done = complete(adjustment.pk)
    assert done.status == Adjustment.Status.COMPLETE
    assert Instance.objects.get(run=run, name="agg-5").status == Instance.Status.ACTIVE
    assert {n["name"] for n in Run.objects.get(pk=run.pk).topology["nodes"]} >= {"agg-5"}
    kinds = list(Event.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
    assert kinds[:2] == ["adjust_planned", "adjust_markers"]
    assert kinds.count("adjust_aligned") == 6 and kinds[-1] == "adjust_complete"


def _queue(run: Run, seg_id: str, node: str, upstream: str, config: int = 0) -> None:
    seg = segments.NewSegment(
        id=seg_id,
        chunk=int(seg_id[1:]),
        origin_file=0,
        origin_offset=int(seg_id[1:]),
        origin_length=1,
        node=node,
        upstream=upstream,
        tag="",
        path="/dev/null",
        bytes=1,
        config=config,
    )
    segments.complete_batch(run.pk, "nobody", [], [seg], {})


def test_a_changed_keyed_instance_never_mixes_the_two_sides_of_the_marker() -> None:
    # Given data queued at a keyed instance before an adjustment of its stage...
    run = pending_run("running-totals")
    _queue(run, "c1", "totals1", "source")
    adjustment = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("totals-4", "totals"),)),
        epoch=1,
        source="source",
    )
    # ...and data the source sent after its marker
    _queue(run, "c2", "totals1", "source", config=adjustment.version)
    # When the instance claims, it has the marker but not yet handled the old data:
    first = _claim(run, "totals1")
    # Then it takes only the old data and does not align yet
    assert first.aligned is None and [s.pk for s in first] == ["c1"]
    segments.complete_batch(run.pk, "test-totals1", first.segments, [], {})
    # And only once that is done it aligns and takes the new data
    second = _claim(run, "totals1")
    assert second.aligned is not None and [s.pk for s in second] == ["c2"]


def test_a_stateless_instance_aligns_once_it_has_every_marker_and_keeps_processing() -> None:
    # Given old data at the sink from task1, then an adjustment of stage agg...
    run = pending_run("reference")
    _queue(run, "c1", "output", "task1")
    adjustment = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("agg-5", "agg"),)),
        epoch=1,
        source="source",
    )
    for node in ("task1", "task2", "task3"):
        _claim(run, node)
    # ...new data from task2, sent after task2 forwarded its marker
    _queue(run, "c2", "output", "task2", config=adjustment.version)
    # When the sink claims while one marker (agg-5's) is still missing
    first = _claim(run, "output")
    # Then it keeps merging both sides, the old data first, without aligning
    assert first.aligned is None and [s.pk for s in first] == ["c1", "c2"]
    segments.complete_sink_batch(
        run.pk, "output", "test-output", first.segments, [], grouping=KEY_FORM
    )
    # And it aligns as soon as the last marker is in and no batch of its is out
    _claim(run, "agg-5")
    assert _claim(run, "output").aligned is not None


def test_a_removed_stateless_instance_hands_its_queued_data_to_the_new_graph() -> None:
    run = pending_run("reference")
    for i in range(6):
        _queue(run, f"c{i}", "task2", "source")
    adjustment = begin(
        run.pk,
        Change("migrate", added=(NewInstance("agg-5", "agg"),), removed=("task2",)),
        epoch=1,
        source="source",
    )
    aligned = _claim(run, "task2").aligned
    assert aligned is not None and aligned.retired
    moved = Segment.objects.filter(run=run, marker=False, chunk__lt=6)
    assert moved.count() == 6
    assert not moved.filter(node="task2").exists()
    assert set(moved.values_list("node", flat=True)) <= set(
        n["name"] for n in adjustment.after["nodes"] if n.get("stage") == "agg"
    )


def test_state_is_identical_per_key_after_scale_out_and_owned_by_the_new_groups() -> None:
    # Given two stateful instances holding their key groups' state
    run = pending_run("running-totals")
    before = _seed_state(run)
    # When a third instance joins, with the protocol driven through every claim
    adjustment = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("totals-4", "totals"),)),
        epoch=1,
        source="source",
    )
    hand = adjustment.plan["handoff"]["totals"]
    # totals1 keeps its state (its best match is its own new group); totals2's goes to
    # the owner of the new group it overlaps most
    assert hand["second_group"] == {"totals1": "totals1", "totals2": "totals-4"}
    for node in ("totals1", "totals2", "totals-4", "output"):
        _claim(run, node)
    done = complete(adjustment.pk)
    # Then every key's state is what it was, held once, by the owner of its slot
    assert keystate.totals(run.pk, "totals") == before
    owners = key_groups(done.after, "totals")
    held = keystate.holders(run.pk, "totals")
    assert held.keys() == before.keys()
    for state, holders in held.items():
        (holder,) = holders
        assert _slot(state) in owners[holder].slots
    assert done.outcome["state"]["totals"]["identical"] is True
    assert done.outcome["state"]["totals"]["misplaced_keys"] == []


def test_state_is_identical_after_scale_in_and_hot_migration() -> None:
    run = pending_run("running-totals")
    before = _seed_state(run)
    for change in (
        Change("scale_in", removed=("totals2",)),
        Change("migrate", added=(NewInstance("totals-5", "totals"),), removed=("totals1",)),
    ):
        adjustment = begin(run.pk, change, epoch=1, source="source")
        for node in adjustment.plan["subgraph"][1:]:
            _claim(run, node)
        done = complete(adjustment.pk)
        assert done.status == Adjustment.Status.COMPLETE
        assert keystate.totals(run.pk, "totals") == before
    assert {tuple(h) for h in keystate.holders(run.pk, "totals").values()} == {("totals-5",)}
    retired = Instance.objects.filter(run=run, status=Instance.Status.RETIRED)
    assert set(retired.values_list("name", flat=True)) == {"totals1", "totals2"}


def test_rollback_restores_the_old_graph_state_and_requeues_data_of_new_instances() -> None:
    run = pending_run("running-totals")
    before_doc = copy.deepcopy(run.topology)
    before = _seed_state(run)
    adjustment = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("totals-4", "totals"),)),
        epoch=1,
        source="source",
    )
    # Given data the source sent to the new instance under the new key groups...
    group = key_groups(adjustment.after, "totals")["totals-4"]
    stranded = segments.NewSegment(
        id="c9@totals-4",
        chunk=9,
        origin_file=0,
        origin_offset=9,
        origin_length=1,
        node="totals-4",
        upstream="source",
        tag="",
        path="/dev/null",
        bytes=1,
        config=adjustment.version,
        slots_from=group.low,
        slots_to=group.high,
    )
    segments.complete_batch(run.pk, "nobody", [], [stranded], {})
    # ...and an existing instance that already handed its state over
    _claim(run, "totals2")
    # When the adjustment is rolled back
    done = rollback(adjustment.pk, "forced by the test")
    # Then the old graph is back, the new instance is fenced, markers are gone
    run.refresh_from_db()
    assert done.status == Adjustment.Status.ROLLED_BACK
    assert run.topology == before_doc
    assert Instance.objects.get(run=run, name="totals-4").status == Instance.Status.RETIRED
    assert not Segment.objects.filter(run=run, marker=True, state="queued").exists()
    # The stranded data went to the old owners of its slots, split by their groups
    copies = Segment.objects.filter(run=run, chunk=9).order_by("slots_from")
    old_groups = key_groups(before_doc, "totals")
    assert {c.node for c in copies} <= {"totals1", "totals2"}
    spans = [(c.slots_from, c.slots_to) for c in copies]
    assert spans[0][0] == group.low and spans[-1][1] == group.high
    for c in copies:
        inside = KeyGroup(c.slots_from, c.slots_to).intersect(old_groups[c.node])
        assert inside == KeyGroup(c.slots_from, c.slots_to)
    # And every key's state is back with its old owner, unchanged
    assert keystate.totals(run.pk, "totals") == before
    held = keystate.holders(run.pk, "totals")
    assert held.keys() == before.keys()
    for state, holders in held.items():
        assert _slot(state) in old_groups[holders[0]].slots and len(holders) == 1


def test_a_local_global_stage_merges_the_state_of_an_instance_that_leaves_into_one_that_stays() -> (
    None
):
    # Given the running stage keyed local_global, both instances holding partial totals
    # of every key (any instance folds any key it sees)
    run = pending_run("running-totals")
    for node in run.topology["nodes"]:
        if node.get("operator") == "running":
            node["params"]["keying"] = "local_global"
    run.save(update_fields=["topology"])
    keys = _keys_per_slot_range()
    for holder, count in (("totals1", 2), ("totals2", 3)):
        _fold(run, holder, [_totals(k, count, v) for k, v in keys.items()])
    # When a scale-out whose new instance folded a batch is rolled back
    grown = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("totals-4", "totals"),)),
        epoch=1,
        source="source",
    )
    assert "totals" not in grown.plan["handoff"]  # no key groups, nothing handed off by slot
    _fold(run, "totals-4", [_totals(k, 1, v) for k, v in keys.items()])
    expected = keystate.totals(run.pk, "totals")
    assert rollback(grown.pk, "forced by the test").status == Adjustment.Status.ROLLED_BACK
    # Then every key's state is unchanged, held by the members of the old graph only
    assert keystate.totals(run.pk, "totals") == expected
    held = {h for who in keystate.holders(run.pk, "totals").values() for h in who}
    assert held == {"totals1", "totals2"}
    # And when totals1 is removed, its totals are merged into totals2, unchanged per key
    shrunk = begin(run.pk, Change("scale_in", removed=("totals1",)), epoch=1, source="source")
    for node in shrunk.plan["subgraph"][1:]:
        _claim(run, node)
    assert complete(shrunk.pk).status == Adjustment.Status.COMPLETE
    assert keystate.totals(run.pk, "totals") == expected
    assert {tuple(h) for h in keystate.holders(run.pk, "totals").values()} == {("totals2",)}
    assert expected[keystate.StateKey(digest([next(iter(keys))]))].records == 6


def test_a_key_group_move_hands_the_moved_slots_state_over_and_a_scale_out_starts_even() -> None:
    # Given two stateful instances holding their even key groups' state
    run = pending_run("running-totals")
    before = _seed_state(run)
    # When the balancer moves slots 20 to 63 from totals1 to totals2
    move = Change("key_move", regroup={"totals": {"totals1": (0, 20), "totals2": (20, 128)}})
    adjustment = begin(run.pk, move, epoch=1, source="source")
    # Then the stage takes part with no connection opened or closed, behind a barrier
    assert adjustment.plan["changed_stages"] == ["totals"]
    assert adjustment.plan["connect"] == adjustment.plan["disconnect"] == []
    assert Instance.objects.get(run=run, name="totals1").barrier is True
    planned = Event.objects.get(run=run, kind="adjust_planned").reason
    assert "key slots of totals to totals1 [0, 20), totals2 [20, 128)" in planned
    for node in adjustment.plan["subgraph"][1:]:
        _claim(run, node)
    done = complete(adjustment.pk)
    # and every key's state is what it was, held once, by the owner of its slot now
    assert done.status == Adjustment.Status.COMPLETE
    assert keystate.totals(run.pk, "totals") == before
    owners = key_groups(done.after, "totals")
    assert owners == {"totals1": KeyGroup(0, 20), "totals2": KeyGroup(20, KEY_SLOTS)}
    held = keystate.holders(run.pk, "totals")
    assert held.keys() == before.keys()
    for state, holders in held.items():
        (holder,) = holders
        assert _slot(state) in owners[holder].slots
    assert done.outcome["state"]["totals"]["misplaced_keys"] == []
    # When a third instance joins afterwards, the stage starts again from even groups
    grown = begin(
        run.pk,
        Change("scale_out", added=(NewInstance("totals-4", "totals"),)),
        epoch=1,
        source="source",
    )
    for node in grown.plan["subgraph"][1:]:
        _claim(run, node)
    grown = complete(grown.pk)
    assert key_groups(grown.after, "totals") == {
        m: KeyGroup.even(i, 3) for i, m in enumerate(("totals1", "totals2", "totals-4"))
    }
    assert keystate.totals(run.pk, "totals") == before
    assert grown.outcome["state"]["totals"]["misplaced_keys"] == []


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"totals1": (0, 64)}, "must name its members totals1, totals2"),
        ({"totals2": (0, 64), "totals1": (64, 128)}, "must name its members"),
        ({"totals1": (0, 0), "totals2": (0, 128)}, r"totals1's key slots \[0, 0\)"),
        ({"totals1": (0, 70), "totals2": (60, 128)}, r"totals2's key slots \[60, 128\)"),
        ({"totals1": (0, 64), "totals2": (64, 100)}, "end at 100, not 128"),
        ({"totals1": (0, 64), "totals2": (64, 999)}, "within 128"),
    ],
)
def test_a_bad_key_group_move_is_refused_and_changes_nothing(
    groups: dict[str, tuple[int, int]], message: str
) -> None:
    run = pending_run("running-totals")
    before = copy.deepcopy(run.topology)
    with pytest.raises(RescaleError, match=message):
        begin(run.pk, Change("key_move", regroup={"totals": groups}), epoch=1, source="source")
    run.refresh_from_db()
    assert run.topology == before and run.config_version == 0
    assert not Adjustment.objects.filter(run=run).exists()


def test_key_groups_move_only_in_a_keyed_stage_and_never_beside_another_change() -> None:
    run = pending_run("reference")
    with pytest.raises(RescaleError, match="'agg' is not keyed"):
        begin(
            run.pk,
            Change("key_move", regroup={"agg": {"task1": (0, 128)}}),
            epoch=1,
            source="source",
        )
    with pytest.raises(RescaleError, match="no stage 'nope'"):
        begin(run.pk, Change("key_move", regroup={"nope": {}}), epoch=1, source="source")
    with pytest.raises(RescaleError, match="changes no instance"):
        begin(
            run.pk,
            Change("key_move", removed=("task1",), regroup={"agg": {"task1": (0, 128)}}),
            epoch=1,
            source="source",
        )


def test_a_retired_instance_that_wakes_up_late_cannot_write() -> None:
    run = pending_run("reference")
    seg = segments.NewSegment(
        id="late",
        chunk=0,
        origin_file=0,
        origin_offset=0,
        origin_length=1,
        node="task2",
        upstream="source",
        tag="",
        path="/dev/null",
        bytes=1,
    )
    segments.complete_batch(run.pk, "nobody", [], [seg], {})
    stalled = _claim(run, "task2")  # a worker takes task2's batch, then stalls
    adjustment = begin(run.pk, Change("scale_in", removed=("task2",)), epoch=1, source="source")
    # task2 cannot align while its batch is out...
    assert _claim(run, "task2").aligned is None
    # ...until the lease expires and another worker does the batch
    Segment.objects.filter(pk="late").update(lease_expires="2000-01-01T00:00:00Z")
    assert segments.reclaim_expired(run.pk) == 1
    retry = claim_batch(run.pk, "task2", "other", max_segments=8, max_bytes=1 << 20, lease_s=60)
    segments.complete_batch(run.pk, "other", retry.segments, [], {})
    for node in ("task1", "task2", "task3", "output"):
        _claim(run, node)
    assert complete(adjustment.pk).status == Adjustment.Status.COMPLETE
    assert Instance.objects.get(run=run, name="task2").status == Instance.Status.RETIRED
    # When the stalled worker wakes up, its completion is refused
    with pytest.raises(segments.LeaseLostError, match="retired"):
        segments.complete_batch(run.pk, "test-task2", stalled.segments, [], {})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (Change("scale_in", removed=("task9",)), "no instance 'task9'"),
        (Change("scale_in", removed=("output",)), "sink; only operators rescale"),
        (Change("scale_out", added=(NewInstance("x", "nope"),)), "no stage 'nope'"),
        (Change("scale_in", removed=("task1", "task2", "task3")), "without instances"),
        (Change("scale_out", added=(NewInstance("task1", "agg"),)), "already taken"),
    ],
)
def test_bad_adjustments_are_refused_and_change_nothing(change: Change, message: str) -> None:
    run = pending_run("reference")
    before = copy.deepcopy(run.topology)
    with pytest.raises(RescaleError, match=message):
        begin(run.pk, change, epoch=1, source="source")
    run.refresh_from_db()
    assert run.topology == before and run.config_version == 0
    assert not Adjustment.objects.filter(run=run).exists()
    assert not Segment.objects.filter(run=run).exists()


def test_one_adjustment_at_a_time_and_only_for_the_current_driver() -> None:
    run = pending_run("reference")
    begin(run.pk, Change("scale_in", removed=("task3",)), epoch=1, source="source")
    with pytest.raises(RescaleError, match="one adjustment at a time"):
        begin(run.pk, Change("scale_in", removed=("task2",)), epoch=1, source="source")
    with pytest.raises(RescaleError, match="no longer current"):
        begin(run.pk, Change("scale_in", removed=("task2",)), epoch=0, source="source")
