"""What an operator asks a continuous run to read is checked before anything exists."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Run
from orchestrator.pipeline.inputs import InputError
from orchestrator.run.lifecycle import RunError, create_run
from orchestrator.source.spec import (
    LandingSpec,
    StreamSpec,
    check_landing,
    check_stream,
    unbounded_spec,
)
from tests.orchestrator.runs import TOPOLOGIES

REDIS = "redis://127.0.0.1:6379/0"


def test_a_landing_folder_must_exist_and_stay_inside_the_roots(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(InputError, match="must lie under an input folder"):
        check_landing({"folder": str(outside)}, fmt="jsonl", roots=[root])
    with pytest.raises(InputError, match="must lie under an input folder"):
        check_landing({"folder": "../outside"}, fmt="jsonl", roots=[root])
    with pytest.raises(InputError, match="must lie under an input folder"):
        check_landing({"folder": "escape"}, fmt="jsonl", roots=[root])
    with pytest.raises(InputError, match="does not exist"):
        check_landing({"folder": "missing"}, fmt="jsonl", roots=[root])
    (root / "in").mkdir()
    spec = check_landing({"folder": "in"}, fmt="jsonl", roots=[root])
    assert spec.folder == str((root / "in").resolve())
    assert spec.pattern == "*.jsonl"


@pytest.mark.parametrize(
    ("pattern", "fmt", "named"),
    [
        ("*.parquet", "jsonl", "Parquet"),
        ("*.CSV", "parquet", "CSV"),
        ("day-*.jsonl", "csv", "JSON"),
    ],
)
def test_a_landing_pattern_naming_another_format_is_refused(
    tmp_path, pattern: str, fmt: str, named: str
) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(InputError, match=f"its name says {named}.*set the source's format"):
        check_landing({"folder": "in", "pattern": pattern}, fmt=fmt, roots=[tmp_path])
    # A pattern of the source's own format, or that names none, is taken as it is
    assert check_landing({"folder": "in", "pattern": "*.log"}, fmt=fmt, roots=[tmp_path])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stable_s": -1}, "stable_s must be from 0 to 600"),
        ({"stable_s": "soon"}, "stable_s must be a number"),
        ({"clean": "shred"}, "clean must be one of keep, archive, delete"),
        ({"clean": "archive"}, "archive folder is a path"),
        ({"archive": "x"}, "only with clean: archive"),
        ({"pattern": "../*.jsonl"}, "one name pattern"),
        ({"checkpoint": "day 1"}, "checkpoint name is 1 to 200"),
        ({"checkpoint": "c" * 201}, "checkpoint name is 1 to 200"),
    ],
)
def test_landing_parameters_are_bounded(tmp_path, raw, message) -> None:
    with pytest.raises(InputError, match=message):
        check_landing({"folder": str(tmp_path), **raw}, fmt="jsonl", roots=None)


def test_a_command_line_folder_given_through_a_link_is_recorded_resolved(tmp_path) -> None:
    # The source walks the recorded folder following no link: the link the command line
    # named is resolved once, when the run is created.
    (tmp_path / "real" / "landing").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    spec = check_landing(
        {
            "folder": str(tmp_path / "link" / "landing"),
            "clean": "archive",
            "archive": str(tmp_path / "link" / "done"),
        },
        fmt="jsonl",
        roots=None,
    )
    assert (spec.folder, spec.archive) == (
        str(tmp_path / "real" / "landing"),
        str(tmp_path / "real" / "done"),
    )


def test_an_archive_inside_the_landing_folder_is_refused(tmp_path) -> None:
    with pytest.raises(InputError, match="must not be the landing folder or inside it"):
        check_landing(
            {"folder": str(tmp_path), "clean": "archive", "archive": str(tmp_path / "done")},
            fmt="jsonl",
            roots=None,
        )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stream": "has spaces"}, "stream name is 1 to 200"),
        ({"stream": "x" * 201}, "stream name is 1 to 200"),
        ({"stream": "ok", "url": "redis://evil.example:6379/0"}, "not one the administrator"),
        ({"stream": "ok", "group": "a b"}, "consumer group name"),
        ({"stream": "ok", "start": "yesterday"}, "start must be one of earliest, latest"),
        ({"stream": "ok", "linger_s": 60}, "linger_s must be from 0 to 10"),
        ({"stream": "ok", "partitions": 0}, "partitions must be from 1 to 16, not 0"),
        ({"stream": "ok", "partitions": 17}, "partitions must be from 1 to 16, not 17"),
        ({"stream": "ok", "partitions": 2.5}, "partitions must be a whole number, not 2.5"),
        ({"stream": "ok", "partitions": "many"}, "partitions must be a number from 1 to 16"),
        ({"stream": "ok", "idle_s": -1}, "idle_s must be from 0 to 3600"),
        ({"stream": "ok", "idle_s": "nan"}, "idle_s must be from 0 to 3600"),
        ({"stream": "x" * 199, "partitions": 16}, "leaves room for ':<partition>'"),
        # The console's Redis is the broker: a name is a plain one, never another key's
        ({"stream": "orders:0"}, "no ':'"),
        ({"stream": "celery:spark"}, "no ':'"),
        ({"stream": ".hidden"}, "starting with a letter or a digit"),
        ({"stream": "ok", "group": "a:b"}, "consumer group name"),
        ({"stream": "ok", "group": "bpconsole.run.7"}, "run 7's own consumer group"),
        ({"stream": "ok", "group": "bpconsole.anything"}, "the console's own"),
    ],
)
def test_stream_parameters_are_bounded(raw, message) -> None:
    with pytest.raises(InputError, match=message):
        check_stream(raw, default_url=REDIS, allowed_urls=[])


def test_a_partitioned_stream_reads_one_redis_stream_per_partition() -> None:
    spec = check_stream(
        {"stream": "orders", "partitions": "3", "idle_s": 5}, default_url=REDIS, allowed_urls=[]
    )
    assert spec.stream == "orders", "the run keeps the name; the key is computed"
    assert spec.streams == [
        "bpconsole:stream:orders:0",
        "bpconsole:stream:orders:1",
        "bpconsole:stream:orders:2",
    ]
    assert spec.idle_s == 5.0
    assert StreamSpec("orders").streams == ["bpconsole:stream:orders"], "one partition"
    assert unbounded_spec(spec.to_json()) == spec


def test_a_stream_on_a_listed_server_is_read_by_its_name_as_given() -> None:
    listed = "redis://streams.example:6379/2"
    spec = check_stream(
        {"stream": "orders:eu", "url": listed, "group": "a:b", "partitions": 2},
        default_url=REDIS,
        allowed_urls=[listed],
    )
    assert spec.streams == ["orders:eu:0", "orders:eu:1"], "that server is not the broker"
    with pytest.raises(InputError, match="run 3's own consumer group"):
        check_stream(
            {"stream": "orders", "url": listed, "group": "bpconsole.run.3"},
            default_url=REDIS,
            allowed_urls=[listed],
        )


def test_a_stored_run_s_unprefixed_stream_is_read_under_the_prefix() -> None:
    # A run stored before the prefix named the broker's own queue key: it is read, on
    # resume, as the console's stream of that name, never as the key itself.
    stored = {"kind": "stream", "stream": "spark", "url": "", "group": "", "partitions": 1}
    spec = unbounded_spec(stored)
    assert isinstance(spec, StreamSpec)
    assert spec.stream == "spark"
    assert spec.streams == ["bpconsole:stream:spark"]
    old_partitioned = unbounded_spec({**stored, "stream": "orders:eu", "partitions": 2})
    assert isinstance(old_partitioned, StreamSpec)
    assert old_partitioned.streams == [
        "bpconsole:stream:orders:eu:0",
        "bpconsole:stream:orders:eu:1",
    ]


def test_the_console_redis_is_not_stored_as_an_address() -> None:
    spec = check_stream({"stream": "orders", "url": REDIS}, default_url=REDIS, allowed_urls=[])
    assert spec.url == ""


@pytest.mark.django_db
def test_one_run_per_consumer_group_at_a_time(services) -> None:
    doc = yaml.safe_load((TOPOLOGIES / "reference.yaml").read_text())
    spec = StreamSpec("orders-test", group="orders")
    first = create_run(topology=doc, policy={}, source=spec)
    with pytest.raises(RunError, match=f"run {first.pk} of pipeline 'reference' is reading stream"):
        create_run(topology=doc, policy={}, source=spec)
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_one_run_per_landing_folder_unless_each_keeps_its_files_with_a_checkpoint(
    services, tmp_path
) -> None:
    doc = yaml.safe_load((TOPOLOGIES / "reference.yaml").read_text())
    spec = LandingSpec(str(tmp_path), checkpoint="day-1")
    first = create_run(topology=doc, policy={}, source=spec)
    with pytest.raises(RunError, match=f"run {first.pk} of pipeline 'reference' is reading"):
        create_run(topology=doc, policy={}, source=spec)
    # Another checkpoint over the same folder, both keeping the files, is another reader
    create_run(topology=doc, policy={}, source=LandingSpec(str(tmp_path), checkpoint="audit"))
    # ...but a run without a checkpoint, or one that deletes what it merged, is not
    for other in (
        LandingSpec(str(tmp_path)),
        LandingSpec(str(tmp_path), clean="delete", checkpoint="cleaner"),
    ):
        with pytest.raises(RunError, match="one run per folder, unless each keeps its files"):
            create_run(topology=doc, policy={}, source=other)
    assert Run.objects.count() == 2


@pytest.mark.django_db
def test_run_pipeline_refuses_a_missing_landing_folder(services, tmp_path) -> None:
    with pytest.raises(CommandError, match="does not exist or is not a folder"):
        call_command(
            "run_pipeline",
            str(TOPOLOGIES / "reference.yaml"),
            "--folder",
            str(tmp_path / "nowhere"),
        )
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_stream_whose_redis_does_not_answer_is_refused_before_anything_exists(
    services, settings
) -> None:
    doc = yaml.safe_load((TOPOLOGIES / "reference.yaml").read_text())
    silent = "redis://127.0.0.1:9/0"  # the discard port: nothing answers there
    with pytest.raises(RunError, match="the stream's Redis does not answer"):
        create_run(topology=doc, policy={}, source=StreamSpec("orders", url=silent))
    assert not Run.objects.exists()
