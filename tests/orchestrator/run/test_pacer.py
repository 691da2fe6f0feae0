"""The source sends a slice's chunks into the ledger together: every chunk it sent is
there, with the source's position after the last, in one transaction; a chunk that
cannot be written leaves the ones before it in the ledger and the position after them.
On the real PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from balancer.units import MB
from orchestrator.models import Run, Segment
from orchestrator.pipeline.graph import balancer_topology
from orchestrator.pipeline.inputs import Chunk, InputError, write_chunk
from orchestrator.pipeline.routes import Routes
from orchestrator.run import pacer as pacer_module
from orchestrator.run.controls import Controls
from orchestrator.run.lifecycle import create_run
from orchestrator.run.pacer import SourcePacer, source_graph
from orchestrator.run.route_store import RouteStore
from tests.orchestrator.run.scenarios import skewed_reference

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LINES = '{"key":"a","value":1,"user":"u"}\n' * 10


def pacer_over(folder: Path, files: int) -> tuple[Run, SourcePacer]:
    for index in range(files):
        (folder / f"in{index}.jsonl").write_text(LINES)
    doc = skewed_reference(buffer_mb=64)
    run = create_run(topology=doc, policy={}, input_path=str(folder / "*.jsonl"))
    source = next(node for node in doc["nodes"] if node["kind"] == "source")
    # The routes live in ZooKeeper; a pacer only reads them, and none are set here.
    pacer = SourcePacer(run, run.epoch, source, Controls(), RouteStore(None, str(run.pk)))  # type: ignore[arg-type]
    pacer.reconfigure(balancer_topology(doc), source_graph(run.topology, 0, source["name"]))
    return run, pacer


def run_updates(queries: CaptureQueriesContext) -> int:
    return sum('UPDATE "orchestrator_run"' in q["sql"] for q in queries.captured_queries)


def test_a_slices_chunks_enter_the_ledger_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacer_module, "SEND_SLICE_S", 30.0)
    run, pacer = pacer_over(tmp_path, 5)
    with CaptureQueriesContext(connection) as queries:
        assert pacer.emit(time.monotonic()) is False  # everything was sent
    # One move of the source's position for the five chunks (finish_source is another)
    assert run_updates(queries) == 2
    assert sorted(Segment.objects.filter(run=run).values_list("chunk", flat=True)) == list(range(5))
    run.refresh_from_db()
    assert run.source_position["chunk"] == 5
    assert run.input_bytes == 5 * len(LINES)
    assert run.chunks_total == 5


def test_a_chunk_that_cannot_be_written_leaves_the_ones_before_it_in_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacer_module, "SEND_SLICE_S", 30.0)
    run, pacer = pacer_over(tmp_path, 4)

    def written_but_the_third(path: Path, chunk: Chunk) -> int:
        if chunk.index == 2:
            raise InputError(f"{chunk.path}: changed since it was measured")
        return write_chunk(path, chunk)

    monkeypatch.setattr(pacer_module, "write_chunk", written_but_the_third)
    with pytest.raises(InputError, match=r"in2\.jsonl"):
        pacer.emit(time.monotonic())
    assert sorted(Segment.objects.filter(run=run).values_list("chunk", flat=True)) == [0, 1]
    run.refresh_from_db()
    assert (run.source_position["chunk"], run.source_position["file"]) == (2, 1)
    assert run.input_bytes == 2 * len(LINES)
    assert run.chunks_total is None


def test_a_chunk_its_full_branch_refuses_goes_where_the_balancer_migrates_that_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacer_module, "SEND_SLICE_S", 30.0)
    run, pacer = pacer_over(tmp_path, 3)
    branches = pacer.graph.downstreams
    full = 64 * MB  # each branch's pool (skewed_reference(buffer_mb=64))

    # Every pool full, nothing migrating: the source waits, its chunk's branch blocked.
    pacer.pool = dict.fromkeys(branches, full)
    assert pacer.emit(time.monotonic()) is False
    (heavy,) = pacer.take_blocked()
    assert not Segment.objects.filter(run=run).exists()

    # The balancer moves 30% of the heavy branch's data to another, which has room: what
    # the heavy branch's full pool refuses goes there too, instead of holding the source.
    light = next(b for b in branches if b != heavy)
    pacer.pool = {heavy: full}
    pacer.routes.set(pacer.name, Routes(migrations={heavy: {light: 0.3}}))
    assert pacer.emit(time.monotonic()) is False  # everything was sent
    sent = list(Segment.objects.filter(run=run).values_list("node", "migrated_from"))
    assert sent == [(light, heavy)] * 3
    assert pacer.take_blocked() == {}
