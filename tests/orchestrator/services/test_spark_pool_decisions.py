"""The elastic Spark pool's decisions (orchestrator/services/spark_pool.py) and a placed
run's idleness (orchestrator/rescale/elastic.py), on stand-ins for the processes and
the control plane: what is started, stopped and written for each set of asks."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.rescale.elastic import Idle, newest
from orchestrator.services.spark_pool import PoolState, SparkPool, extra_wanted


@dataclass
class FakeProcess:
    code: int | None = None

    def terminate(self) -> None:
        self.code = -15

    def poll(self) -> int | None:
        return self.code


@dataclass
class FakeWorker:
    name: str
    process: subprocess.Popen[bytes] | None = None
    started: int = 0

    def start(self) -> None:
        self.started += 1
        self.process = FakeProcess()  # type: ignore[assignment]

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()


@dataclass
class FakeAsks:
    asked: dict[str, int] = field(default_factory=dict)
    written: list[PoolState] = field(default_factory=list)

    def spark_workers_asked(self) -> dict[str, int]:
        return dict(self.asked)

    def write_spark_pool(self, state: PoolState) -> None:
        self.written.append(state)


@dataclass
class FakeSupervisor:
    watched: list[FakeWorker] = field(default_factory=list)

    def watch(self, target: FakeWorker) -> None:
        self.watched.append(target)

    def forget(self, target: FakeWorker) -> None:
        self.watched.remove(target)

    def tick(self) -> None:
        """Restarts nothing: these workers never exit on their own."""


def pool(base: int = 1, maximum: int = 3) -> tuple[SparkPool, FakeAsks, FakeSupervisor]:
    asks, supervisor = FakeAsks(), FakeSupervisor()
    made = SparkPool(
        base,
        maximum,
        lambda n: FakeWorker(f"spark worker-{n}"),
        asks,
        supervisor,  # type: ignore[arg-type]
        lambda _line: None,
    )
    return made, asks, supervisor


@pytest.mark.parametrize(
    ("base", "maximum", "asked", "extra"),
    [
        (1, 1, {"7": 2}, 0),  # not elastic: the maximum is the base
        (1, 4, {}, 0),
        (1, 4, {"7": 1, "8": 1}, 2),
        (2, 4, {"7": 5}, 2),  # capped at the maximum
        (1, 4, {"7": -3}, 0),
    ],
)
def test_the_pool_runs_what_the_runs_ask_for_together_within_its_maximum(
    base: int, maximum: int, asked: dict[str, int], extra: int
) -> None:
    assert extra_wanted(base, maximum, asked) == extra


def test_an_ask_starts_a_supervised_worker_numbered_after_the_base_ones() -> None:
    spark, asks, supervisor = pool(base=2, maximum=4)
    asks.asked = {"7": 1}
    spark.tick()
    assert [w.name for w in spark.extras] == ["spark worker-3"]
    assert supervisor.watched == spark.extras
    assert asks.written[-1] == PoolState(base=2, maximum=4, extra=1)


def test_a_lower_ask_stops_the_newest_worker_which_is_no_longer_restarted() -> None:
    spark, asks, supervisor = pool(base=1, maximum=4)
    asks.asked = {"7": 2}
    spark.tick()
    first, second = spark.extras
    asks.asked = {"7": 1}
    spark.tick()
    assert spark.extras == [first]
    assert second not in supervisor.watched
    assert second.poll() == -15 and first.poll() is None
    assert asks.written[-1]["extra"] == 1


def test_the_state_is_published_every_pass_so_a_lost_session_s_znode_comes_back() -> None:
    spark, asks, _ = pool()
    for _ in range(3):
        spark.tick()
    assert len(asks.written) == 3 and len({tuple(s.values()) for s in asks.written}) == 1


def test_a_run_is_idle_once_every_instance_stays_under_the_busy_floor() -> None:
    idle = Idle(under=0.25)
    assert idle.update({"a": 0.1, "b": None}, 10.0) == 0.0
    assert idle.update({"a": 0.1, "b": 0.0}, 40.0) == 30.0
    assert idle.update({"a": 0.25, "b": 0.0}, 50.0) == 0.0  # busy again: from scratch
    assert idle.update({"a": 0.0}, 60.0) == 0.0
    assert idle.update({}, 70.0) == 0.0  # nothing measured says nothing


def test_the_newest_worker_is_the_last_registered() -> None:
    workers = {"w1": {"started": 5.0}, "w2": {"started": 9.0}, "w3": {}}
    assert newest(workers, {"w1", "w2", "w3"}) == "w2"
    assert newest(workers, {"w1", "w3"}) == "w1"


@pytest.mark.parametrize(("base", "maximum"), [(2, 1), (0, 3), (1, 17)])
def test_the_pool_process_refuses_counts_out_of_range_before_it_starts(
    base: int, maximum: int
) -> None:
    with pytest.raises(CommandError, match=r"1 <= --base <= --maximum <= 16"):
        call_command("elastic_workers", "--base", str(base), "--maximum", str(maximum))
