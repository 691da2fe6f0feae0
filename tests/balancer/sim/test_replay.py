"""A live run's replay file: read back as written, refused when it is not one."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from balancer.sim.calibration import RuntimeModel
from balancer.sim.cli import main as simulate
from balancer.sim.replay import Replay
from balancer.sim.workload import Workload
from balancer.topology import Topology
from balancer.units import MB

DOCUMENT: Any = {
    "name": "two",
    "nodes": [
        {"name": "src", "kind": "source"},
        {"name": "a", "kind": "operator", "stage": "s"},
        {"name": "b", "kind": "operator", "stage": "s"},
        {"name": "out", "kind": "sink"},
    ],
    "edges": [
        {"from": "src", "to": "a", "bandwidth_mbps": 8},
        {"from": "src", "to": "b", "bandwidth_mbps": 8},
        {"from": "a", "to": "out", "bandwidth_mbps": 1},
        {"from": "b", "to": "out", "bandwidth_mbps": 1},
    ],
}


def replay() -> Replay:
    workload = Workload(("a", "b"), MB, np.zeros(8), np.array([0, 0, 0, 1, 0, 1, 1, 0]))
    runtime = RuntimeModel(batch_fixed_s=0.2, batch_bytes_per_s=20 * MB, reductions={"a": 0.05})
    return Replay(DOCUMENT, runtime, workload)


def test_a_replay_reads_back_as_it_was_written() -> None:
    again = Replay.from_json(json.loads(json.dumps(replay().to_json())))

    assert again.runtime == replay().runtime
    assert list(again.workload.tag_index) == list(replay().workload.tag_index)
    assert again.live_bound_s() == pytest.approx(replay().live_bound_s())


def test_the_live_bound_counts_what_each_operator_sends_on() -> None:
    # a sends on 5%: its 1 Mb/s output carries 20 Mb/s of source data, so its 8 Mb/s
    # input binds; b sends on all of it: 1 Mb/s. 8 MB over 9 Mb/s of source bytes.
    bound = replay().live_bound_s()

    assert bound == pytest.approx(8 * MB / (9 * 125_000))
    assert Topology.from_document(DOCUMENT).sources() == ("src",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["workload"].update(tag_index=[0, 5]), "tag"),
        (lambda d: d["workload"].update(arrivals=[1.0, 0.0, *[0.0] * 6]), "in order"),
        (lambda d: d["workload"].update(arrivals=[]), "chunks"),
        (lambda d: d["workload"].update(packet_bytes=0), "packet_bytes"),
        (lambda d: d["workload"].update(tags=["a", "x"]), "downstreams"),
        (lambda d: d["runtime"].update(workers=0), "worker"),
        (lambda d: d["runtime"].update(reductions={"a": -1}), "reductions"),
    ],
)
def test_a_replay_that_cannot_be_is_refused(change: Any, message: str) -> None:
    data = replay().to_json()
    change(data)

    with pytest.raises(ValueError, match=message):
        Replay.from_json(data)


def test_the_simulator_names_a_broken_replay_and_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "replay.json"
    path.write_text('{"workload": {"tags": ["a"]}}')
    err = io.StringIO()

    with redirect_stderr(err):
        code = simulate(["--replay", str(path)])

    assert code == 2
    assert str(path) in err.getvalue()
