"""The settings of an operator batch's task sizes: MB from 0 to 1024, anything else
refused with the setting's name; a batch cut into tasks of equal input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkjobs.task_settings import TASK, even_split_bytes, mb_setting, task_bytes

NAME = "BPCONSOLE_SPARK_ONE_TASK_MB"
MB = 2**20


def test_unset_is_the_default_and_a_number_of_mb_is_read_in_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert mb_setting(NAME, 4) == 4 * 2**20
    monkeypatch.setenv(NAME, "0.5")
    assert mb_setting(NAME, 4) == 2**19
    monkeypatch.setenv(NAME, "0")
    assert mb_setting(NAME, 4) == 0


@pytest.mark.parametrize(
    "raw", ["", "abc", "-1", "1025", "nan", "inf", "1e308", "4 MB", "9" * 5000]
)
def test_anything_else_is_refused_with_the_setting_s_name(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=f"^{NAME}=.*: a number of MB from 0 to 1024$") as error:
        mb_setting(NAME, 4)
    assert len(str(error.value)) < 120, "a long value is shown cut"


def test_the_default_task_bound_is_spark_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TASK, raising=False)
    assert task_bytes() == 128 * MB


def spark_tasks(sizes: list[int], bound: int, open_cost: int) -> list[list[int]]:
    """The pieces of input (bytes) of each task Spark makes of files of ``sizes`` under
    ``bound`` with ``spark.sql.files.minPartitionNum`` 1, as the operator session sets
    it (FilePartition.maxSplitBytes and getFilePartitions, Spark 4: files split at the
    bound, largest first, packed next-fit counting ``open_cost`` per piece)."""
    split = min(bound, max(open_cost, sum(size + open_cost for size in sizes)))
    pieces = sorted(
        (min(split, size - start) for size in sizes for start in range(0, size, split)),
        reverse=True,
    )
    tasks: list[list[int]] = []
    for piece in pieces:
        if not tasks or sum(p + open_cost for p in tasks[-1]) + piece > split:
            tasks.append([])
        tasks[-1].append(piece)
    return tasks


@pytest.mark.parametrize(
    ("sizes_mb", "tasks"),
    [
        ([8] * 60, 4),  # 480 MB: two rounds of tasks on two cores, none over 128 MB
        ([8] * 64, 6),  # 512 MB and the ends of lines: three rounds
        ([8] * 20 + [3], 2),  # 163 MB: a task per core
        ([8] * 45, 4),  # 360 MB: the batch Spark's default cut in three
        ([500], 4),  # one large file, cut into equal pieces
        ([1] * 7, 2),
        ([8, 8, 8], 2),
    ],
)
def test_a_batch_is_cut_into_tasks_a_multiple_of_the_cores_none_much_over_its_share(
    sizes_mb: list[float], tasks: int
) -> None:
    sizes = [int(mb * MB) + 101 for mb in sizes_mb]  # a segment ends at a line's end
    open_cost = 4 * MB
    bound = even_split_bytes(sizes, cores=2, most=128 * MB, open_cost=open_cost)
    made = spark_tasks(sizes, bound, open_cost=open_cost)
    assert len(made) == tasks
    assert sum(map(sum, made)) == sum(sizes)
    # Counted as Spark counts (a file's opening as bytes), no task holds more than an
    # equal share and one more file.
    weights = [sum(p + open_cost for p in task) for task in made]
    share = sum(size + open_cost for size in sizes) / tasks
    assert max(weights) <= share + max(sizes) + 2 * open_cost


def test_no_bound_is_a_task_per_core() -> None:
    sizes = [8 * MB] * 256
    bound = even_split_bytes(sizes, cores=2, most=0, open_cost=4 * MB)
    assert len(spark_tasks(sizes, bound, open_cost=4 * MB)) == 2


@pytest.mark.parametrize("sizes_kb", [[1536] * 7, [9000], [3000, 700, 700, 2500, 100]])
def test_spark_makes_the_tasks_the_split_was_planned_for(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes_kb: list[int]
) -> None:
    from sparkjobs.records import read_records
    from sparkjobs.session import OPEN_COST_BYTES, operator_session

    monkeypatch.setenv(TASK, "4")  # small files, several rounds of tasks
    line = b'{"key":"k","value":1,"user":"u","pad":"' + b"x" * 60 + b'"}\n'
    files = []
    for index, kb in enumerate(sizes_kb):
        path = tmp_path / f"seg{index}.jsonl"
        path.write_bytes(line * (kb * 1024 // len(line)))
        files.append(path)
    sizes = [path.stat().st_size for path in files]
    session = operator_session(sizes)
    frame = read_records(
        session, [str(p) for p in files], strings=["key", "user"], numbers=[], keys=["key"]
    )
    planned = even_split_bytes(
        sizes, cores=session.sparkContext.defaultParallelism, most=4 * MB, open_cost=OPEN_COST_BYTES
    )
    assert frame.rdd.getNumPartitions() == len(spark_tasks(sizes, planned, OPEN_COST_BYTES))


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_segment_split_across_tasks_gives_each_record_once(
    spark: Any, tmp_path: Path, suffix: str
) -> None:
    from sparkjobs.records import MALFORMED_COL, read_records
    from sparkjobs.session import operator_session

    # One segment of 6 MB: larger than a core's share of it and its opening, so Spark
    # reads it in two pieces; a CSV segment's header line is its first piece's only.
    records = 60_000
    path = tmp_path / f"seg0{suffix}"
    if suffix == ".csv":
        lines = [
            "key,value,user,pad",
            *(f"k{i % 7},{i},u{i % 13},{'x' * 90}" for i in range(records)),
        ]
    else:
        lines = [
            f'{{"key":"k{i % 7}","value":{i},"user":"u{i % 13}","pad":"{"x" * 70}"}}'
            for i in range(records)
        ]
    path.write_text("\n".join(lines) + "\n")
    session = operator_session([path.stat().st_size])
    frame = read_records(
        session, [str(path)], strings=["key", "user"], numbers=["value"], keys=["key"]
    )
    assert frame.rdd.getNumPartitions() == 2
    counts = {
        row[MALFORMED_COL]: row["count"] for row in frame.groupBy(MALFORMED_COL).count().collect()
    }
    assert counts == {False: records}
    assert frame.agg({"value": "sum"}).collect()[0][0] == sum(range(records))
