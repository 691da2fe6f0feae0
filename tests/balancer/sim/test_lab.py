"""The policy lab's simulation: every arm on one replay, each with its completion curve
against the live bound, and the process the console runs it in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from balancer.sim.control import BENCHMARK_POLICIES
from balancer.sim.lab import CURVE_POINTS, Arm, read_request, request_of, run_lab
from tests.balancer.sim.test_replay import replay

PROJECT = Path(__file__).resolve().parents[3]
ARMS = [Arm(p.name, p.label, p.policy()) for p in BENCHMARK_POLICIES.values()]


def test_every_arm_runs_on_the_same_replay_and_none_beats_the_bound() -> None:
    outcome = run_lab(replay(), ARMS).to_json()

    assert outcome["bound_s"] == pytest.approx(replay().live_bound_s(), rel=1e-3)
    assert [a["name"] for a in outcome["arms"]] == list(BENCHMARK_POLICIES)
    for arm in outcome["arms"]:
        assert arm["completion_s"] == pytest.approx(
            replay().run(arm["name"]).completion_s, abs=1e-3
        )
        assert arm["completion_s"] >= outcome["bound_s"]
        times = [t for t, _ in arm["curve"]]
        fractions = [f for _, f in arm["curve"]]
        assert times == sorted(times) and fractions == sorted(fractions)
        assert fractions[0] == 0.0 and fractions[-1] == 1.0
        assert len(arm["curve"]) <= CURVE_POINTS + 2


def test_a_request_reads_back_as_it_was_written() -> None:
    replayed, arms = read_request(json.loads(json.dumps(request_of(replay(), ARMS[:2]))))

    assert arms == ARMS[:2]
    assert replayed.runtime == replay().runtime


def simulate_in_a_process(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "balancer.sim.lab", *args],
        input=stdin,
        capture_output=True,
        cwd=PROJECT,
        timeout=60,
        check=False,
    )


def test_the_lab_process_prints_the_outcome_of_a_request() -> None:
    request = json.dumps(request_of(replay(), ARMS[:1])).encode()

    done = simulate_in_a_process(request, "--nice", "5", "--memory-mb", "1024")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["arms"][0]["name"] == ARMS[0].name


@pytest.mark.parametrize(
    "stdin",
    [
        b"not json",
        b'{"replay": {}, "arms": []}',
        json.dumps({**request_of(replay(), ARMS[:1]), "arms": []}).encode(),
        json.dumps(
            {
                **request_of(replay(), ARMS[:1]),
                "arms": [{"name": "x", "label": "x", "policy": {"high_water": 7}}],
            }
        ).encode(),
    ],
)
def test_the_lab_process_refuses_what_is_not_a_request(stdin: bytes) -> None:
    done = simulate_in_a_process(stdin)

    assert done.returncode == 2
    assert done.stderr.startswith(b"lab: not a lab request")
    assert done.stdout == b""
