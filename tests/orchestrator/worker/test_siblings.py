"""Siblings in one job: a batch takes what has arrived at the other instances of its
stage that the graph lets one Spark job run with it, and every chunk still reaches the
sink once, as its own node's output. On the real PostgreSQL and Spark."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Instance, Run, Segment
from orchestrator.pipeline.graph import RunGraph
from orchestrator.worker.batch import process_batch
from tests.orchestrator.runs import (
    TOPOLOGIES,
    merged_partials,
    pending_run,
    queue_segments,
    records_file,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _queue(run: Run, tmp_path: Path, chunks: dict[str, range]) -> None:
    """Each node's chunks queued at it, a file of ten records and a bad line each."""
    for node, numbers in chunks.items():
        paths = [records_file(tmp_path / f"in{n}.jsonl", range(n * 5, n * 5 + 10)) for n in numbers]
        queue_segments(run, paths, node, first=numbers.start)


def test_a_batch_takes_its_siblings_data_into_one_job_and_each_chunk_goes_on_once(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path / "data"
    run = pending_run("reference")
    # Four chunks: the most a batch takes on a new JVM (NEW_JVM_BATCH_SEGMENTS).
    _queue(run, tmp_path, {"task1": range(2), "task2": range(2, 3), "task3": range(3, 4)})

    report = process_batch(run.pk, "task1", None, siblings={"task2": {}, "task3": {}})

    assert (report.segments, report.malformed, report.fused) == (4, 4, ("task2", "task3"))
    inputs = Segment.objects.filter(run=run, upstream="source")
    # One claim, one completion: every input done under the batch's one owner...
    assert {(s.state, s.lease_owner) for s in inputs} == {
        (Segment.State.DONE, inputs[0].lease_owner)
    }
    # ...and each chunk goes on once, as the output of the node it was queued at.
    outputs = list(Segment.objects.filter(run=run, node="output").order_by("chunk"))
    assert [(s.chunk, s.upstream) for s in outputs] == [
        (0, "task1"),
        (1, "task1"),
        (2, "task2"),
        (3, "task3"),
    ]
    # One partial per key for the whole job, whichever node's output holds it.
    assert sorted(Path(s.path).stat().st_size > 0 for s in outputs) == [False] * 3 + [True]
    merged = merged_partials(outputs)
    records = Counter(k for n in range(4) for k in range(n * 5, n * 5 + 10))
    assert merged == {
        f"k{k}": (count, k * count, (f"u{k % 3}",)) for k, count in sorted(records.items())
    }


def test_a_sibling_the_driver_did_not_name_or_that_is_aligning_keeps_its_data(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path / "data"
    run = pending_run("reference")
    _queue(run, tmp_path, {"task1": range(1), "task2": range(1, 2), "task3": range(2, 3)})
    # task2 takes part in a hot rescale: its data waits for its own alignment.
    Instance.objects.filter(run=run, name="task2").update(target=2)

    _queue(run, tmp_path, {"output": range(3, 4)})
    # task3 is not named: the driver placed it on a worker of its own. A name that is
    # no sibling (the sink, a node the run does not have) gives a batch nothing.
    report = process_batch(
        run.pk, "task1", None, siblings={"task2": {}, "output": {}, "../task9": {}}
    )

    assert (report.segments, report.fused) == (1, ())
    assert dict(
        Segment.objects.filter(run=run, upstream="source").values_list("node", "state")
    ) == {"task1": "done", "task2": "queued", "task3": "queued", "output": "queued"}


def _reference() -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load((TOPOLOGIES / "reference.yaml").read_text())
    return doc


def _fusable(doc: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    graph = RunGraph.build(doc)  # type: ignore[arg-type]
    return {name: graph.fusable_with(name) for name in graph.nodes}


@pytest.mark.django_db(transaction=False)
def test_siblings_are_the_stage_s_instances_of_one_stateless_operator_alike() -> None:
    doc = _reference()
    assert _fusable(doc) == {
        "source": (),
        "task1": ("task2", "task3"),
        "task2": ("task1", "task3"),
        "task3": ("task1", "task2"),
        "output": (),
    }
    # Other parameters: another job.
    other = copy.deepcopy(doc)
    other["nodes"][3]["params"]["distinct"] = "session"
    assert _fusable(other)["task1"] == ("task2",)
    # An emulated rate of its own: its batches are its own, paced.
    paced = copy.deepcopy(doc)
    paced["nodes"][1]["max_rate_mbps"] = 10
    assert _fusable(paced)["task1"] == ()
    assert _fusable(paced)["task2"] == ("task3",)
    # A keyed stage's state is per instance; windows carry each chunk's watermark.
    keyed = copy.deepcopy(doc)
    for node in keyed["nodes"][1:4]:
        node["operator"] = "running"
        node["params"] = {"key": "key", "value": "value"}
    assert _fusable(keyed)["task1"] == ()
    windowed = copy.deepcopy(doc)
    for node in windowed["nodes"][1:4]:
        node["params"].update({"window_s": 10, "event_time": "ts"})
    assert _fusable(windowed)["task1"] == ()
