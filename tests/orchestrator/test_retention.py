"""Retention on the real PostgreSQL: a segment file goes once every row naming it is done,
done rows go once old and fileless unless a reader still needs them, a late worker
whose rows are gone is refused as one that lost its lease, and an ended run keeps its
results, merged chunks, events and counts without its segment folder, and its groups'
values without the partial states behind them (a distinct count's set among them):
nothing merges into a run that has ended."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from orchestrator.ledger import retention, segments
from orchestrator.ledger.events import record_event
from orchestrator.ledger.failures import fail_run
from orchestrator.ledger.results import run_rows, summary, top_rows
from orchestrator.models import (
    Adjustment,
    Event,
    MergedChunk,
    ResultGroup,
    Run,
    Segment,
)
from orchestrator.pipeline.layout import run_dir, segment_path, segments_dir
from orchestrator.rescale.alignment import send_marker
from orchestrator.run.lifecycle import set_status
from orchestrator.run.snapshot import progress
from orchestrator.worker.lease import LeaseKeeper
from orchestrator.worker.plain_job import batch_summary
from tests.orchestrator.key_form import KEY_FORM, key_group, key_partial, key_states
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done
from tests.orchestrator.runs import pending_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

KEEP = 3600.0  # rows younger than this stay


def _file(run: Run, name: str, size: int = 100) -> Path:
    path = segment_path(run.pk, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def _queue(run: Run, rows: list[tuple[str, str, Path]], migrated_from: str = "") -> None:
    """Queue ``(id, node, path)`` rows as an upstream's completion would."""
    segments.complete_batch(
        run.pk,
        "nobody",
        [],
        [
            segments.NewSegment(
                id=seg_id,
                chunk=n,
                origin_file=0,
                origin_offset=n,
                origin_length=1,
                node=node,
                upstream="source",
                tag="",
                path=str(path),
                bytes=100,
                migrated_from=migrated_from,
            )
            for n, (seg_id, node, path) in enumerate(rows)
        ],
        {},
    )


def _claim(run: Run, node: str, owner: str) -> list[Segment]:
    claim = segments.claim_batch(
        run.pk, node, owner, max_segments=64, max_bytes=1 << 30, lease_s=60
    )
    return claim.segments


def _finish(run: Run, node: str, owner: str = "w") -> list[Segment]:
    batch = _claim(run, node, owner)
    segments.complete_batch(run.pk, owner, batch, [], {})
    return batch


def _age(ids: list[str], seconds: float = 2 * KEEP) -> None:
    Segment.objects.filter(pk__in=ids).update(
        done_at=timezone.now() - dt.timedelta(seconds=seconds)
    )


def test_files_of_done_segments_go_and_files_still_named_by_work_stay() -> None:
    run = pending_run("reference")
    done, claimed, queued = _file(run, "a", 123), _file(run, "b"), _file(run, "c")
    _queue(run, [("a", "task1", done)])
    _finish(run, "task1")
    _queue(run, [("b", "task1", claimed)])
    _claim(run, "task1", "w2")
    _queue(run, [("c", "task1", queued)])

    swept = retention.sweep(run.pk, keep_rows_s=KEEP)

    assert swept == retention.Swept(files_deleted=1, bytes_freed=123, rows_deleted=0)
    assert not done.exists() and claimed.exists() and queued.exists()
    assert Segment.objects.get(pk="a").path == ""  # "no file": the next sweep skips it


def test_a_segment_read_in_place_goes_and_its_input_file_stays(tmp_path: Path) -> None:
    # A whole input file is its segment by a hard link (ADR 11): deleting the segment
    # removes the link and frees nothing.
    run = pending_run("reference")
    user_file = tmp_path / "input.jsonl"
    user_file.write_bytes(b'{"key":"k"}\n' * 10)
    linked = segment_path(run.pk, "linked")
    linked.parent.mkdir(parents=True, exist_ok=True)
    os.link(user_file, linked)
    _queue(run, [("a", "task1", linked)])
    _finish(run, "task1")

    swept = retention.sweep(run.pk, keep_rows_s=KEEP)

    assert swept == retention.Swept(files_deleted=1, bytes_freed=0, rows_deleted=0)
    assert not linked.exists()
    assert user_file.read_bytes() == b'{"key":"k"}\n' * 10


def test_a_shared_file_stays_until_every_copy_naming_it_is_done() -> None:
    run = pending_run("reference")
    shared = _file(run, "chunk")
    _queue(run, [("chunk@task1", "task1", shared), ("chunk@task2", "task2", shared)])
    _finish(run, "task1")

    assert retention.sweep(run.pk, keep_rows_s=KEEP).files_deleted == 0
    assert shared.exists()

    _finish(run, "task2")
    assert retention.sweep(run.pk, keep_rows_s=KEEP).files_deleted == 1
    assert not shared.exists()


def test_old_fileless_done_rows_go_and_younger_ones_stay() -> None:
    run = pending_run("reference")
    _queue(run, [(f"s{n}", "task1", _file(run, f"s{n}")) for n in range(3)])
    _finish(run, "task1")
    _age(["s0", "s1"])

    swept = retention.sweep(run.pk, keep_rows_s=KEEP)

    assert (swept.files_deleted, swept.rows_deleted) == (3, 2)
    assert list(Segment.objects.filter(run=run).values_list("pk", flat=True)) == ["s2"]


def test_a_late_worker_whose_rows_are_gone_is_refused_as_one_that_lost_its_lease() -> None:
    # Given a batch w1 held until its lease ran out, which w2 then finished
    run = pending_run("reference")
    _queue(run, [(f"s{n}", "task1", _file(run, f"s{n}")) for n in range(2)])
    _queue(run, [("o0", "output", _file(run, "o0"))])
    late = _claim(run, "task1", "w1")
    late_sink = _claim(run, "output", "w1")
    Segment.objects.filter(run=run).update(lease_expires=timezone.now() - dt.timedelta(1))
    segments.reclaim_expired(run.pk)
    _finish(run, "task1", "w2")
    segments.complete_sink_batch(
        run.pk, "output", "w2", _claim(run, "output", "w2"), [], grouping=KEY_FORM
    )
    # When the sweep has deleted their files and rows
    _age(["s0", "s1", "o0"])
    assert retention.sweep(run.pk, keep_rows_s=KEEP).rows_deleted == 3
    # Then w1's completions are refused, nothing of theirs is written, and its lease
    # keeper finds nothing left to renew
    output = segments.NewSegment(
        id="s0.task1",
        chunk=0,
        origin_file=0,
        origin_offset=0,
        origin_length=1,
        node="output",
        upstream="task1",
        tag="",
        path=str(segment_path(run.pk, "s0.task1")),
        bytes=1,
    )
    with pytest.raises(segments.LeaseLostError):
        segments.complete_batch(run.pk, "w1", late, [output], {})
    with pytest.raises(segments.LeaseLostError):
        segments.complete_sink_batch(run.pk, "output", "w1", late_sink, [], grouping=KEY_FORM)
    assert not Segment.objects.filter(run=run).exists()
    assert MergedChunk.objects.filter(run=run).count() == 1  # w2's merge, once
    keeper = LeaseKeeper([s.pk for s in late], "w1", lease_s=60, max_hold_s=60)
    keeper.started()
    assert keeper.tick() is False


def test_rows_counted_by_the_run_markers_and_rows_a_running_adjustment_measures_stay() -> None:
    run = pending_run("reference")
    _queue(run, [("migrated", "task2", _file(run, "migrated"))], migrated_from="task1")
    _queue(run, [("malformed", "task1", _file(run, "malformed"))])
    segments.complete_batch(run.pk, "w", _claim(run, "task1", "w"), [], {"malformed": 4})
    _finish(run, "task2")
    send_marker(run.pk, "task1", "output", 1, timezone.now())
    Segment.objects.filter(run=run, marker=True).update(state=Segment.State.DONE)
    _age(["migrated", "malformed", f"r{run.pk}.m1.task1>output"])

    assert retention.sweep(run.pk, keep_rows_s=0).rows_deleted == 0
    assert Segment.objects.filter(run=run).count() == 3
    assert segments.migrated_segments(run.pk) == 1
    assert segments.malformed_records(run.pk) == 4

    # Rows finished since a running adjustment began are what its outcome is measured by.
    Adjustment.objects.create(
        run=run, version=1, kind="migrate", reason="test", before={}, after={}, plan={}
    )
    _queue(run, [("before", "task3", _file(run, "before")), ("after", "task3", _file(run, "a"))])
    _finish(run, "task3")
    _age(["before"])
    assert retention.sweep(run.pk, keep_rows_s=0).rows_deleted == 1
    assert Segment.objects.filter(pk="after").exists()


def test_sweeping_again_missing_files_and_files_outside_the_run_are_harmless(
    tmp_path: Path,
) -> None:
    run = pending_run("reference")
    kept = _file(run, "kept")
    missing = segment_path(run.pk, "never-written")
    elsewhere = tmp_path / "not-the-runs.jsonl"
    elsewhere.write_text("{}\n")
    _queue(run, [("kept", "task1", kept), ("gone", "task1", missing), ("x", "task1", elsewhere)])
    _finish(run, "task1")

    assert retention.sweep(run.pk, keep_rows_s=KEEP).files_deleted == 1
    assert retention.sweep(run.pk, keep_rows_s=KEEP) == retention.Swept()
    assert elsewhere.exists()
    assert not Segment.objects.filter(run=run).exclude(path="").exists()


def test_one_sweep_does_a_bounded_amount_of_work() -> None:
    run = pending_run("reference")
    _queue(run, [(f"s{n}", "task1", _file(run, f"s{n}")) for n in range(5)])
    _finish(run, "task1")
    _age([f"s{n}" for n in range(5)])

    first = retention.sweep(run.pk, keep_rows_s=KEEP, max_paths=2, max_rows=3)
    second = retention.sweep(run.pk, keep_rows_s=KEEP, max_paths=2, max_rows=3)
    third = retention.sweep(run.pk, keep_rows_s=KEEP, max_paths=2, max_rows=3)

    assert [s.files_deleted for s in (first, second, third)] == [2, 2, 1]
    assert [s.rows_deleted for s in (first, second, third)] == [2, 2, 1]
    assert not any(segments_dir(run.pk).iterdir())


def _ended_run_with_everything(status: str = Run.Status.COMPLETED) -> Run:
    run = pending_run("reference")
    _queue(run, [("done", "output", _file(run, "done", 50))])
    _queue(run, [("migrated", "task2", _file(run, "migrated", 70))], migrated_from="task1")
    _queue(run, [("queued", "task1", _file(run, "queued", 30))])
    segments.complete_sink_batch(
        run.pk, "output", "w", _claim(run, "output", "w"), [], grouping=KEY_FORM
    )
    key_group(run, "k", key_states(1, 1, 1, 1))
    record_event(run.pk, "test", "kept")
    (run_dir(run.pk) / "input.jsonl").write_text("{}\n")
    Run.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now())
    run.refresh_from_db()
    return run


def test_an_ended_run_loses_its_segment_folder_and_rows_and_keeps_what_it_shows() -> None:
    run = _ended_run_with_everything()

    swept = retention.clean_finished(run.pk)

    assert swept == retention.Swept(files_deleted=3, bytes_freed=150, rows_deleted=2)
    assert not segments_dir(run.pk).exists()
    assert (run_dir(run.pk) / "input.jsonl").exists()  # a generated input: the summary's
    assert list(Segment.objects.filter(run=run).values_list("pk", "path")) == [("migrated", "")]
    assert ResultGroup.objects.filter(run=run).count() == 1
    assert MergedChunk.objects.filter(run=run).count() == 1
    assert Event.objects.filter(run=run, kind="test").exists()
    assert summary(run)["migrated_segments"] == progress(run)["migrated_segments"] == 1
    assert retention.clean_finished(run.pk) == retention.Swept()  # again: nothing left


def test_an_active_run_is_left_alone() -> None:
    run = _ended_run_with_everything(Run.Status.PENDING)

    assert retention.clean_finished(run.pk) == retention.Swept()
    assert len(list(segments_dir(run.pk).iterdir())) == 3
    assert Segment.objects.filter(run=run).count() == 3


def test_a_minute_after_a_run_ends_its_segment_files_go_and_its_rows_stay() -> None:
    # A cancelled run's queued segments are never done: only this deletes their files
    cancelled = _ended_run_with_everything(Run.Status.CANCELLED)
    Run.objects.filter(pk=cancelled.pk).update(finished_at=timezone.now() - dt.timedelta(minutes=2))
    just_failed = _ended_run_with_everything(Run.Status.FAILED)
    active = _ended_run_with_everything(Run.Status.RUNNING)
    long_ago = _ended_run_with_everything(Run.Status.COMPLETED)
    Run.objects.filter(pk=long_ago.pk).update(finished_at=timezone.now() - dt.timedelta(days=3))
    rows = {run.pk: Segment.objects.filter(run=run).count() for run in (cancelled, just_failed)}

    swept = retention.drop_ended_folders()

    assert swept == retention.Swept(files_deleted=3, bytes_freed=150)
    assert not segments_dir(cancelled.pk).exists()
    assert Segment.objects.filter(run=cancelled).count() == rows[cancelled.pk]
    assert not Segment.objects.filter(run=cancelled).exclude(path="").exists()
    # A batch of the one that ended just now may still be writing; the running one works,
    # and runs ended days ago are left to clean_runs
    for kept in (just_failed, active, long_ago):
        assert len(list(segments_dir(kept.pk).iterdir())) == 3
    assert retention.drop_ended_folders() == retention.Swept()


def _with_partial_states(status: str, ended_s_ago: float) -> Run:
    """A run with the partial states of two keys: "k" of one record by one user, "j" of
    four by three."""
    run = _ended_run_with_everything(status)
    key_group(run, "j", key_states(4, 4, 1, 1, ["u1", "u2", "u3"]))
    ResultGroup.objects.filter(run=run, group=["k"]).update(states=key_states(1, 1, 1, 1, ["u1"]))
    ended = timezone.now() - dt.timedelta(seconds=ended_s_ago)
    Run.objects.filter(pk=run.pk).update(finished_at=ended)
    return run


def test_a_minute_after_a_run_ends_its_groups_states_go_and_their_values_stay() -> None:
    # Given runs that completed, were cancelled and failed two minutes ago, one that
    # completed just now, and one still running, each with its groups' partial states
    # (key "k" of one user, "j" of 3; the completed one's "none" of none)
    completed = _with_partial_states(Run.Status.COMPLETED, 120)
    key_group(completed, "none", key_states(1, 1, 1, 1))
    cancelled = _with_partial_states(Run.Status.CANCELLED, 110)
    failed = _with_partial_states(Run.Status.FAILED, 100)
    just_now = _with_partial_states(Run.Status.COMPLETED, 1)
    running = _with_partial_states(Run.Status.RUNNING, 120)
    ended = (completed, cancelled, failed, just_now, running)
    before = {run.pk: run_rows(run) for run in ended}
    assert [r["distinct_users"] for r in before[completed.pk]] == [3, 1, 0]
    # When the watchdog's retention runs (once a run per pass, the longest ended first)
    assert retention.freeze_results() == [completed.pk]
    assert retention.freeze_results(max_runs=5) == [cancelled.pk, failed.pk]
    # Then each group of the runs that ended a minute ago keeps its measures' values and
    # no partial state (its set of users among them), and their rows say the same
    for frozen in (completed, cancelled, failed):
        groups = ResultGroup.objects.filter(run=frozen)
        assert groups.count() == len(before[frozen.pk]) > 0
        assert not groups.filter(finished__isnull=True).exists()
        assert not groups.exclude(states={}).exists()
        assert run_rows(frozen) == before[frozen.pk]
    finished = dict(ResultGroup.objects.filter(run=completed).values_list("group__0", "finished"))
    ones = {"sum": "1", "min": "1", "max": "1", "avg": "1"}
    assert finished == {
        "j": {"count": 4, "sum": "4", "min": "1", "max": "1", "avg": "1", "distinct_users": 3},
        "k": {"count": 1, **ones, "distinct_users": 1},
        "none": {"count": 1, **ones, "distinct_users": 0},
    }
    assert top_rows(completed, 1) == (3, before[completed.pk][:1])
    # ...and the others keep their states: the one just completed for now, the running
    # one (its states are its exactness state) as long as it runs
    assert retention.freeze_results() == []
    for kept in (just_now, running):
        groups = ResultGroup.objects.filter(run=kept).order_by("records")
        assert list(groups.values_list("group", "states", "finished")) == [
            (["k"], key_states(1, 1, 1, 1, ["u1"]), None),
            (["j"], key_states(4, 4, 1, 1, ["u1", "u2", "u3"]), None),
        ]
        assert run_rows(kept) == before[kept.pk]


@pytest.mark.parametrize("end", ["stopped", "failed"])
def test_a_sink_batch_after_its_run_ended_is_refused_and_changes_nothing(end: str) -> None:
    # Given a run whose sink holds a batch, merged once already for another chunk
    run = pending_run("reference")
    _queue(run, [(f"o{n}", "output", _file(run, f"o{n}")) for n in range(2)])
    first, second = _claim(run, "output", "w1")
    delta = key_partial("k", key_states(1, 2, 2, 2, ["u1"]))
    segments.complete_sink_batch(run.pk, "output", "w1", [first], [delta], grouping=KEY_FORM)
    before = run_rows(run)
    # When the run is stopped (or fails) before the batch holding the other chunk merges
    if end == "stopped":
        set_status(run.pk, Run.Status.CANCELLED)
    else:
        fail_run(run.pk, "a test's failure")
    # Then that late merge is refused, as a batch whose lease was lost, and the partial
    # result stays what it was when the run ended
    later = key_partial("k", key_states(5, 9, 1, 9, ["u2", "u3"]))
    with pytest.raises(segments.LeaseLostError, match=r"is (cancelled|failed); its late batch"):
        segments.complete_sink_batch(run.pk, "output", "w1", [second], [later], grouping=KEY_FORM)
    assert run_rows(run) == before
    assert list(MergedChunk.objects.filter(run=run).values_list("segment", flat=True)) == ["o0"]
    assert Segment.objects.get(pk="o1").state == Segment.State.CLAIMED


@pytest.mark.django_db(transaction=True)
def test_a_stop_waits_for_the_merge_in_flight_and_refuses_every_later_one(
    request: pytest.FixtureRequest,
) -> None:
    # Given a run whose sink is merging a batch: its transaction is still open
    run = pending_run("reference")
    _queue(run, [(f"o{n}", "output", _file(run, f"o{n}")) for n in range(2)])
    first, second = _claim(run, "output", "w1")
    merging, commit = threading.Event(), threading.Event()

    def merge() -> None:
        try:
            with transaction.atomic():
                delta = key_partial("k", key_states(1, 2, 2, 2, ["u1"]))
                segments.complete_sink_batch(
                    run.pk, "output", "w1", [first], [delta], grouping=KEY_FORM
                )
                merging.set()
                commit.wait(30)
        finally:
            connection.close()

    def stop() -> None:
        try:
            set_status(run.pk, Run.Status.CANCELLED)
        finally:
            connection.close()

    merger = threading.Thread(target=merge)
    merger.start()
    assert merging.wait(30)
    # (Its files go with it: run ids start again with the next test's database.)
    request.addfinalizer(lambda: shutil.rmtree(run_dir(run.pk), ignore_errors=True))
    # When an operator stops the run meanwhile
    stopper = threading.Thread(target=stop)
    stopper.start()
    stopper.join(1.0)
    # Then the stop waits for that merge to commit...
    assert stopper.is_alive()
    assert Run.objects.get(pk=run.pk).status == Run.Status.PENDING
    commit.set()
    merger.join(30)
    stopper.join(30)
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    # ...which is in the partial result, and the batch merging after the stop is refused
    later = key_partial("k", key_states(5, 9, 1, 9, ["u2"]))
    with pytest.raises(segments.LeaseLostError):
        segments.complete_sink_batch(run.pk, "output", "w1", [second], [later], grouping=KEY_FORM)
    assert [(r["key"], r["count"], r["distinct_users"]) for r in run_rows(run)] == [("k", 1, 1)]


def test_the_command_cleans_runs_that_ended_long_enough_ago() -> None:
    old = _ended_run_with_everything(Run.Status.CANCELLED)
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - dt.timedelta(hours=2))
    recent = _ended_run_with_everything(Run.Status.FAILED)
    out = StringIO()

    call_command("clean_runs", "--older-than", "1h", stdout=out)

    assert not segments_dir(old.pk).exists()
    assert segments_dir(recent.pk).exists()
    assert f"run {old.pk}: 3 file(s)" in out.getvalue()
    assert f"run {recent.pk}" not in out.getvalue()


@pytest.mark.spark
@pytest.mark.django_db(transaction=True)  # the workers see its rows
def test_a_run_swept_all_along_equals_the_batch_job(workers: object) -> None:
    # Given a skewed run (migration, malformed records) swept every 0.2 s, keeping no
    # done row longer than needed
    doc = skewed_reference()
    run = start(doc, policy(), generator="seed=21,volume_mb=2,dominance=0.85,malformed_every=997")
    stop = threading.Event()
    swept: list[retention.Swept] = []

    def sweeper() -> None:
        try:
            while not stop.wait(0.2):
                swept.append(retention.sweep(run.pk, keep_rows_s=0))
        finally:
            connection.close()

    thread = threading.Thread(target=sweeper, name="sweeper")
    thread.start()
    try:
        run = wait_until_done(run)
    finally:
        stop.set()
        thread.join()
    # Then it is exact and equal to the plain job, and the sweep did delete
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["rows"] == expected["rows"]
    assert result["malformed_records"] == expected["malformed_records"] > 0
    assert sum(s.files_deleted for s in swept) > 0 and sum(s.rows_deleted for s in swept) > 0
    # ...and once its groups' partial states are dropped, their values kept, it still is
    # (the watchdog of the test's workers may freeze them first)
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - dt.timedelta(minutes=2))
    retention.freeze_results()
    groups = ResultGroup.objects.filter(run=run)
    assert groups.exists() and not groups.exclude(states={}).exists()
    assert not groups.filter(finished__isnull=True).exists()
    assert summary(run)["rows"] == expected["rows"]
