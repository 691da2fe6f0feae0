"""What an operator batch leaves for its downstream, on the real PostgreSQL and Spark: an
aggregator's batch sent to one place leaves one partial per key, held by one of its
segments' outputs, while every segment's output still goes on, so every chunk reaches
the sink once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models import Segment
from orchestrator.worker.batch import process_batch
from tests.orchestrator.runs import merged_partials, pending_run, queue_segments, records_file

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_aggregator_batch_sent_to_one_place_leaves_one_partial(
    spark: Any, settings: Any, tmp_path: Path
) -> None:
    settings.DATA_DIR = tmp_path / "data"
    run = pending_run("reference")
    paths = [records_file(tmp_path / f"in{n}.jsonl", range(n * 5, n * 5 + 10)) for n in range(4)]
    ids = queue_segments(run, paths)

    report = process_batch(run.pk, "task1", None)

    assert (report.segments, report.malformed) == (4, 4)
    outputs = list(Segment.objects.filter(run=run, node="output").order_by("chunk"))
    # Every chunk goes on to the sink, each once...
    assert [(s.chunk, s.upstream) for s in outputs] == [(n, "task1") for n in range(4)]
    # ...one of them holding the batch's partials, the others empty.
    sizes = [Path(s.path).stat().st_size for s in outputs]
    assert sorted(size > 0 for size in sizes) == [False, False, False, True]
    assert [s.bytes for s in outputs] == sizes
    merged = merged_partials(outputs)
    records = Counter(k for n in range(4) for k in range(n * 5, n * 5 + 10))
    assert merged == {
        f"k{k}": (count, k * count, (f"u{k % 3}",)) for k, count in sorted(records.items())
    }
    # Malformed lines stay with the segments they came from.
    assert dict(Segment.objects.filter(pk__in=ids).values_list("pk", "malformed")) == {
        i: 1 for i in ids
    }


def test_a_shared_output_is_named_for_the_segments_that_share_it(settings: Any) -> None:
    # A batch may be claimed again differently (a worker whose lease ran out, still
    # running beside the one that took its segments over): a shared output's name
    # says which segments it holds, so two claims never write one file, and a segment
    # alone keeps the output named for it alone, the same bytes on every attempt.
    from orchestrator.worker.batch import _output_paths

    rows = {f"f{n}": Segment(id=f"s{n}", node="task1") for n in range(3)}
    alone = _output_paths(7, rows, {})
    first = _output_paths(7, rows, {"f0": "f0", "f1": "f0", "f2": "f0"})
    second = _output_paths(7, {k: rows[k] for k in ("f0", "f1")}, {"f0": "f0", "f1": "f0"})
    assert [p.name for p in alone.values()] == [
        "s0.task1.jsonl",
        "s1.task1.jsonl",
        "s2.task1.jsonl",
    ]
    assert len(set(first.values()) | set(second.values()) | set(alone.values())) == 8
    assert first == _output_paths(7, rows, {"f0": "f0", "f1": "f0", "f2": "f0"})
