"""Hot migration and rescale during live runs (docs/spec/hot-rescale.md): the result
equals the plain batch job, the sink never stalls long, state survives by key, a timed
out adjustment rolls back, and a killed worker's instances move by themselves."""

from __future__ import annotations

import contextlib
import copy
import signal
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from orchestrator.ledger import keystate
from orchestrator.ledger.groups import GroupRow, digest, shown_row
from orchestrator.ledger.results import summary
from orchestrator.models import Adjustment, Event, Instance, Run, Segment
from orchestrator.rescale.alignment import claim_batch
from orchestrator.rescale.plan import key_groups
from orchestrator.run.lifecycle import live_workers
from orchestrator.worker.plain_job import batch_summary
from sparkjobs.keygroups import slot_of
from tests.orchestrator.key_form import KEY_FORM
from tests.orchestrator.run.scenarios import (
    adjust_and_wait,
    policy,
    running_totals,
    skewed_reference,
    start,
    wait_started,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

# The 2 s target is the rescale bench's (bench/bench_runtime.py rescale). Here the sink
# shares the machine with the whole test stack: 1.5 to 2.7 s on a slow hour of one
# machine, 3.0 to 3.6 s on a slower one (2026-11-27, 5 runs), where the hot migration
# waits 2.2 s for the removed instance's batch in flight before the sink has every
# marker. What must never come back is the first design, whose adjustments held the
# sink for as long as they ran, up to 40 s.
MAX_SINK_STALL_S = 4.5
# An outside node's pace is its inputs' pace: here the sink's only inputs are the
# subgraph's tails, and five instances share one Spark worker, so its cadence is a
# round of their batches (1.6 to 5.6 s on this machine). What must never happen is the
# first design's stall, outside nodes waiting for the subgraph to drain (40 s).
OUTSIDE_STALL_GUARD_S = 10.0


def _skewed(seed: int, volume_mb: int) -> str:
    return f"seed={seed},volume_mb={volume_mb},dominance=0.85,skew_mean_s=1000,malformed_every=997"


def _expected(run: Run, doc: dict[str, Any]) -> dict[str, Any]:
    return batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)


def _exact(run: Run, doc: dict[str, Any], *, malformed: bool = False) -> dict[str, Any]:
    """The plain batch job's summary, once the run's result is asserted equal to it
    (exact coverage, the same rows; with ``malformed``, the same malformed records, some)."""
    result = summary(run)
    expected = _expected(run, doc)
    assert result["coverage"] == "exact", result["error"]
    if malformed:
        assert result["malformed_records"] == expected["malformed_records"] > 0
    assert result["rows"] == expected["rows"]
    return expected


def _running_totals_with(change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """The running-totals pipeline, each operator's parameters as ``change`` makes them."""
    doc = running_totals(max_rate_mbps=6.0, buffer_mb=1.0)
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = change(dict(node["params"]))
    return dict(doc)


def test_hot_migrate_scale_out_and_in_during_a_skewed_run_equal_the_batch_job(workers) -> None:
    # Given a skewed run of the reference pipeline
    doc = skewed_reference(slow_mbps=8.0, buffer_mb=0.5)
    # 10 MB outlast the three adjustments: they ended 7 to 16 s after the first merge
    # (18 s after the run started, twice, on a quiet machine) and the run went on 18 s
    # after the last one (with 16 MB, 27 to 52 s: a longer tail, not a stronger test).
    run = start(doc, policy(), generator=_skewed(21, 10))
    wait_started(run)
    # When an aggregate instance is hot-migrated, the stage scaled out, then in
    migrated = adjust_and_wait(run, "hot_migrate", node="task2")
    grown = adjust_and_wait(run, "add_instance", stage="agg")
    (added,) = grown.plan["added"]
    shrunk = adjust_and_wait(run, "remove_instance", node=added)
    run = wait_until_done(run, timeout_s=300)
    # Then each adjustment completed, the sink never stalled long meanwhile...
    for adjustment in (migrated, grown, shrunk):
        assert adjustment.status == "complete", adjustment.outcome
        gap = adjustment.outcome["sink_max_gap_s"]
        assert gap < MAX_SINK_STALL_S, adjustment.outcome
    assert migrated.plan["removed"] == ["task2"] and migrated.plan["added"][0].startswith("agg-")
    instances = dict(Instance.objects.filter(run=run).values_list("name", "status"))
    assert instances["task2"] == instances[added] == "retired"
    # ...and the result equals the plain batch job exactly
    result = summary(run)
    expected = _expected(run, doc)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["malformed_records"] == expected["malformed_records"] > 0
    assert result["rows"] == expected["rows"]


def test_stateful_state_is_identical_per_key_across_rescales_and_equals_the_batch_job(
    workers,
) -> None:
    # Given the keyed running-totals pipeline (state per key, two instances)
    doc = running_totals(max_rate_mbps=6.0, buffer_mb=1.0)
    run = start(doc, policy(), generator="seed=4,volume_mb=12,malformed_every=499")
    wait_started(run)
    # When its stage scales out, hot-migrates an instance, and scales in
    grown = adjust_and_wait(run, "add_instance", stage="totals")
    moved = adjust_and_wait(run, "hot_migrate", node="totals1")
    shrunk = adjust_and_wait(run, "remove_instance", node=grown.plan["added"][0])
    run = wait_until_done(run, timeout_s=300)
    # Then every hand-off kept every key's state identical, each key with its owner
    for adjustment in (grown, moved, shrunk):
        assert adjustment.status == "complete", adjustment.outcome
        state = adjustment.outcome["state"]["totals"]
        assert state["identical"] is True and state["misplaced_keys"] == [], state
    # ...the final state per key is the batch job's result per key...
    expected = _exact(run, doc)
    assert _state_rows(run, expected["rows"]) == expected["rows"]
    # ...held once, by the owner of its key group in the final graph
    run.refresh_from_db()
    final = [n["name"] for n in run.topology["nodes"] if n.get("stage") == "totals"]
    assert len(final) == 2
    groups = key_groups(run.topology, "totals")
    slots = {digest([r["key"]]): slot_of(str(r["key"])) for r in expected["rows"]}
    held = keystate.holders(run.pk, "totals")
    assert held.keys() == {keystate.StateKey(d) for d in slots}
    for state, holders in held.items():
        assert len(holders) == 1 and slots[state.key] in groups[holders[0]].slots


# A stage of grouped measures over the running-totals pipeline's records.
GROUPED_TOTALS = {
    "group_by": ["key"],
    "measures": [
        {"name": "records", "fn": "count"},
        {"name": "total", "fn": "sum", "field": "value"},
        {"name": "top", "fn": "max", "field": "value"},
        {"name": "users", "fn": "count_distinct", "field": "user"},
    ],
    "keying": "key_groups",
}


def test_a_keyed_stage_of_grouped_measures_hands_its_state_over_and_equals_the_batch_job(
    workers,
) -> None:
    # Given the running-totals pipeline computing grouped measures, keyed by key groups
    doc = _running_totals_with(lambda _: dict(GROUPED_TOTALS))
    run = start(doc, policy(), generator="seed=6,volume_mb=6,malformed_every=499")
    wait_started(run)
    # When its stage scales out, then hot-migrates an instance
    grown = adjust_and_wait(run, "add_instance", stage="totals")
    moved = adjust_and_wait(run, "hot_migrate", node="totals1")
    run = wait_until_done(run, timeout_s=300)
    # Then every hand-off kept every group's state identical, each with its owner...
    for adjustment in (grown, moved):
        assert adjustment.status == "complete", adjustment.outcome
        state = adjustment.outcome["state"]["totals"]
        assert state["identical"] is True and state["misplaced_keys"] == [], state
    # ...the result is the batch job's...
    expected = _exact(run, doc, malformed=True)
    # ...and so is every group's state, merged over its holders: one per group
    grouping = keystate.state_grouping(GROUPED_TOTALS)
    finished = {
        k.key: grouping.finish(t.states) for k, t in keystate.totals(run.pk, "totals").items()
    }
    assert len(finished) == len(expected["rows"]) > 1
    for row in expected["rows"]:
        state = finished[digest([row["key"]])]
        shown = {"key": row["key"], **state, "total": float(state["total"])}
        assert {**shown, "top": float(state["top"])} == row
    assert all(len(who) == 1 for who in keystate.holders(run.pk, "totals").values())


def test_a_local_global_stage_spreads_a_hot_key_and_keeps_its_state_exact_across_rescales(
    workers,
) -> None:
    # Given the running-totals pipeline keyed local_global, over data one key dominates
    doc = _running_totals_with(lambda params: {**params, "keying": "local_global"})
    generator = "seed=5,volume_mb=12,dominance=0.85,malformed_every=499"
    run = start(doc, policy(routing="water_level"), generator=generator)
    wait_started(run)
    # When its stage scales out, then an original instance is removed
    grown = adjust_and_wait(run, "add_instance", stage="totals")
    shrunk = adjust_and_wait(run, "remove_instance", node="totals1")
    run = wait_until_done(run, timeout_s=300)
    # Then the result equals the batch job exactly...
    for adjustment in (grown, shrunk):
        assert adjustment.status == "complete", adjustment.outcome
    expected = _exact(run, doc, malformed=True)
    # ...every key's state merged over its holders is the batch job's result per key...
    assert _state_rows(run, expected["rows"]) == expected["rows"]
    # ...the dominant key was folded by more than one instance, and only members that
    # stay hold state: the removed instance's totals were merged into one of them
    hottest = keystate.StateKey(digest([max(expected["rows"], key=lambda r: r["count"])["key"]]))
    holders = keystate.holders(run.pk, "totals")
    assert len(holders[hottest]) == 2, holders[hottest]
    staying = {"totals2", *grown.plan["added"]}
    assert {h for who in holders.values() for h in who} <= staying


def _state_rows(run: Run, rows: list[dict[str, Any]]) -> list[GroupRow]:
    """The running stage's state of each key of ``rows`` (a result's), merged over its
    holders and finished, as a result row shows it: every measure of the key form
    (sparkjobs/key_form.py), its distinct users among them."""
    totals = keystate.totals(run.pk, "totals")
    assert len(totals) == len(rows) > 1, (len(totals), len(rows))
    return [
        shown_row(
            KEY_FORM,
            [row["key"]],
            KEY_FORM.finish(totals[keystate.StateKey(digest([row["key"]]))].states),
        )
        for row in rows
    ]


def test_an_adjustment_that_times_out_rolls_back_with_nothing_lost(workers) -> None:
    # Given a keyed stage, one of whose instances has a batch held by a stuck worker (and
    # no automatic key-group move, which would change the graph after the rollback)
    doc = running_totals(max_rate_mbps=4.0, buffer_mb=0.5)
    run = start(doc, policy(adjust_timeout_s=1.0, key_moves="off"), generator="seed=8,volume_mb=4")
    wait_started(run)
    wait_for(
        "totals1 to have data to hold",
        lambda: claim_batch(
            run.pk, "totals1", "stuck-worker", max_segments=4, max_bytes=1 << 30, lease_s=5
        ),
        timeout_s=60,
        every_s=0.05,
    )
    before = copy.deepcopy(Run.objects.get(pk=run.pk).topology)
    # When an instance is added: totals1 cannot align while its batch is out
    adjustment = adjust_and_wait(run, "add_instance", stage="totals")
    # Then the adjustment rolled back, saying why, to the old graph...
    assert adjustment.status == "rolled_back"
    assert "not complete after 1 s" in adjustment.outcome["reason"]
    assert Event.objects.filter(run=run, kind="adjust_rolled_back").exists()
    assert Run.objects.get(pk=run.pk).topology == before
    (added,) = adjustment.plan["added"]
    assert Instance.objects.get(run=run, name=added).status == "retired"
    # ...and once the stuck lease expires the run completes exactly, every key's state
    # with its owner in the old graph
    run = wait_until_done(run, timeout_s=300)
    expected = _exact(run, doc)
    assert {k.key: t.records for k, t in keystate.totals(run.pk, "totals").items()} == {
        digest([r["key"]]): r["count"] for r in expected["rows"]
    }
    assert Run.objects.get(pk=run.pk).topology == before
    groups = key_groups(before, "totals")
    slots = {digest([r["key"]]): slot_of(str(r["key"])) for r in expected["rows"]}
    held = keystate.holders(run.pk, "totals").items()
    assert held, "no key's state was kept"
    for state, holders in held:
        assert len(holders) == 1 and slots[state.key] in groups[holders[0]].slots


def test_a_killed_worker_s_instances_move_to_live_workers_and_the_run_is_exact(
    workers,
) -> None:
    # Given a second Spark worker, and task2 hot-migrated onto it
    victim = workers.start("spark9")
    try:
        workers.wait_ready(["spark9"])
        name = next(w for w in _wait_for_worker("spark9"))
        doc = skewed_reference(slow_mbps=4.0, buffer_mb=1.0)
        run = start(doc, policy(), generator=_skewed(22, 32))
        wait_started(run)
        placed = adjust_and_wait(run, "hot_migrate", node="task2", worker=name)
        (moved,) = placed.plan["added"]
        assert Instance.objects.get(run=run, name=moved).worker == name
        wait_for(
            f"{moved} to complete a batch on {name}",
            Segment.objects.filter(run=run, node=moved, state="done").exists,
            timeout_s=120,
            every_s=0.1,
        )
        # When the worker's processes are killed with SIGKILL
        _kill_tree(victim.pid)
        # Then its instance moves to a live worker (once ZooKeeper expires its session)
        wait_for(
            "a failover to end",
            Adjustment.objects.filter(run=run, kind="failover").exclude(status="running").exists,
            timeout_s=120,
        )
        failover = Adjustment.objects.get(run=run, kind="failover")
        assert failover.status == "complete", failover.outcome
        assert failover.plan["removed"] == [moved]
        assert Event.objects.filter(run=run, kind="worker_lost", data__worker=name).exists()
        run = wait_until_done(run, timeout_s=300)
        _exact(run, doc)
    finally:
        if victim.poll() is None:
            _kill_tree(victim.pid)
        workers.processes.pop("spark9", None)


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process under it (pool children, Spark's JVM)."""
    parent = psutil.Process(pid)
    for process in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)


def _wait_for_worker(prefix: str) -> list[str]:
    return wait_for(
        f"worker {prefix} to register in ZooKeeper",
        lambda: [w for w in live_workers() if w.startswith(prefix)],
        timeout_s=30,
    )


def test_the_balancers_scale_out_request_adds_an_instance_to_the_flagged_stage(workers) -> None:
    # Given slow branches, watermark throttling, no migration, and k_min = floor = 1:
    # never slow the source, ask for a scale out as soon as half the stage is flagged
    doc = skewed_reference(slow_mbps=2.0)
    for node in doc["nodes"]:
        if node.get("stage") == "agg":
            node["max_rate_mbps"] = 2.0  # every branch slow: flags come one after another
    values = policy(migration="off", rate_min=1.0, rate_floor=1.0)
    run = start(doc, values, generator="seed=5,volume_mb=6,dominance=0")
    run = wait_until_done(run, timeout_s=300)
    # Then the balancer asked for one more instance and the request ran as an adjustment
    request = Event.objects.filter(run=run, kind="scale_out_request").first()
    assert request is not None, "the balancer never asked for a scale out"
    grown = Adjustment.objects.filter(run=run, kind="scale_out").order_by("version").first()
    assert grown is not None and grown.status == "complete", grown and grown.outcome
    assert "one more instance requested" in grown.reason
    assert grown.plan["changed_stages"] == ["agg"]
    _exact(run, doc)


def test_instances_outside_the_subgraph_keep_processing_during_an_adjustment(workers) -> None:
    # Given source -> clean (a filter stage of 2) -> agg (2) -> output, under load
    doc = skewed_reference(slow_mbps=8.0, buffer_mb=1.0)
    aggs = [n for n in doc["nodes"] if n.get("stage") == "agg"][:2]
    cleans = [
        {
            "name": f"clean{i}",
            "kind": "operator",
            "stage": "clean",
            "operator": "filter",
            "params": {"condition": "value >= 0"},
            "buffer_mb": 1.0,
        }
        for i in (1, 2)
    ]
    doc["nodes"] = [doc["nodes"][0], *cleans, *aggs, doc["nodes"][-1]]
    doc["edges"] = [
        *({"from": "source", "to": c["name"]} for c in cleans),
        *({"from": c["name"], "to": a["name"]} for c in cleans for a in aggs),
        *({"from": a["name"], "to": "output", "bandwidth_mbps": 25} for a in aggs),
    ]
    run = start(doc, policy(), generator="seed=6,volume_mb=8")
    wait_started(run)
    # When the filter stage scales out
    grown = adjust_and_wait(run, "add_instance", stage="clean")
    # Then the sink, outside the subgraph, kept merging meanwhile
    assert grown.status == "complete", grown.outcome
    assert "output" not in grown.plan["subgraph"]
    assert set(grown.plan["tails"]) == {a["name"] for a in aggs}
    assert not Event.objects.filter(run=run, kind="adjust_aligned", node="output").exists()
    assert grown.outcome["outside_max_gap_s"]["output"] < OUTSIDE_STALL_GUARD_S, grown.outcome
    run = wait_until_done(run, timeout_s=300)
    _exact(run, doc)
