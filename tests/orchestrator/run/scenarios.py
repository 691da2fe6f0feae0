"""Small, fast variants of the reference pipeline that force the balancer to act."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from django.utils import timezone

from balancer.document import NodeDocument, PipelineDocument, emulated
from balancer.policy import Policy
from orchestrator.models import Adjustment, Event, Run, Segment
from orchestrator.pipeline.producer import FolderTarget, produce
from orchestrator.run.lifecycle import (
    create_run,
    live_workers,
    request_adjustment,
    set_status,
    snapshot,
)
from orchestrator.source.replay import write_ingested
from orchestrator.source.spec import LandingSpec
from orchestrator.tasks import start_run
from orchestrator.worker.plain_job import batch_summary
from orchestrator.zk.control_plane import ControlPlane
from tests.waiting import wait_for

TOPOLOGIES = Path(__file__).resolve().parents[3] / "webapp/console/topologies"
REFERENCE = TOPOLOGIES / "reference.yaml"
SEGMENT_MB = 0.0625  # 64 KB: many segments from a few MB, so runs stay short


def skewed_reference(*, slow_mbps: float = 2.0, buffer_mb: float = 0.5) -> PipelineDocument:
    """task1 and task2 slow, task3 unthrottled, small pools: whichever branch the skew
    favours first, a slow one fills up unless its data goes elsewhere."""
    doc: PipelineDocument = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": SEGMENT_MB}
        else:
            node["buffer_mb"] = buffer_mb if node["kind"] == "operator" else 16
        if node["name"] in {"task1", "task2"}:
            node["max_rate_mbps"] = slow_mbps
    return doc


def input_folder(settings: Any, tmp_path: Path, *, data: bool = True) -> Path:
    """A fresh input folder as the only input root (and, with ``data``, a data folder of
    the test's own, where reference tables are copied)."""
    root = tmp_path / "inputs"
    root.mkdir()
    settings.INPUT_ROOTS = [str(root)]
    if data:
        settings.DATA_DIR = tmp_path / "data"
    return root


# The flights query, per airline name and origin: the flights, the delay's figures and
# the distinct tail numbers.
FLIGHT_MEASURES: dict[str, Any] = {
    "group_by": ["name", "origin"],
    "measures": [
        {"name": "flights", "fn": "count"},
        {"name": "delayed", "fn": "count", "field": "delay"},
        {"name": "mean_delay", "fn": "avg", "field": "delay"},
        {"name": "total_delay", "fn": "sum", "field": "delay"},
        {"name": "least_delay", "fn": "min", "field": "delay"},
        {"name": "most_delay", "fn": "max", "field": "delay"},
        {"name": "tails", "fn": "count_distinct", "field": "tail"},
    ],
}


# The same query as one statement of a sql stage, over the flights that left on time or
# later (a cancelled flight has no delay and is not among them).
FLIGHTS_SQL = (
    "SELECT name, origin, count(*) AS flights, count(delay) AS delayed, "
    "avg(delay) AS mean_delay, sum(delay) AS total_delay, min(delay) AS least_delay, "
    "max(delay) AS most_delay, count(DISTINCT tail) AS tails "
    "FROM input WHERE delay IS NULL OR delay >= 0 GROUP BY name, origin"
)


AIRLINES = {"UA": "United Air Lines Inc.", "AA": "American Airlines Inc.", "B6": "JetBlue Airways"}
T0 = 1_790_000_040  # the flights' event times count from here, a minute's start


def write_flights(path: Path, records: int, *, seed: int, per_second: int | None = None) -> None:
    """Flights of the three :data:`AIRLINES` and of one an airlines table lacks (ZZ: an
    inner join drops them), a malformed line now and then; with ``per_second``, departing
    that many a second (event time ``t``, epoch seconds from :data:`T0`, up to 4 s out
    of order)."""
    rng = random.Random(seed)
    carriers = [*AIRLINES, "ZZ"]
    with path.open("w") as out:
        for i in range(records):
            if i % 997 == 0:
                out.write("not json\n")
                continue
            flight = {
                "carrier": rng.choice(carriers),
                "origin": rng.choice(["JFK", "LGA", "EWR"]),
                # a cancelled flight has no delay: counted, not averaged
                "delay": None if i % 13 == 0 else round(rng.uniform(-20, 300), 1),
                "tail": f"N{rng.randrange(400)}",
            }
            if per_second is not None:
                flight["t"] = T0 + i // per_second - rng.randrange(5)
            out.write(json.dumps(flight) + "\n")


def airlines_table(path: Path, names: dict[str, str]) -> None:
    path.write_text("carrier,name\n" + "".join(f"{c},{n}\n" for c, n in names.items()))


def _flights_source(schema: str) -> NodeDocument:
    """A source of flights (JSON lines of ``schema``), routed by carrier, cut small."""
    return {
        "name": "source",
        "kind": "source",
        "operator": "read",
        "params": {
            "format": "jsonl",
            "route_by": "carrier",
            "segment_mb": SEGMENT_MB,
            "schema": schema,
        },
    }


def joined_flights(
    reference: str | None = "airlines.csv",
    *,
    grouped: bool = False,
    sql: str | None = None,
    **join: Any,
) -> PipelineDocument:
    """Flights (carrier, origin, delay, tail) joined with an airlines table on the
    carrier, then aggregated per airline name: the delay's figures and the distinct
    tail numbers (``grouped``: the measures of :data:`FLIGHT_MEASURES`, per name and
    origin; ``sql``: a sql stage's statement instead). ``join`` changes the join node's
    parameters; ``reference`` None reads no file (give ``table`` and ``database``)."""
    params = {"on": ["carrier"], "columns": ["name"], **join}
    aggregate = (
        FLIGHT_MEASURES if grouped else {"key": "name", "value": "delay", "distinct": "tail"}
    )
    if reference is not None:
        params["reference"] = reference
    return {
        "name": "flights-by-airline",
        "nodes": [
            _flights_source("carrier string, origin string, delay double, tail string"),
            {"name": "enrich", "kind": "operator", "operator": "join", "params": params},
            *[
                NodeDocument(
                    name=f"agg{i}",
                    kind="operator",
                    stage="agg",
                    operator="aggregate" if sql is None else "sql",
                    params=aggregate if sql is None else {"statement": sql},
                    buffer_mb=1.0,
                )
                for i in (1, 2)
            ],
            {"name": "output", "kind": "sink", "operator": "merge"},
        ],
        "edges": [
            {"from": "source", "to": "enrich"},
            {"from": "enrich", "to": "agg1"},
            {"from": "enrich", "to": "agg2"},
            {"from": "agg1", "to": "output"},
            {"from": "agg2", "to": "output"},
        ],
    }


def running_totals(**changes: Any) -> PipelineDocument:
    """The keyed running-totals pipeline (state per key, two instances), small segments,
    ``changes`` on its operators."""
    doc: PipelineDocument = yaml.safe_load((TOPOLOGIES / "running-totals.yaml").read_text())
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": SEGMENT_MB}
        elif node["kind"] == "operator":
            node.update(changes)  # type: ignore[typeddict-item]
    return doc


def policy(**changes: Any) -> dict[str, Any]:
    defaults = {
        "routing": "static",
        "migration": "pressure",
        "throttling": "watermark",
        "tick_ms": 200,
    }
    return Policy.from_mapping({**defaults, **changes}).to_dict()


def start(doc: PipelineDocument, values: dict[str, Any], **inputs: Any) -> Run:
    run = create_run(topology=doc, policy=values, **inputs)
    start_run(run)
    return run


def wait_until_done(run: Run, timeout_s: float = 240.0) -> Run:
    """The run once it ended, and no batch of it still runs: a batch that began before
    a run failed or was stopped still completes (a transaction on the ledger), and the
    test's database flush had deadlocked with one (seen once in CI)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if not run.is_active:
            _wait_for_its_batches(run, until=deadline)
            return run
        time.sleep(0.5)
    raise AssertionError(
        f"run {run.pk} still {run.status} after {timeout_s} s{_left(run)}{_sessions()}"
    )


def _wait_for_its_batches(run: Run, *, until: float) -> None:
    def held() -> bool:
        live = Segment.objects.filter(run=run, state="claimed", lease_expires__gt=timezone.now())
        return live.exists()

    while held() and time.monotonic() < until:
        time.sleep(0.2)


def wait_started(run: Run) -> None:
    deadline = time.monotonic() + 120
    while not Segment.objects.filter(run=run, state="done", marker=False).exists():
        assert time.monotonic() < deadline, "the run never processed a segment"
        time.sleep(0.1)


def adjust_and_wait(run: Run, command: str, timeout_s: float = 90.0, **target: str) -> Adjustment:
    """Ask for an adjustment and wait until it ends; returns it."""
    known = set(Adjustment.objects.filter(run=run).values_list("pk", flat=True))
    request_adjustment(run.pk, command, **target)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = Adjustment.objects.filter(run=run).exclude(pk__in=known).first()
        if new is not None and new.status != Adjustment.Status.RUNNING:
            # The adjustment's timeline, shown by pytest when a test fails.
            for e in Event.objects.filter(run=run, time__gte=new.started_at).order_by("time", "id"):
                print(e.time.strftime("%H:%M:%S.%f")[:-3], e.kind, e.node, e.reason[:160])
            return new
        refused = Event.objects.filter(run=run, kind="adjust_refused").first()
        assert refused is None, refused.reason
        time.sleep(0.1)
    raise AssertionError(f"{command} {target} did not end within {timeout_s} s")


def deduplicated_flights() -> PipelineDocument:
    """Flights with their ids, redelivered ones dropped by a deduplicate stage (``once``,
    slowed so that a test can act while it runs), then counted per carrier and origin."""
    measures = [
        {"name": "flights", "fn": "count"},
        {"name": "total_delay", "fn": "sum", "field": "delay"},
        {"name": "most_delay", "fn": "max", "field": "delay"},
    ]
    return {
        "name": "flights-once",
        "nodes": [
            _flights_source("id string, carrier string, origin string, delay double"),
            {
                "name": "once",
                "kind": "operator",
                "operator": "deduplicate",
                "params": {"fields": ["id"]},
                "max_rate_mbps": 2.0,  # long enough a run for what follows
            },
            {
                "name": "agg",
                "kind": "operator",
                "operator": "aggregate",
                "params": {"group_by": ["carrier", "origin"], "measures": measures},
            },
            {"name": "output", "kind": "sink", "operator": "merge"},
        ],
        "edges": [
            {"from": "source", "to": "once"},
            {"from": "once", "to": "agg"},
            {"from": "agg", "to": "output"},
        ],
    }


def driver_pid(run: Run, services: Any) -> int | None:
    """The process holding the run's driver lock (a control worker), if any."""
    with ControlPlane.connect(services.zk_hosts) as control:
        holder = control.driver_holder(str(run.pk))
    return int(holder.split(":")[1]) if holder else None


def kill_a_batch_and_hot_migrate(run: Run, workers: Any, node: str) -> None:
    """SIGKILL the Spark worker's pool children while a batch of ``run`` is claimed, then
    hot-migrate ``node`` once the run is running, and wait for the migration's end."""
    claimed = Segment.objects.filter(run=run, state="claimed")
    wait_for("a batch of the run claimed", claimed.exists, timeout_s=60, every_s=0.05)
    children = psutil.Process(workers.processes["spark1"].pid).children()
    assert children, "the Spark worker has no pool process to kill"
    for child in children:
        child.send_signal(signal.SIGKILL)
    wait_started(run)
    migrated = adjust_and_wait(run, "hot_migrate", node=node)
    assert migrated.status == "complete", migrated.outcome


def kill_a_batch_and_the_driver(run: Run, workers: Any, services: Any) -> str:
    """SIGKILL the Spark worker's pool child while it holds a batch of ``run``, then the
    control worker running the run's driver; returns the killed control worker's name."""
    deadline = time.monotonic() + 120
    while not Segment.objects.filter(run=run, state="claimed").exists():
        assert time.monotonic() < deadline, "no batch was ever claimed"
        time.sleep(0.05)
    for child in psutil.Process(workers.processes["spark1"].pid).children():
        child.send_signal(signal.SIGKILL)
    return kill_the_driver(run, workers, services)


def kill_the_driver(run: Run, workers: Any, services: Any) -> str:
    """SIGKILL the control worker running ``run``'s driver; returns its name."""
    pid = wait_for(f"run {run.pk}'s driver", lambda: driver_pid(run, services), timeout_s=60)
    victim: str = next(name for name, p in workers.processes.items() if p.pid == pid)
    os.kill(pid, signal.SIGKILL)
    return victim


def stop_once_caught_up(
    run: Run, producer: threading.Thread, timeout_s: float = 120, *, needs_takeover: bool = True
) -> Run:
    """Stop an unbounded run once the producer is done, a new driver took over from the killed
    one (``needs_takeover``), and its live view shows nothing waiting outside it."""
    producer.join(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while needs_takeover and Event.objects.filter(run=run, kind="driver").count() < 2:
        assert time.monotonic() < deadline, "no driver took over from the killed one"
        time.sleep(0.5)
    while True:
        lag = snapshot(run.pk)["source"]["lag"]
        if lag is not None and lag["entries"] == 0:
            break
        assert time.monotonic() < deadline, f"the run never caught up: {lag}"
        time.sleep(0.5)
    set_status(run.pk, "stopping", reason="test: the producer is done")
    return wait_until_done(run, timeout_s=timeout_s)


def completes_like_the_batch_job(run: Run, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait for the run to end; it must have completed, exact and equal to the plain
    batch job over the same input. Returns the run's summary."""
    from orchestrator.ledger.results import summary
    from orchestrator.worker.plain_job import batch_summary

    doc = run.topology
    run = wait_until_done(run, timeout_s=timeout_s)
    result = summary(run)
    expected = batch_summary(topology=doc, input_path=run.input_spec["paths"], generator=None)
    assert result["status"] == "completed", result["error"]
    assert result["coverage"] == "exact"
    assert result["rows"] == expected["rows"]
    return result


def _left(run: Run) -> str:
    """The data still unfinished, the instances and the adjustments of a stuck run."""
    from django.db.models import Count

    from orchestrator.models import Adjustment, Instance, Segment

    unfinished = (
        Segment.objects.filter(run=run)
        .exclude(state="done")
        .values("node", "state", "marker", "config")
        .annotate(n=Count("id"))
    )
    instances = Instance.objects.filter(run=run).values_list("name", "status", "config", "target")
    adjustments = Adjustment.objects.filter(run=run).values_list("version", "kind", "status")
    return (
        f"\n unfinished: {list(unfinished)}\n instances: {list(instances)}"
        f"\n adjustments: {list(adjustments)}"
    )


def _sessions() -> str:
    """What every other PostgreSQL session is doing or waiting for: a stuck run's
    first clue, in the failure message."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 160)"
            " FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()"
        )
        rows = cursor.fetchall()
    return "".join(f"\n  {row}" for row in rows)


def landed_at_once(folder: Path, *, mb: float, seed: int, file_kb: int) -> LandingSpec:
    """``mb`` of skewed records written into ``folder`` before the run starts (nothing
    lands after): a continuous run over it reads them, then goes on with nothing new."""
    folder.mkdir(parents=True, exist_ok=True)
    produce(
        FolderTarget(folder),
        rate_bps=64 * 1024 * 1024,
        pattern="skewed",
        duration_s=None,
        max_bytes=int(mb * 1024 * 1024),
        seed=seed,
        file_bytes=file_kb * 1024,
        branches=("task1", "task2", "task3"),
    )
    return LandingSpec(str(folder), stable_s=0)


def stepwise_slowed(*, output_mbps: float) -> tuple[PipelineDocument, dict[str, Any]]:
    """Slow branches behind an output slower still, under stepwise backpressure: the
    branches fill past the overload and slow the source."""
    doc = skewed_reference(slow_mbps=3.0)
    for node in doc["nodes"]:
        if node["kind"] == "sink":
            node["max_rate_mbps"] = output_mbps
    values = policy(
        migration="off",
        throttling="stepwise",
        overload_mb=0.25,
        underload_kb=64,
        sensitivity_ms=400,
    )
    return doc, values


def unemulated_reference() -> PipelineDocument:
    """The reference pipeline with no link bandwidth and no node rate anywhere."""
    doc: PipelineDocument = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    for node in doc["nodes"]:
        node.pop("max_rate_mbps", None)
        if node["kind"] == "operator":
            node["buffer_mb"] = 4
    for edge in doc["edges"]:
        edge["bandwidth_mbps"] = 0
    assert not emulated(doc)
    return doc


def two_branches() -> PipelineDocument:
    """The unemulated reference with two branches, task1 and task2: on two workers each
    runs on a resource of its own."""
    doc = unemulated_reference()
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != "task3"]
    doc["edges"] = [e for e in doc["edges"] if "task3" not in (e["from"], e["to"])]
    for node in doc["nodes"]:
        if node["kind"] == "source":
            node["params"] = {**node["params"], "segment_mb": SEGMENT_MB}
    return doc


def wait_for_spark_workers(*prefixes: str) -> list[str]:
    """The live Spark workers once they are exactly those named ``prefixes``: a worker
    an earlier test killed stays registered until ZooKeeper expires its session."""

    def exactly() -> list[str] | None:
        names = sorted(live_workers())
        wanted = len(names) == len(prefixes) and all(
            any(n.startswith(f"{p}-") for n in names) for p in prefixes
        )
        return names if wanted else None

    return wait_for(
        f"the live Spark workers exactly {list(prefixes)}",
        exactly,
        timeout_s=90,
        detail=lambda: f"they are {sorted(live_workers())}",
    )


def plain_rows_over_intake(run: Run, doc: PipelineDocument, folder: Path) -> list[Any]:
    """The plain Spark job's rows over what an unbounded run took in (its records
    written again, in the order it read them, into ``folder``)."""
    taken = folder / "ingested.jsonl"
    write_ingested(run, taken)
    rows: list[Any] = batch_summary(topology=doc, input_path=str(taken), generator=None)["rows"]
    return rows
