"""Chaos, the short version of bench/chaos.py: ``make run``'s own stack, its processes
killed (and one paused past its ZooKeeper session) at random moments with a fixed seed,
while bounded and continuous runs go on. Every fault recovers, every run completes with
no one's help and equals the plain Spark batch job: nothing lost, nothing twice.

The session is the bench script itself, run as a child process (it configures Django
for the stack it starts, which this test process, set up for the test database, cannot
share). Its faults overlap (``--max-open``) to fit every kind, some twice, into about a
minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.services.launcher import PROJECT_ROOT
from tests.conftest import TEST_LEASE_S, TEST_VAR_DIR

BENCH = PROJECT_ROOT / "bench"
sys.path.insert(0, str(BENCH))  # the bench's modules import each other by file name

from chaos_faults import Kind  # noqa: E402
from chaos_recovery import progressed_after  # noqa: E402

FAULTS = 12
SHORT = [
    "--faults",
    str(FAULTS),
    "--seed",
    "3",
    # Mean gap 2 s, up to 4 faults recovering at once: the expensive kinds (a Spark JVM's
    # first batch, a pause past the 10 s session) overlap the cheap ones. Closer (1.2 s,
    # 6 open) a continuous run could outlive the 120 s run timeout on a slow day
    # (docs/benchmarks.md, "Chaos").
    "--interval-s",
    "2",
    "--max-open",
    "4",
    "--stop-s",
    "11",
    "--recovery-timeout-s",
    "60",
    "--bounded-mb",
    "2",
    "--rate-mbps",
    "0.5",
    "--feed-s",
    "15",
    "--run-timeout-s",
    "120",
    # The lease every other test gives its workers (tests/conftest.py): a batch whose
    # Spark process was killed is taken over after it, not after the default minute.
    "--env",
    f"BPCONSOLE_LEASE_S={TEST_LEASE_S}",
    # ...and a batch waiting in a dead worker's queue is presumed lost after it too, as
    # in every other test (tests/conftest.py), not after the default minute.
    "--env",
    f"BPCONSOLE_QUEUED_BATCH_S={TEST_LEASE_S}",
]


def test_recovery_counts_only_progress_made_once_the_process_is_back() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    merged = [5, 6, 6, 6, 8]
    # A merge before the process was back (at 1 s) is not a recovery; the one at 4 s is.
    assert progressed_after(times, merged, 1.5) == 4.0
    assert progressed_after(times, merged, 0.5) == 1.0
    # Nothing merged after 4 s: not recovered (yet).
    assert progressed_after(times, merged, 4.0) is None
    assert progressed_after([], [], 0.0) is None


def _why(result: dict[str, Any]) -> str:
    """The faults that did not recover and the runs that went wrong, with their logs."""
    faults = [f for f in result["fault_log"] if f["recovery_s"] is None]
    return json.dumps(
        {
            "not_recovered": faults,
            "failed_runs": result["failed_runs"],
            "skipped": result["skipped"],
            "lane_errors": result["lane_errors"],
        },
        indent=1,
        default=str,
    )


@pytest.mark.integration
@pytest.mark.spark
def test_runs_stay_exact_while_processes_are_killed(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "chaos.py"),
            *SHORT,
            "--var",
            str(TEST_VAR_DIR / "chaos"),
            "--json",
            str(out),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    result = json.loads(out.read_text())
    why = _why(result)
    # Every kind was hit, each time a live target was found
    assert result["faults"] == FAULTS
    assert set(result["faults_per_kind"]) == {str(kind) for kind in Kind}
    assert result["skipped"] == [], why
    # Every fault recovered: the process (or its replacement) answered and the runs
    # merged more after that
    assert result["all_recovered"], why
    # Bounded and continuous runs ran throughout, each completed with no one's help and
    # equals the plain batch job
    assert result["lane_errors"] == [], why
    assert result["runs_by_mode"]["bounded"] >= 1
    assert result["runs_by_mode"]["continuous"] >= 1
    assert result["completed_without_human"] == result["runs"], why
    assert result["exact_runs"] == result["runs"], why
    assert result["lost_records"] == 0, why
    assert result["duplicated_records"] == 0, why
