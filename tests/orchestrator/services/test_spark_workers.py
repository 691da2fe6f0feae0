"""``make run``'s Spark workers: ``BPCONSOLE_SPARK_WORKERS`` of them, each a Celery worker
with one pool process (and so a Spark JVM of its own, docs/adr/0007), refused before
anything starts when the setting is not a count."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.services.embedded import ServiceError
from orchestrator.services.runconsole import MAX_SPARK_WORKERS, spark_worker_count, spark_workers


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
