"""Event-time windows: out-of-order and late records through three branches with
migration; every window closes once and equals Spark's own ``window()`` over the records
that were not late, and the late ones are exactly those behind the watermark."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from pyspark.sql import functions as F

from orchestrator.ledger import keystate
from orchestrator.ledger.results import summary
from orchestrator.ledger.window_view import windows_view
from orchestrator.models import Event, KeyState, ResultGroup, Run, Segment, SourceFile
from orchestrator.run.lifecycle import RunError, create_run
from orchestrator.source.replay import write_ingested
from orchestrator.source.spec import LandingSpec, StreamSpec
from orchestrator.tasks import start_run
from orchestrator.worker.plain_job import batch_summary
from sparkjobs.event_time import US, WindowSpec, iso, parse_us
from tests.orchestrator.run.scenarios import (
    adjust_and_wait,
    kill_a_batch_and_the_driver,
    policy,
    running_totals,
    skewed_reference,
    start,
    stop_once_caught_up,
    wait_started,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

T0 = 1_790_000_000  # 2026-09-21: event times count from here
WINDOW = {"window_s": 10, "event_time": "ts", "lateness_s": 2}


def events(count: int, seed: int) -> list[str]:
    """JSON lines whose event times advance about 1 s per 400 records, jitter up to 3 s
    (out of order), 1 in 50 records 30 to 60 s behind (late), both number and ISO
    times, and a few records whose time is missing or not one."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        t = T0 + i / 400 + rng.uniform(-3, 0)
        if rng.random() < 0.02:
            t -= rng.uniform(30, 60)
        record: dict[str, Any] = {
            "key": f"k{0 if rng.random() < 0.35 else rng.randrange(1, 15)}",
            "value": rng.randrange(100_000) / 100,
            "user": f"u{rng.randrange(40)}",
            "ts": round(t, 3) if i % 3 else iso(int(round(t, 3) * US)),
        }
        if i % 997 == 5:
            record["ts"] = "yesterday"
        if i % 1499 == 7:
            del record["ts"]
        lines.append(json.dumps(record))
    lines.insert(count // 2, '{"key": "k1", "value": ')  # a malformed line
    return lines


def windowed(doc: dict[str, Any]) -> dict[str, Any]:
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["params"] = {**(node.get("params") or {}), **WINDOW}
    return doc


def sinking(doc: dict[str, Any], **params: str) -> dict[str, Any]:
    """``doc`` with its sink node's parameters set to ``params``."""
    next(n for n in doc["nodes"] if n["kind"] == "sink")["params"] = params
    return doc


def chunk_records(path: Path, run: Run) -> list[tuple[int, list[dict[str, Any]]]]:
    """Each source chunk's parsed records, by chunk, from the input's own bytes."""
    data = path.read_bytes()
    chunks = {
        s.chunk: (s.origin_offset, s.origin_length)
        for s in Segment.objects.filter(run=run, upstream="source")
    }
    out = []
    for chunk, (offset, length) in sorted(chunks.items()):
        records = []
        for line in data[offset : offset + length].splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        out.append((chunk, records))
    return out


@dataclass
class Oracle:
    """What the run must give, computed here: each chunk's watermark from its records."""

    kept: list[dict[str, Any]]  # records on time, with their time "t" in us
    late: int
    bad: int
    marks: dict[int, int | None]  # chunk -> the largest event time before it

    @classmethod
    def of(cls, path: Path, run: Run) -> Oracle:
        spec = WindowSpec.from_params(WINDOW)
        assert spec is not None
        high: int | None = None
        oracle = cls([], 0, 0, {})
        for chunk, records in chunk_records(path, run):
            oracle.marks[chunk] = high
            for record in records:
                t = parse_us(record.get("ts"))
                if t is None:
                    oracle.bad += 1
                elif spec.late(spec.starts(t)[0], high):
                    oracle.late += 1
                else:
                    oracle.kept.append({**record, "t": t})
            times = [t for t in (parse_us(r.get("ts")) for r in records) if t is not None]
            high = max([*times, *([] if high is None else [high])], default=None)
        return oracle

    def rows(self, spark: Any) -> list[tuple[Any, ...]]:
        """Spark's own window() over the records on time: (start us, key, count, sum,
        min, max, distinct), by window and key."""
        frame = spark.createDataFrame(
            [(r["key"], str(r["value"]), r["user"], r["t"]) for r in self.kept],
            "key STRING, value STRING, user STRING, t BIGINT",
        )
        expected = (
            frame.withColumn("value", F.col("value").cast("DECIMAL(38,10)"))
            .withColumn("ts", F.timestamp_micros("t"))
            .groupBy(F.window("ts", "10 seconds"), "key")
            .agg(
                F.count(F.lit(1)).alias("count"),
                F.sum("value").alias("sum"),
                F.min("value").alias("min"),
                F.max("value").alias("max"),
                F.count_distinct("user").alias("distinct"),
            )
            .withColumn("start", F.unix_micros(F.col("window.start")))
            .collect()
        )
        return sorted(
            (r["start"], r["key"], r["count"], r["sum"], r["min"], r["max"], r["distinct"])
            for r in expected
        )


def write_events(tmp_path: Path, count: int, seed: int) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(events(count, seed=seed)) + "\n")
    return path


def test_windows_close_once_and_equal_spark_window_over_the_records_not_late(
    workers, spark, tmp_path: Path
) -> None:
    path = write_events(tmp_path, 24_000, seed=11)
    doc = windowed(skewed_reference())
    run = start(doc, policy(), input_path=str(path))
    # A hot rescale while windows are open: the stage grows by an instance.
    wait_started(run)
    grown = adjust_and_wait(run, "add_instance", stage="agg")
    run = wait_until_done(run)
    assert grown.status == "complete", grown.outcome
    (added,) = grown.plan["added"]
    assert Segment.objects.filter(run=run, node=added, state="done").exists()
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["migrated_segments"] > 0  # data moved between branches

    oracle = Oracle.of(path, run)
    assert oracle.late > 50 and oracle.bad > 10
    recorded = {
        s.chunk: s.high_before_us for s in Segment.objects.filter(run=run, upstream="source")
    }
    assert recorded == oracle.marks
    assert result["late_records"] == oracle.late
    assert result["malformed_records"] == oracle.bad + 1
    # Late records are quarantined apart from malformed ones, as the fields read.
    late_folder = Path(workers.env["BPCONSOLE_DATA_DIR"]) / "runs" / str(run.pk) / "quarantine"
    late_lines = [
        json.loads(line)
        for part in (late_folder / "late").glob("*.jsonl")
        for line in part.read_text().splitlines()
    ]
    assert len(late_lines) == oracle.late
    assert all(set(line) == {"key", "value", "user", "ts"} for line in late_lines)

    want = [
        (
            iso(start_us),
            key,
            count,
            float(total),
            float(low),
            float(high),
            float(Decimal(total) / count),
            distinct,
        )
        for start_us, key, count, total, low, high, distinct in oracle.rows(spark)
    ]
    got = sorted(
        (
            w["window_start"],
            w["key"],
            w["count"],
            w["sum"],
            w["min"],
            w["max"],
            w["avg"],
            w["distinct_users"],
        )
        for w in result["rows"]
    )
    assert got == want
    # Every (window, key) is a row of the run's result, closed once the input ended
    rows = ResultGroup.objects.filter(run=run)
    assert rows.count() == len(want)
    assert not rows.filter(closed_at__isnull=True).exists()
    assert not rows.filter(finished__isnull=True).exists()

    # The plain batch job (``run_pipeline --batch``) over the records that were not late.
    on_time = tmp_path / "on_time.jsonl"
    on_time.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "t"}) + "\n" for r in oracle.kept)
    )
    batch = batch_summary(topology=doc, input_path=str(on_time), generator=None)
    assert batch["rows"] == result["rows"]
    assert batch["malformed_records"] == 0


class StateSampler(threading.Thread):
    """Reads a running run's key state over and over: every window held must still be
    open at the sink. The watermark is read first, so a window it closed is gone from
    the state read after it (they change in one transaction)."""

    def __init__(self, run_id: int) -> None:
        super().__init__(daemon=True)
        self.run_id = run_id
        self.seen = 0
        self.wrong: list[tuple[list[int], int]] = []

    def run(self) -> None:
        try:
            while Run.objects.filter(pk=self.run_id, status__in=["pending", "running"]).exists():
                closed = Run.objects.get(pk=self.run_id).windows_closed.get("closed_us")
                held = set(
                    KeyState.objects.filter(
                        run_id=self.run_id, window_us__isnull=False
                    ).values_list("window_us", flat=True)
                )
                if closed is not None and held:
                    self.seen += 1
                    if min(held) + WINDOW["window_s"] * US <= closed:
                        self.wrong.append((sorted(held), closed))
                time.sleep(0.1)
        finally:
            connection.close()


def test_a_stateful_stage_holds_state_per_open_window_across_a_rescale_and_drops_it_closed(
    workers, spark, tmp_path: Path
) -> None:
    path = write_events(tmp_path, 16_000, seed=14)
    doc = windowed(running_totals(max_rate_mbps=6.0, buffer_mb=1.0))
    run = start(doc, policy(), input_path=str(path))
    sampler = StateSampler(run.pk)
    sampler.start()
    wait_started(run)
    grown = adjust_and_wait(run, "add_instance", stage="totals")
    run = wait_until_done(run)
    assert grown.status == "complete", grown.outcome
    state = grown.outcome["state"]["totals"]
    assert state["identical"] is True and state["misplaced_keys"] == [], state
    sampler.join()
    assert sampler.wrong == []
    assert sampler.seen > 0, "the state was never seen while windows were open"
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    got = sorted(
        (parse_us(w["window_start"]), w["key"], w["count"], w["sum"], w["distinct_users"])
        for w in result["rows"]
    )
    want = [(s, k, c, float(t), d) for s, k, c, t, _, _, d in Oracle.of(path, run).rows(spark)]
    assert got == want
    # Every window closed with the input's end, and its state with it.
    assert keystate.totals(run.pk, "totals") == {}


def test_a_postgres_table_gets_every_window_once_after_a_worker_and_the_driver_die(
    workers, services, spark, tmp_path: Path
) -> None:
    path = write_events(tmp_path, 16_000, seed=12)
    table = f"windows_{uuid.uuid4().hex[:8]}"
    doc = windowed(skewed_reference())
    sinking(doc, sink="postgres", table=table)
    run = start(doc, policy(), input_path=str(path))
    victim = kill_a_batch_and_the_driver(run, workers, services)
    run = wait_until_done(run)
    workers.start(victim)
    workers.wait_ready([victim])
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert Event.objects.filter(run=run, kind="driver").count() >= 2, "a second driver took over"
    oracle = Oracle.of(path, run)
    assert result["late_records"] == oracle.late
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (extract(epoch FROM window_start) * 1000000)::bigint, key, count, sum, "  # noqa: S608 - a name made here
            f"min, max, distinct_users FROM {table} ORDER BY 1, 2"
        )
        rows = [tuple(r) for r in cursor.fetchall()]
        cursor.execute(f"SELECT window_start, rows, run_id FROM {table}_commits")  # noqa: S608
        log = cursor.fetchall()
        cursor.execute(f"DROP TABLE {table}, {table}_commits")
    want = oracle.rows(spark)
    # Every (window, key) once (the table's key says so), each equal to Spark's window().
    assert rows == want
    assert len({r[0] for r in rows}) == len(log)
    assert sum(n for _, n, _ in log) == len(rows)
    assert {run_id for _, _, run_id in log} == {run.pk}


def steady_events(count: int, seed: int) -> tuple[list[str], list[dict[str, Any]]]:
    """JSON lines at 40 records per event-time second, up to 1 s out of order (less than
    the lateness: never late), and after the first 70 s one record in 50 from 60 to
    120 s back (always late, however the input is cut into chunks of up to 25 s).
    Returns the lines and the records on time, each with its time "t" in us: which
    records are late does not depend on chunk boundaries, so a continuous run, whose
    segment rows go as data merges, is checked against the input alone."""
    rng = random.Random(seed)
    lines, kept = [], []
    for i in range(count):
        position = T0 + i / 40
        t = position - rng.uniform(0, 1)
        late = position > T0 + 70 and rng.random() < 0.02
        if late:
            t = position - rng.uniform(60, 120)
        record = {
            "key": f"k{0 if rng.random() < 0.35 else rng.randrange(1, 15)}",
            "value": rng.randrange(100_000) / 100,
            "user": f"u{rng.randrange(40)}",
            "ts": round(t, 3) if i % 3 else iso(int(round(t, 3) * US)),
        }
        lines.append(json.dumps(record))
        if not late:
            kept.append({**record, "t": parse_us(record["ts"])})
    return lines, kept


def land(folder: Path, lines: list[str], files: int, every_s: float) -> None:
    """Write ``lines`` into ``folder`` as ``files`` files, one every ``every_s``, each
    whole at once (written aside, then renamed)."""
    size = -(-len(lines) // files)
    for n in range(files):
        part = folder / f".part-{n:04d}.tmp"
        part.write_text("\n".join(lines[n * size : (n + 1) * size]) + "\n")
        part.rename(folder / f"part-{n:04d}.jsonl")
        time.sleep(every_s)


def read_back(spark: Any, root: Path) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """A Parquet sink's manifest, and its committed files read back with Spark: (start
    us, key, count, sum, min, max, distinct) by window and key."""
    manifest: list[dict[str, Any]] = json.loads((root / "_manifest.json").read_text())["windows"]
    starts = [w["start_us"] for w in manifest]
    assert starts == sorted(set(starts))  # each window once, in order
    # Only committed files: nothing written aside is left, nothing unlisted.
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["_manifest.json", *[w["file"] for w in manifest]]
    )
    back = spark.read.parquet(*[str(root / w["file"]) for w in manifest])
    rows = sorted(
        (r["start"], r["key"], r["count"], r["sum"], r["min"], r["max"], r["distinct_users"])
        for r in back.withColumn("start", F.unix_micros("window_start")).collect()
    )
    assert sum(w["rows"] for w in manifest) == len(rows)
    return manifest, rows


def test_a_continuous_run_writes_each_window_to_parquet_once_through_kills(
    workers, services, spark, tmp_path: Path
) -> None:
    lines, kept = steady_events(6_000, seed=15)
    landing = tmp_path / "landing"
    landing.mkdir()
    writer = threading.Thread(target=land, args=(landing, lines, 6, 0.4), daemon=True)
    folder = f"test-{uuid.uuid4().hex[:8]}"
    doc = windowed(skewed_reference())
    sinking(doc, sink="parquet", path=folder)
    writer.start()
    spec = LandingSpec(str(landing), stable_s=0.2, clean="archive", archive=str(tmp_path / "a"))
    run = start(doc, policy(), source=spec)
    victim = kill_a_batch_and_the_driver(run, workers, services)
    try:
        # Stopped once every file is read (a stopped landing run finishes its file).
        writer.join()
        wait_for(
            "the run to read every file",
            lambda: SourceFile.objects.filter(run=run, state__in=["read", "cleaned"]).count() >= 6,
            timeout_s=120,
        )
        run = stop_once_caught_up(run, writer)
    finally:
        workers.start(victim)
        workers.wait_ready([victim])
    taken = tmp_path / "ingested.jsonl"
    write_ingested(run, taken)
    assert taken.read_text().splitlines() == lines
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["late_records"] == len(lines) - len(kept)
    # Stopping closed every window: each went to its file once, equal to Spark's window().
    manifest, rows = read_back(spark, settings.BPCONSOLE_SINK_ROOT / folder)
    assert rows == Oracle(kept, 0, 0, {}).rows(spark)
    assert {w["run"] for w in manifest} == {run.pk}


def partition_events(count: int, seed: int, ahead_s: float) -> tuple[list[str], list[str]]:
    """A partition's JSON lines at 2 records per event-time second from ``T0 + ahead_s``,
    up to 1.5 s out of order (less than the lateness: never late), and after its first
    500 s one record in 40 from 600 to 700 s back. Those are late, however the input is
    cut into chunks (64 KB, about 350 event-time seconds here), when this partition holds
    the watermark (every other one is ahead of it); otherwise none is. Returns the lines
    and those far behind."""
    rng = random.Random(seed)
    lines, late = [], []
    for i in range(count):
        position = T0 + ahead_s + i / 2
        behind = position > T0 + ahead_s + 500 and rng.random() < 0.025
        t = position - (rng.uniform(600, 700) if behind else rng.uniform(0, 1.5))
        record = {
            "key": f"k{0 if rng.random() < 0.35 else rng.randrange(1, 15)}",
            "value": rng.randrange(100_000) / 100,
            "user": f"u{rng.randrange(40)}",
            "ts": round(t, 3),
        }
        lines.append(json.dumps(record))
        if behind:
            late.append(lines[-1])
    return lines, late


def test_a_partitioned_stream_s_watermark_waits_for_its_slowest_partition(
    workers, services, spark, tmp_path: Path
) -> None:
    # Given a stream of two partitions, one a day ahead of the other in event time (a
    # producer catching up on a backlog), each in order within the lateness but for a
    # few records far behind their own partition
    stream = f"test-events-{uuid.uuid4().hex[:8]}"
    ahead, ahead_late = partition_events(4_000, seed=21, ahead_s=86_400)
    behind, behind_late = partition_events(4_000, seed=22, ahead_s=0)
    client = redis.Redis.from_url(services.redis_url)
    spec = StreamSpec(stream, linger_s=0.2, partitions=2, idle_s=0)
    for key, lines in zip(spec.streams, (ahead, behind), strict=True):
        with client.pipeline(transaction=False) as batch:
            for line in lines:
                batch.xadd(key, {"record": line})
            batch.execute()
    doc = windowed(skewed_reference())
    run = start(doc, policy(), source=spec)
    # When the run's driver is killed while it reads them, and a new one goes on
    victim = kill_a_batch_and_the_driver(run, workers, services)
    try:
        done = threading.Thread(target=lambda: None)
        done.start()
        run = stop_once_caught_up(run, done)
    finally:
        workers.start(victim)
        workers.wait_ready([victim])
    result = summary(run)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    # Then the partition behind is judged by its own clock: only its records far behind
    # itself are late (against one watermark for the stream, nearly all of them would be);
    # the partition ahead is held back by it, so none of its records are late, not even
    # those as far behind their own partition
    late = behind_late
    assert len(late) > 50 and len(ahead_late) > 50
    assert result["late_records"] == len(late)
    late_folder = Path(workers.env["BPCONSOLE_DATA_DIR"]) / "runs" / str(run.pk) / "quarantine"
    quarantined = sorted(
        line
        for part in (late_folder / "late").glob("*.jsonl")
        for line in part.read_text().splitlines()
    )
    assert sorted(float(json.loads(line)["ts"]) for line in quarantined) == sorted(
        json.loads(line)["ts"] for line in late
    )
    # ...every window (stopping closes them all) equals Spark's window() over the rest
    kept = [
        {**record, "t": parse_us(record["ts"])}
        for record in (json.loads(line) for line in ahead + behind if line not in set(late))
    ]
    got = sorted(
        (parse_us(w["window_start"]), w["key"], w["count"], w["distinct_users"])
        for w in result["rows"]
    )
    want = [(r[0], r[1], r[2], r[6]) for r in Oracle(kept, 0, 0, {}).rows(spark)]
    assert got == want
    # ...and the run shows each partition's event time, the watermark the lower of them
    view = windows_view(run, WindowSpec.from_params(WINDOW) or pytest.fail("no windows"))
    first, second = (parse_us(h) for h in view["partitions"])
    assert first is not None and second is not None and first > second
    assert view["source_high"] is not None and parse_us(view["source_high"]) == second
    client.delete(*spec.streams)
    client.close()


def test_a_sink_that_cannot_be_written_is_refused_before_the_run_exists(
    workers, tmp_path: Path
) -> None:
    doc = windowed(skewed_reference())
    table = f"taken_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (window_start date, key int, count text)")
    sinking(doc, sink="postgres", table=table)
    before = Run.objects.count()
    with pytest.raises(RunError) as refused:
        create_run(topology=doc, policy=policy(), input_path=str(write_events(tmp_path, 10, 1)))
    message = str(refused.value)
    assert f"table {table} exists and its columns do not fit" in message
    assert "window_start (date; needs timestamp with time zone)" in message
    assert "window_end (missing" in message
    sinking(doc, sink="postgres", table=table, database="elsewhere")
    with pytest.raises(RunError, match="database 'elsewhere' is not configured"):
        create_run(topology=doc, policy=policy(), input_path=str(write_events(tmp_path, 10, 1)))
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {table}")
    assert Run.objects.count() == before


def test_a_parquet_folder_swapped_for_a_link_to_another_pipelines_fails_the_run_writing_nothing(
    workers, tmp_path: Path
) -> None:
    # Given a run whose Parquet sink writes below the root, in "<ours>/minutes", and
    # another pipeline's folder of windows beside it
    ours, theirs = f"test-{uuid.uuid4().hex[:8]}", f"test-{uuid.uuid4().hex[:8]}"
    doc = windowed(skewed_reference())
    sinking(doc, sink="parquet", path=f"{ours}/minutes")
    run = create_run(
        topology=doc, policy=policy(), input_path=str(write_events(tmp_path, 2_000, 17))
    )
    root = settings.BPCONSOLE_SINK_ROOT
    (root / theirs / "minutes").mkdir(parents=True)
    (root / theirs / "minutes" / "_manifest.json").write_text('{"windows": []}')
    # When, after the run was checked, its first folder becomes a link to the other's
    (root / ours / "minutes").rmdir()
    (root / ours).rmdir()
    (root / ours).symlink_to(root / theirs, target_is_directory=True)
    start_run(run)
    # Then the run fails naming the link, and nothing is written in the other's folder
    run = wait_until_done(run)
    assert run.status == "failed"
    assert run.error == (
        f"the sink could not be written: path '{ours}/minutes' leaves the sink root: "
        f"{ours}/minutes: '{ours}' is a symbolic link, which is never followed"
    )
    assert [p.name for p in (root / theirs / "minutes").iterdir()] == ["_manifest.json"]
    assert (root / theirs / "minutes" / "_manifest.json").read_text() == '{"windows": []}'
    assert not ResultGroup.objects.filter(run=run, closed_at__isnull=False).exists()


def test_a_parquet_folder_gone_unwritable_fails_the_run_with_why_and_commits_nothing(
    workers, tmp_path: Path
) -> None:
    folder = f"test-{uuid.uuid4().hex[:8]}"
    doc = windowed(skewed_reference())
    sinking(doc, sink="parquet", path=folder)
    run = create_run(
        topology=doc, policy=policy(), input_path=str(write_events(tmp_path, 2_000, 16))
    )
    # The folder was checked when the run was made; a file takes its place before it starts.
    root = settings.BPCONSOLE_SINK_ROOT / folder
    root.rmdir()
    root.write_text("not a folder")
    start_run(run)
    run = wait_until_done(run)
    assert run.status == "failed"
    assert run.error.startswith(f"the sink could not be written: path '{folder}' cannot be written")
    assert root.read_text() == "not a folder"
    assert not ResultGroup.objects.filter(run=run, closed_at__isnull=False).exists()
    assert run.windows_closed.get("windows", 0) == 0
