"""A Redis stream is read with a consumer group and acknowledged only once the ledger
holds the entries; a restarted driver skips what it already has and reads the rest."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.ledger.ingested import streamed_copies
from orchestrator.models import Run
from orchestrator.pipeline.inputs import Chunk
from orchestrator.pipeline.streams import STREAM_PREFIX
from orchestrator.run.references import stream_start
from orchestrator.source.replay import ReplayError, replay_inputs, write_ingested
from orchestrator.source.spec import StreamSpec
from orchestrator.source.stream import RedisStreamSource

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SMALL = {"segment_mb": 1024 / 1024 / 1024, "route_by": "key"}  # chunks of about 1 KB


@pytest.fixture
def client(services) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(services.redis_url)
    yield connection
    connection.close()


def key(name: str) -> str:
    """The Redis key of the console's stream ``name``."""
    return STREAM_PREFIX + name


@pytest.fixture
def stream(client: redis.Redis) -> Iterator[str]:
    name = f"test-stream-{uuid.uuid4().hex[:8]}"
    yield name
    client.delete(key(name))


def _run(spec: StreamSpec) -> Run:
    return Run.objects.create(
        pipeline_name="stream",
        topology={"nodes": [], "edges": []},
        policy={},
        input_spec=spec.to_json(),
        status="running",
        epoch=1,
    )


@pytest.fixture
def partitioned(client: redis.Redis) -> Iterator[str]:
    """A name for a stream of two partitions, ``<name>:0`` and ``<name>:1``."""
    name = f"test-parts-{uuid.uuid4().hex[:8]}"
    yield name
    client.delete(key(f"{name}:0"), key(f"{name}:1"))


def _two_partitions_of_30(client: redis.Redis, partitioned: str) -> tuple[StreamSpec, Run]:
    """A run over the stream of two partitions ``partitioned``, which hold the values 0
    to 29 and 100 to 129."""
    spec = StreamSpec(partitioned, linger_s=0.0, partitions=2)
    run = _run(spec)
    _add(client, key(f"{partitioned}:0"), 30)
    _add(client, key(f"{partitioned}:1"), 30, start=100)
    return spec, run


def _add(client: redis.Redis, stream: str, count: int, start: int = 0) -> list[str]:
    return [
        client.xadd(
            stream, {"record": json.dumps({"key": f"k{i % 3}", "value": i, "user": "u"})}
        ).decode()
        for i in range(start, start + count)
    ]


def _values(chunks: list[Chunk]) -> list[int]:
    return [
        json.loads(line)["value"]
        for chunk in chunks
        for line in (chunk.body or b"").decode().splitlines()
    ]


def _killed_halfway(chunks: list[Chunk]) -> tuple[list[Chunk], dict[str, Any]]:
    """The first half of ``chunks`` and the run's position once the ledger holds them."""
    kept = chunks[: len(chunks) // 2]
    last = kept[-1]
    position = {
        "chunk": last.index + 1,
        "file": 0,
        "offset": last.offset + last.length,
        **last.stream_position(),
    }
    return kept, position


def _drain(source: RedisStreamSource, *, commit: bool = True) -> list[Chunk]:
    taken = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        chunk = source.next_chunk()
        if chunk is None:
            if taken and not any(p.buffer for p in source.parts):
                break
            time.sleep(0.05)
            continue
        taken.append(chunk)
        if commit:
            source.committed(chunk)
    return taken


def test_entries_are_read_in_order_and_acknowledged_only_once_committed(
    services, client, stream
) -> None:
    spec = StreamSpec(stream, linger_s=0.1)
    run = _run(spec)
    _add(client, key(stream), 100)
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    chunks = _drain(source, commit=False)
    assert _values(chunks) == list(range(100))
    assert [c.offset for c in chunks] == [
        sum(c.length for c in chunks[:i]) for i in range(len(chunks))
    ]
    group = f"bpconsole.run.{run.pk}"
    assert client.xpending(key(stream), group)["pending"] == 100, "nothing acknowledged yet"
    for chunk in chunks:
        source.committed(chunk)
    assert client.xpending(key(stream), group)["pending"] == 0
    source.close()


def test_a_slow_stream_is_cut_after_the_linger_time(services, client, stream) -> None:
    spec = StreamSpec(stream, linger_s=0.3)
    run = _run(spec)
    source = RedisStreamSource(run.pk, spec, {"segment_mb": 1}, {}, url=services.redis_url)
    _add(client, key(stream), 3)
    assert source.next_chunk() is None, "too little to cut at once"
    time.sleep(0.35)
    chunk = source.next_chunk()
    assert chunk is not None and chunk.length == 3
    source.close()


def test_a_restarted_driver_skips_what_the_ledger_has_and_reads_the_rest(
    services, client, stream
) -> None:
    spec = StreamSpec(stream, linger_s=0.0)
    run = _run(spec)
    _add(client, key(stream), 60)
    first = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    # The driver dies after the ledger took the first chunks, before acknowledging them
    kept, position = _killed_halfway(_drain(first, commit=False))
    first.close()
    _add(client, key(stream), 10, start=60)
    second = RedisStreamSource(run.pk, spec, SMALL, position, url=services.redis_url)
    resumed = _drain(second)
    # Then nothing is read twice, nothing is lost, and the numbering goes on
    assert _values(kept) + _values(resumed) == list(range(70))
    assert resumed[0].offset == position["offset"]
    assert resumed[0].index == position["chunk"]
    assert client.xpending(key(stream), f"bpconsole.run.{run.pk}")["pending"] == 0
    second.close()


def test_an_entry_without_a_record_field_is_the_object_of_its_fields(
    services, client, stream
) -> None:
    spec = StreamSpec(stream, linger_s=0.0)
    run = _run(spec)
    client.xadd(key(stream), {"key": "k1", "value": "3", "user": "u"})
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    (chunk,) = _drain(source)
    assert json.loads(chunk.body or b"") == {"key": "k1", "value": "3", "user": "u"}
    source.close()


def test_the_lag_counts_what_waits_and_how_old_it_is(services, client, stream) -> None:
    spec = StreamSpec(stream, linger_s=0.0)
    run = _run(spec)
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    _add(client, key(stream), 40)
    time.sleep(0.3)
    lag = source.lag()
    assert lag.entries == 40
    assert lag.age_s >= 0.25
    _drain(source)
    assert source.lag().entries == 0
    source.close()


def test_a_named_group_goes_on_where_its_last_run_stopped(services, client, stream) -> None:
    spec = StreamSpec(stream, group=f"orders-{uuid.uuid4().hex[:6]}", linger_s=0.0)
    _add(client, key(stream), 30)
    earlier = _run(spec)
    source = RedisStreamSource(earlier.pk, spec, SMALL, {}, url=services.redis_url)
    chunks = _drain(source, commit=False)
    last = chunks[-1]
    # The earlier run's ledger took everything; its driver died before acknowledging
    earlier.source_position = {"chunk": last.index + 1, "offset": 30, "mark": last.mark}
    earlier.status = "completed"
    earlier.save()
    source.close()
    _add(client, key(stream), 5, start=30)
    later = _run(spec)
    resumed = _drain(RedisStreamSource(later.pk, spec, SMALL, {}, url=services.redis_url))
    assert _values(resumed) == list(range(30, 35))


def test_a_partitioned_stream_cuts_each_chunk_from_one_partition_taking_turns(
    services, client, partitioned
) -> None:
    spec = StreamSpec(partitioned, linger_s=0.0, partitions=2)
    run = _run(spec)
    ids0 = _add(client, key(f"{partitioned}:0"), 100)
    ids1 = _add(client, key(f"{partitioned}:1"), 100, start=100)
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    chunks = _drain(source)
    # Each chunk holds one partition's entries, in that partition's order
    by_partition = {p: [c for c in chunks if c.partition == p] for p in (0, 1)}
    assert _values(by_partition[0]) == list(range(100))
    assert _values(by_partition[1]) == list(range(100, 200))
    # Both have a backlog, so they take turns; the run numbers entries across both
    assert [c.partition for c in chunks[:6]] == [0, 1, 0, 1, 0, 1]
    assert [c.offset for c in chunks] == [
        sum(c.length for c in chunks[:i]) for i in range(len(chunks))
    ]
    # The last chunk says where each partition stands: what the run's position keeps
    assert chunks[-1].marks == (
        (key(f"{partitioned}:0"), ids0[-1], 100),
        (key(f"{partitioned}:1"), ids1[-1], 100),
    )
    group = f"bpconsole.run.{run.pk}"
    assert client.xpending(key(f"{partitioned}:0"), group)["pending"] == 0
    assert client.xpending(key(f"{partitioned}:1"), group)["pending"] == 0
    assert source.lag().entries == 0
    source.close()


def test_a_restarted_partitioned_source_skips_what_the_ledger_has_and_replays_it(
    services, client, partitioned, tmp_path
) -> None:
    spec, run = _two_partitions_of_30(client, partitioned)
    first = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    # The driver dies after the ledger took the first chunks, before acknowledging them
    kept, position = _killed_halfway(_drain(first, commit=False))
    first.close()
    _add(client, key(f"{partitioned}:1"), 10, start=130)
    second = RedisStreamSource(run.pk, spec, SMALL, position, url=services.redis_url)
    resumed = _drain(second)
    # Then nothing is read twice, nothing is lost, and the numbering goes on
    assert sorted(_values(kept) + _values(resumed)) == [*range(30), *range(100, 140)]
    assert resumed[0].offset == position["offset"]
    assert resumed[0].index == position["chunk"]
    # ...and what the run took in is read back, partition by partition, for the plain job
    run.source_position = {
        "chunk": resumed[-1].index + 1,
        "offset": 70,
        **resumed[-1].stream_position(),
    }
    run.save()
    out = tmp_path / "ingested.jsonl"
    write_ingested(run, out)
    assert [json.loads(line)["value"] for line in out.read_text().splitlines()] == [
        *range(30),
        *range(100, 140),
    ]
    second.close()


def test_a_copy_refreshed_mid_stream_splits_every_partition_where_its_chunks_begin(
    services, client, partitioned, tmp_path
) -> None:
    # Given a partitioned stream run that emitted half its chunks when a join's table
    # was read again (the refresh records where, under the run's lock)
    spec, run = _two_partitions_of_30(client, partitioned)
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    chunks = _drain(source)
    source.close()
    before, position = _killed_halfway(chunks)
    run.source_position = position
    since = stream_start(run, "copy-2")
    assert since["chunk"] == position["chunk"]
    assert sum(since["entries"].values()) == position["offset"] == len(_values(before))
    last = chunks[-1]
    run.source_position = {"chunk": last.index + 1, "offset": 60, **last.stream_position()}
    run.references = {"enrich": {"file": "copy-2", "version": 1, "since": [since]}}
    run.save()
    # Then the chunks emitted after it join the new copy, those before the first...
    joined = streamed_copies(run.pk, "enrich", [c.index for c in chunks])
    assert joined == {c.index: "copy-2" for c in chunks[len(before) :]}
    # ...and the replay splits each partition's entries at the same place, one part per copy
    replay = replay_inputs(run, tmp_path / "replay.jsonl")
    parts = [
        [json.loads(line)["value"] for line in Path(p).read_text().splitlines()]
        for p in replay.paths
    ]
    assert sorted(parts[0]) == sorted(_values(before))
    assert sorted(parts[1]) == sorted(_values(chunks[len(before) :]))
    assert replay.copies == {"enrich": {Path(replay.paths[1]).name: "copy-2"}}
    with pytest.raises(ReplayError, match="refreshed copies"):
        write_ingested(run, tmp_path / "whole.jsonl")


def test_a_partition_that_gives_nothing_for_the_idle_time_is_idle(
    services, client, partitioned
) -> None:
    spec = StreamSpec(partitioned, linger_s=0.0, partitions=2, idle_s=0.4)
    run = _run(spec)
    source = RedisStreamSource(run.pk, spec, SMALL, {}, url=services.redis_url)
    _add(client, key(f"{partitioned}:0"), 5)
    first = _drain(source)
    assert [c.idle for c in first] == [()], "found empty only now: not idle yet"
    time.sleep(0.5)
    _add(client, key(f"{partitioned}:0"), 5, start=5)
    (second,) = _drain(source)
    assert second.idle == (1,)
    # An entry in it makes it count again; the one that just gave a chunk is never idle
    _add(client, key(f"{partitioned}:1"), 5)
    _add(client, key(f"{partitioned}:0"), 5, start=10)
    assert all(c.idle == () for c in _drain(source))
    source.close()


def test_a_stored_run_over_the_broker_s_queue_name_resumes_under_the_prefix(
    services, client
) -> None:
    # Given a run stored before the streams' prefix, over a stream named as Celery's
    # own queue key, resumed by a new driver
    spec = StreamSpec("spark", linger_s=0.0)
    run = _run(spec)
    run.source_position = {"chunk": 0, "file": 0, "offset": 0}
    run.save()
    broker_type = client.type("spark")
    try:
        source = RedisStreamSource(run.pk, spec, SMALL, run.source_position, url=services.redis_url)
        _add(client, key("spark"), 3)
        taken = _drain(source)
        source.close()
        # Then it reads the console's stream of that name, and the broker's key is as
        # it was (a list while a Spark worker waits on it, or absent): never a stream
        assert _values(taken) == [0, 1, 2]
        assert client.type(key("spark")) == b"stream"
        groups = [g["name"] for g in client.xinfo_groups(key("spark"))]
        assert groups == [f"bpconsole.run.{run.pk}".encode()]
        assert client.type("spark") == broker_type
        assert client.type("spark") != b"stream"
    finally:
        client.delete(key("spark"))
