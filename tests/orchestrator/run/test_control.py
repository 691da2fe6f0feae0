"""The control plane acting on live runs: flags, rate coefficients, operator migration,
pause/resume/stop, and the live snapshot."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from orchestrator.ledger.results import summary
from orchestrator.models import Event, Run, Segment
from orchestrator.run.lifecycle import request_migration, set_status
from orchestrator.run.publisher import run_group
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.orchestrator.run.scenarios import policy, skewed_reference, start, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_a_throttled_node_is_flagged_its_upstream_slows_and_the_flag_clears(
    workers, services
) -> None:
    # Given slow branches and watermark throttling, without migration
    doc = skewed_reference(slow_mbps=3.0)
    run = start(doc, policy(migration="off"), generator="seed=5,volume_mb=2,dominance=0.6")
    seen: set[str] = set()
    with ControlPlane.connect(services.zk_hosts) as control:
        while Run.objects.get(pk=run.pk).is_active:
            seen |= control.flags(str(run.pk))
            time.sleep(0.05)
        remaining = control.flags(str(run.pk))
    run.refresh_from_db()
    assert run.status == "completed"
    # Then a slow node's flag appeared in ZooKeeper...
    assert seen & {"task1", "task2"}, f"flags seen: {seen}"
    in_order = Event.objects.filter(run=run).order_by("time", "id")
    flagged = in_order.filter(kind="set_flag").first()
    assert flagged is not None
    assert "high water" in flagged.reason
    # ...its upstream's rate coefficient dropped, with the reason...
    slowed = in_order.filter(kind="set_rate", node="source").first()
    assert slowed is not None
    assert slowed.data["coefficient"] < 1.0
    assert "flag" in slowed.reason
    # ...and the flag cleared once the load dropped
    cleared = in_order.filter(kind="clear_flag", node=flagged.node).last()
    assert cleared is not None and cleared.time > flagged.time
    assert flagged.node not in remaining
    # Every balancer event keeps why: each node it names as the balancer saw it before
    # deciding (level, watermarks, pacing), beside what it changed
    for event in in_order.filter(kind="set_flag"):
        seen_then = event.data["observed"][event.node]
        assert seen_then["level"] >= seen_then["high_water"], event.data
        assert not seen_then["flagged"]
    for event in in_order.filter(kind="clear_flag", reason__contains="low water"):
        seen_then = event.data["observed"][event.node]
        assert seen_then["level"] <= seen_then["low_water"], event.data
        assert seen_then["flagged"]
    assert slowed.data["observed"]["source"]["rate_coefficient"] > slowed.data["coefficient"]


def test_operator_migrates_a_branch_now_and_stops(workers) -> None:
    # Given migration off: the balancer would never move data by itself
    doc = skewed_reference(slow_mbps=2.0)
    values = policy(migration="off", throttling="none")
    run = start(doc, values, generator="seed=3,volume_mb=3,dominance=0.85,skew_mean_s=1000")
    while not Segment.objects.filter(run=run).exists():
        time.sleep(0.1)
    # When an operator asks to migrate both slow branches' data now
    request_migration(run.pk, "task1")
    request_migration(run.pk, "task2")
    deadline = time.monotonic() + 60
    while not Segment.objects.filter(run=run).exclude(migrated_from="").exists():
        assert time.monotonic() < deadline, "no segment was migrated"
        time.sleep(0.1)
    request_migration(run.pk, "task1", stop=True)
    run = wait_until_done(run)
    # Then data moved to the light branch, every step is an event, and the result is exact
    assert Event.objects.filter(run=run, kind="operator_migrate").count() == 2
    started = Event.objects.filter(run=run, kind="start_migration", actor="user")
    assert started.exists()
    assert "operator" in started.first().reason
    assert Event.objects.filter(run=run, kind="stop_migration", actor="user").exists()
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    assert result["coverage"] == "exact"
    assert result["migrated_segments"] > 0
    assert result["rows"] == expected["rows"]


def test_pause_holds_the_source_resume_finishes_stop_cancels(workers) -> None:
    doc = skewed_reference(slow_mbps=4.0)
    run = start(doc, policy(), generator="seed=4,volume_mb=3,dominance=0.5")
    while Segment.objects.filter(run=run).count() < 3:
        time.sleep(0.05)
    # When paused, the source sends nothing more
    set_status(run.pk, "paused")
    time.sleep(1.0)
    before = Segment.objects.filter(run=run, upstream="source").count()
    time.sleep(2.0)
    assert Segment.objects.filter(run=run, upstream="source").count() == before
    assert Run.objects.get(pk=run.pk).status == "paused"
    # When resumed, it runs to completion, exactly
    set_status(run.pk, "running")
    run = wait_until_done(run)
    assert summary(run)["coverage"] == "exact"
    assert {"run_paused", "run_resumed"} <= set(
        Event.objects.filter(run=run).values_list("kind", flat=True)
    )
    # A stopped run ends cancelled and its driver lets go
    other = start(doc, policy(), generator="seed=6,volume_mb=3")
    set_status(other.pk, "cancelled")
    assert wait_until_done(other).status == "cancelled"


def test_every_tick_publishes_a_snapshot_to_the_run_group(workers) -> None:
    doc = skewed_reference()
    run = start(doc, policy(), generator="seed=8,volume_mb=1")

    async def first_snapshot() -> dict:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(run_group(run.pk), channel)
        message = await asyncio.wait_for(layer.receive(channel), timeout=60)
        return message["message"]

    snapshot = asyncio.run(first_snapshot())
    assert snapshot["type"] == "snapshot"
    assert snapshot["run"]["id"] == run.pk
    assert {n["name"] for n in snapshot["nodes"]} == {"source", "task1", "task2", "task3", "output"}
    assert len(snapshot["links"]) == 6
    wait_until_done(run)


@pytest.mark.django_db
def test_a_new_run_holds_no_elastic_ask_left_under_its_id_by_a_reset_database() -> None:
    from orchestrator.run.lifecycle import create_run

    doc = skewed_reference()
    first = create_run(topology=doc, policy=policy(), generator="seed=1,volume_mb=1")
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        # Given an ask left under the next run id (a run of a database since reset)
        control.ask_spark_workers(str(first.pk + 1), 1, "a run of an older database")
        # When a run gets that id
        second = create_run(topology=doc, policy=policy(), generator="seed=2,volume_mb=1")
        assert second.pk == first.pk + 1
        # Then it asks for no Spark worker
        assert str(second.pk) not in control.spark_workers_asked()


@pytest.mark.django_db
def test_bad_requests_change_nothing(tmp_path) -> None:
    from orchestrator.pipeline.generator import GeneratorError
    from orchestrator.pipeline.inputs import InputError
    from orchestrator.run.lifecycle import RunError, create_run

    doc = skewed_reference()
    with pytest.raises(InputError, match="does not exist"):
        create_run(topology=doc, policy=policy(), input_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="no input file matches"):
        create_run(topology=doc, policy=policy(), input_path=str(tmp_path / "*.jsonl"))
    # A file whose name says another format than the source reads is refused, not read
    # as garbage: Parquet bytes taken for JSON lines were all "malformed lines".
    (tmp_path / "rows.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="its name says Parquet, but the source reads JSON"):
        create_run(topology=doc, policy=policy(), input_path=str(tmp_path / "*.parquet"))
    with pytest.raises(GeneratorError, match="unknown generator field"):
        create_run(topology=doc, policy=policy(), generator="colour=blue")
    with pytest.raises(RunError, match="exactly one"):
        create_run(topology=doc, policy=policy())
    assert Run.objects.count() == 0
    good = tmp_path / "in.jsonl"
    good.write_text('{"key":"a","value":1,"user":"u"}\n')
    run = create_run(topology=doc, policy=policy(), input_path=str(good))
    with pytest.raises(RunError, match="has no node 'ghost'"):
        request_migration(run.pk, "ghost")
    assert not Event.objects.filter(run=run, kind__startswith="operator").exists()
