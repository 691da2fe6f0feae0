"""manage.py produce and its library: paced generated records into part files (published
whole, numbered on across runs) and into a Redis stream (one entry per record), at the
asked rate and shape, the same records for the same seed, bad input refused by name.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from balancer.units import KB, MB
from orchestrator.pipeline.producer import (
    FolderTarget,
    ProducerError,
    StreamTarget,
    parse_duration,
    parse_rate,
    parse_target,
    produce,
)
from orchestrator.pipeline.streams import STREAM_PREFIX
from orchestrator.services.launcher import PROJECT_ROOT, Endpoints

pytestmark = pytest.mark.integration


def parts(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*.jsonl"))


def folder_lines(folder: Path) -> list[str]:
    return [line for part in parts(folder) for line in part.read_text().splitlines()]


def key(name: str) -> str:
    """The Redis key of the console's stream ``name``."""
    return STREAM_PREFIX + name


@pytest.fixture
def stream(services: Endpoints) -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(services.redis_url)
    name = f"test-producer-{uuid.uuid4().hex}"
    try:
        yield client, name
    finally:
        client.delete(key(name))
        client.close()


def entries(client: redis.Redis, name: str) -> list[tuple[int, str]]:
    """(milliseconds of the entry id, record) of every entry, in order."""
    stamped = []
    for entry_id, fields in client.xrange(name) or []:
        assert isinstance(entry_id, bytes)
        assert fields is not None
        record = fields[b"record"]
        assert isinstance(record, bytes)
        stamped.append((int(entry_id.split(b"-")[0]), record.decode()))
    return stamped


def bytes_per_second(stamped: list[tuple[int, str]], seconds: int) -> list[int]:
    """Bytes (each record with its newline) per whole second since the first entry."""
    first = stamped[0][0]
    counts = [0] * seconds
    for ms, record in stamped:
        counts[min((ms - first) // 1000, seconds - 1)] += len(record) + 1
    return counts


def test_a_folder_gets_whole_part_files_numbered_on_across_runs(tmp_path: Path) -> None:
    folder = tmp_path / "in"  # absent: the producer creates it
    report = produce(
        FolderTarget(folder),
        rate_bps=4 * MB,
        pattern="steady",
        duration_s=30,
        seed=1,
        file_bytes=MB // 2,
        max_bytes=2 * MB,
    )
    first = parts(folder)
    assert len(first) >= 4
    assert report.files == len(first)
    assert report.stopped_by == "max_bytes"
    assert not list(folder.glob(".*"))  # no temporary file left behind
    assert all(p.stat().st_size <= MB // 2 for p in first)
    assert sum(p.stat().st_size for p in first) == report.bytes
    assert 2 * MB - 100 < report.bytes <= 2 * MB
    lines = folder_lines(folder)
    assert len(lines) == report.records
    for line in lines:
        record = json.loads(line)
        assert set(record) == {"key", "value", "user"}
        assert record["key"].startswith("key-")
        assert record["user"].startswith("u")
    assert all(p.read_bytes().endswith(b"\n") for p in first)
    # Steady: the achieved rate is the target's, give or take a shared machine.
    assert report.rate_bps == pytest.approx(4 * MB, rel=0.25)

    again = produce(
        FolderTarget(folder),
        rate_bps=4 * MB,
        pattern="steady",
        duration_s=30,
        seed=1,
        file_bytes=MB // 2,
        max_bytes=MB,
    )
    names = [p.name for p in parts(folder)]
    assert names[: len(first)] == [p.name for p in first]
    assert names[len(first)] == f"part-{len(first):08d}.jsonl"
    assert len(names) == len(first) + again.files


def test_a_slow_rate_still_publishes_a_file_every_second(tmp_path: Path) -> None:
    report = produce(
        FolderTarget(tmp_path),
        rate_bps=20 * KB,
        pattern="steady",
        duration_s=2.5,
        seed=2,
        file_bytes=MB,
    )
    assert report.stopped_by == "duration"
    assert report.files >= 2  # far below 1 MB each, closed by age
    assert sum(p.stat().st_size for p in parts(tmp_path)) == report.bytes
    assert report.bytes == pytest.approx(2.5 * 20 * KB, rel=0.05)


def test_a_stream_gets_one_entry_per_record_the_same_for_the_same_seed(
    stream: tuple[redis.Redis, str], services: Endpoints, tmp_path: Path
) -> None:
    client, name = stream
    target = StreamTarget(services.redis_url, name)
    report = produce(
        target,
        rate_bps=MB,
        pattern="skewed",
        duration_s=30,
        seed=5,
        file_bytes=MB,
        max_bytes=64 * KB,
    )
    assert report.entries == report.records > 1000
    assert client.xlen(key(name)) == report.records
    records = [record for _, record in entries(client, key(name))]
    assert sum(len(r) + 1 for r in records) == report.bytes
    parsed = [json.loads(r) for r in records]
    assert all(set(r) == {"key", "value", "user"} for r in parsed)
    # Skewed: about 35% of the records go to one key.
    _, hottest = Counter(r["key"] for r in parsed).most_common(1)[0]
    assert 0.3 < hottest / len(parsed) < 0.4

    client.delete(key(name))
    produce(
        target,
        rate_bps=MB,
        pattern="skewed",
        duration_s=30,
        seed=5,
        file_bytes=MB,
        max_bytes=64 * KB,
    )
    assert [record for _, record in entries(client, key(name))] == records
    # The same records whichever the target, and others for another seed.
    produce(
        FolderTarget(tmp_path / "same"),
        rate_bps=MB,
        pattern="skewed",
        duration_s=30,
        seed=5,
        file_bytes=MB,
        max_bytes=64 * KB,
    )
    assert folder_lines(tmp_path / "same") == records
    produce(
        FolderTarget(tmp_path / "other"),
        rate_bps=MB,
        pattern="skewed",
        duration_s=30,
        seed=6,
        file_bytes=MB,
        max_bytes=64 * KB,
    )
    assert folder_lines(tmp_path / "other") != records


def test_steady_holds_the_rate_in_every_second(
    stream: tuple[redis.Redis, str], services: Endpoints
) -> None:
    client, name = stream
    rate = 200 * KB
    report = produce(
        StreamTarget(services.redis_url, name),
        rate_bps=rate,
        pattern="steady",
        duration_s=2,
        seed=1,
        file_bytes=MB,
        max_bytes=None,
    )
    assert report.stopped_by == "duration"
    assert report.rate_bps == pytest.approx(rate, rel=0.25)
    first, second = bytes_per_second(entries(client, key(name)), 2)
    assert first == pytest.approx(rate, rel=0.25)
    assert second == pytest.approx(rate, rel=0.25)


def test_bursty_bursts_at_four_times_the_rate_and_keeps_the_mean(
    stream: tuple[redis.Redis, str], services: Endpoints
) -> None:
    client, name = stream
    rate = 128 * KB
    report = produce(
        StreamTarget(services.redis_url, name),
        rate_bps=rate,
        pattern="bursty",
        duration_s=4,
        seed=1,
        file_bytes=MB,
        max_bytes=None,
    )
    seconds = bytes_per_second(entries(client, key(name)), 4)
    mean = sum(seconds) / len(seconds)
    assert max(seconds) >= 2 * mean
    # 1 s burst, 3 s quiet: seconds count from the first entry, a slice after the start,
    # so the burst's last slice may fall into the second one.
    assert seconds[1] < 0.1 * seconds[0]
    assert seconds[2:] == [0, 0]
    assert report.bytes / 4 == pytest.approx(rate, rel=0.1)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--to", "folder:"], "needs a path"),
        (["--to", "redis:bad name!"], "stream name 'bad name!' is not allowed"),
        (["--to", "redis:celery:queue"], "stream name 'celery:queue' is not allowed.*no ':'"),
        (["--rate", "0"], r"rate 0 B/s is out of range; it must lie in \(0, 1 GB/s\]"),
        (["--rate", "5GB/s"], r"rate 5 GB/s is out of range; it must lie in \(0, 1 GB/s\]"),
        (["--rate", "2MiB/s"], "use a number and B, KB, MB or GB"),
        (["--duration=-3s"], r"duration -3 s is out of range; it must lie in \(0, 7 days\]"),
        (["--duration", "8d"], r"it must lie in \(0, 7 days\]"),
        (["--file-mb", "300"], r"file size 300 MB is out of range; it must lie in \(0, 256 MB\]"),
        (["--pattern", "wavy"], "invalid choice: 'wavy'"),
        (["--keys", "2"], "keys_per_branch 0"),
        (["--partitions", "2"], "--partitions is for a redis:STREAM target"),
    ],
)
def test_bad_input_is_refused_naming_the_problem(
    tmp_path: Path, args: list[str], problem: str
) -> None:
    folder = tmp_path / "never"
    with pytest.raises(CommandError, match=problem):
        call_command("produce", "--to", f"folder:{folder}", *args)
    assert not folder.exists()  # refused before anything is written


def test_the_parsers_raise_producer_errors() -> None:
    assert parse_rate("500KB/s") == 500 * KB
    assert parse_duration("5m") == 300
    assert parse_duration("1h") == 3600
    assert parse_duration("0") is None
    assert parse_duration("forever") is None
    assert parse_target("redis:in.a-1", redis_url="redis://x") == StreamTarget(
        "redis://x", "in.a-1"
    )
    with pytest.raises(ProducerError, match="1 to 200 letters"):
        parse_target("redis:" + "s" * 201)
    assert parse_target("redis:a:b", redis_url="redis://x", own=False) == StreamTarget(
        "redis://x", "a:b", own=False
    )
    with pytest.raises(ProducerError, match="use folder:PATH or redis:STREAM"):
        parse_target("kafka:topic")
    with pytest.raises(ProducerError, match="use a number with s, m, h or d"):
        parse_duration("soon")


def test_the_command_reports_one_json_object_on_redis_by_default(
    stream: tuple[redis.Redis, str],
) -> None:
    client, name = stream
    out = io.StringIO()
    call_command(
        "produce",
        "--to",
        f"redis:{name}",
        "--rate",
        "1MB/s",
        "--max-mb",
        "0.05",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    assert report["entries"] == report["records"] == client.xlen(key(name)) > 0
    assert report["target"] == f"redis:{name}"
    assert set(report) >= {"records", "bytes", "seconds", "rate_bps", "files", "entries"}


def test_the_command_never_writes_a_key_of_the_broker_s(services: Endpoints) -> None:
    # Given the console's Redis, which is Celery's broker too (its queue "spark")
    client = redis.Redis.from_url(services.redis_url)
    before = client.type("spark")
    try:
        # When records are produced to a stream named as the queue
        out = io.StringIO()
        args = ["--rate", "1MB/s", "--max-mb", "0.02", "--json"]
        call_command("produce", "--to", "redis:spark", *args, stdout=out)
        # Then they went to the console's stream of that name, and the queue is untouched
        assert client.xlen(key("spark")) == json.loads(out.getvalue())["entries"] > 0
        assert client.type("spark") == before != b"stream"
    finally:
        client.delete(key("spark"))
        client.close()


def test_on_a_redis_of_its_own_a_stream_is_the_key_it_names(services: Endpoints) -> None:
    # Given another server than the console's (here another database of the same one)
    other = services.redis_url.rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(other)
    name = f"orders:{uuid.uuid4().hex[:8]}"
    try:
        args = ["--rate", "1MB/s", "--max-mb", "0.02", "--redis-url", other]
        call_command("produce", "--to", f"redis:{name}", *args, stdout=io.StringIO())
        # Then the stream is the key as named, ':' and all, with no prefix
        assert client.xlen(name) > 0
        assert not client.exists(key(name))
    finally:
        client.delete(name)
        client.close()


def test_sigterm_ends_a_run_without_duration_with_whole_files(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "produce",
            "--to",
            f"folder:{folder}",
            "--rate",
            "1MB/s",
            "--duration",
            "forever",
            "--file-mb",
            "0.25",
            "--json",
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings.test"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not parts(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    report = json.loads(stdout)
    assert report["stopped_by"] == "stop"
    assert not list(folder.glob(".*"))
    assert report["files"] == len(parts(folder)) >= 1
    assert sum(p.stat().st_size for p in parts(folder)) == report["bytes"]
    assert all(p.read_bytes().endswith(b"\n") for p in parts(folder))


def test_a_partitioned_stream_gets_the_records_in_turn(
    stream: tuple[redis.Redis, str], services: Endpoints
) -> None:
    client, name = stream
    args = ["--rate", "1MB/s", "--max-mb", "0.05", "--seed", "3"]
    call_command("produce", "--to", f"redis:{name}", *args, stdout=io.StringIO())
    whole = [record for _, record in entries(client, key(name))]
    try:
        out = io.StringIO()
        call_command("produce", "--to", f"redis:{name}", "--partitions", "3", *args, stdout=out)
        parts = [[record for _, record in entries(client, key(f"{name}:{p}"))] for p in range(3)]
        # Record n in partition n % 3: the same records as one stream, dealt in turn
        assert [parts[n % 3][n // 3] for n in range(len(whole))] == whole
        assert sum(map(len, parts)) == len(whole)
        assert "in 3 partitions" in out.getvalue()
        with pytest.raises(CommandError, match="partitions must be from 1 to 16, not 17"):
            call_command("produce", "--to", f"redis:{name}", "--partitions", "17", *args)
    finally:
        client.delete(*(key(f"{name}:{p}") for p in range(3)))
