"""``make run``'s Spark workers: ``BPCONSOLE_SPARK_WORKERS`` of them, each a Celery worker
with one pool process (and so a Spark JVM of its own, docs/adr/0007), refused before
anything starts when the setting is not a count; and the Spark task sizes a batch reads,
refused at the same moment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.services.embedded import ServiceError
from orchestrator.services.launcher import PROJECT_ROOT
from orchestrator.services.runconsole import (
    MAX_SPARK_WORKERS,
    check_spark_settings,
    spark_worker_count,
    spark_worker_maximum,
    spark_workers,
)


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_one_spark_worker_unless_told_otherwise() -> None:
    assert spark_worker_count({}) == 1
    assert spark_worker_count({"BPCONSOLE_SPARK_WORKERS": "3"}) == 3
    assert spark_worker_count({"BPCONSOLE_SPARK_WORKERS": str(MAX_SPARK_WORKERS)}) == 16


@pytest.mark.parametrize(
    "raw", ["0", "17", "100000", "9" * 5000, "-1", "two", "", " 2", "2.0", "²", "\uff11"]
)
def test_a_count_that_is_not_one_to_sixteen_is_refused_and_says_so(raw: str) -> None:
    with pytest.raises(ServiceError, match=r"BPCONSOLE_SPARK_WORKERS=.*from 1 to 16"):
        spark_worker_count({"BPCONSOLE_SPARK_WORKERS": raw})


def test_the_elastic_maximum_is_the_base_unless_told_otherwise() -> None:
    assert spark_worker_maximum({}, 2) == 2
    assert spark_worker_maximum({"BPCONSOLE_SPARK_WORKERS_MAX": "5"}, 2) == 5


@pytest.mark.parametrize("raw", ["1", "17", "9" * 5000, "-3", "four", "", "3.5"])
def test_a_maximum_below_the_base_or_past_sixteen_is_refused_and_says_so(raw: str) -> None:
    with pytest.raises(ServiceError, match=r"BPCONSOLE_SPARK_WORKERS_MAX=.*\(2\) to 16"):
        spark_worker_maximum({"BPCONSOLE_SPARK_WORKERS_MAX": raw}, 2)


def test_each_spark_worker_is_a_pool_of_one_with_its_own_name_and_log(tmp_path: Path) -> None:
    workers = spark_workers(3, "python", {}, tmp_path)
    # Three Celery workers on the spark queue, none started yet
    assert len(workers) == 3
    assert all(w.process is None for w in workers)
    assert all(_option(w.args, "-Q") == "spark" for w in workers)
    # One pool process each, so each main process keeps a JVM for one process: a JVM
    # killed stops one worker's batches, not every worker's
    assert all(_option(w.args, "--concurrency") == "1" for w in workers)
    # Two workers of one node name are one to Celery's pings and control commands;
    # their logs stay apart too
    assert [_option(w.args, "-n") for w in workers] == ["spark@%h", "spark-2@%h", "spark-3@%h"]
    assert [w.log.name for w in workers] == [
        "celery-spark.log",
        "celery-spark-2.log",
        "celery-spark-3.log",
    ]
    assert len({w.name for w in workers}) == 3


@pytest.mark.parametrize(
    ("name", "raw"),
    [("BPCONSOLE_SPARK_TASK_MB", "8 MB"), ("BPCONSOLE_SPARK_ONE_TASK_MB", "-1")],
)
def test_a_wrong_spark_task_size_stops_make_run_before_anything_starts(
    tmp_path: Path, name: str, raw: str
) -> None:
    # Given make run's console with one Spark task size that is not a number of MB
    env = {
        **os.environ,
        "BPCONSOLE_VAR_DIR": str(tmp_path / "var"),
        "BPCONSOLE_DEMO": "0",
        name: raw,
    }
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.services.runconsole"],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it says which setting and what it must be, and starts nothing
    assert done.returncode == 1
    assert f"error: {name}={raw!r}: a number of MB from 0 to 1024" in done.stderr
    assert "services up" not in done.stdout
    assert not (tmp_path / "var" / "postgresql").exists()


def test_the_spark_task_sizes_unset_or_in_range_are_accepted() -> None:
    check_spark_settings({})
    check_spark_settings({"BPCONSOLE_SPARK_TASK_MB": "16", "BPCONSOLE_SPARK_ONE_TASK_MB": "0"})
