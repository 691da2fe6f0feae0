"""``manage.py run_pipeline``: the JSON a user compares with ``--batch``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.services.launcher import PROJECT_ROOT
from tests.conftest import child_env

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def _command(services, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "run_pipeline", *args],
        cwd=PROJECT_ROOT,
        env=child_env(services),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_run_and_batch_print_the_same_rows(workers, services, tmp_path) -> None:
    from tests.orchestrator.run.scenarios import skewed_reference

    topology = tmp_path / "skewed.yaml"
    import yaml

    topology.write_text(yaml.safe_dump(skewed_reference()))
    generator = "seed=21,volume_mb=1,dominance=0.7"
    streamed = _command(services, str(topology), "--generator", generator, "--wait", "--json")
    assert streamed.returncode == 0, streamed.stderr
    batch = _command(services, str(topology), "--generator", generator, "--batch", "--json")
    assert batch.returncode == 0, batch.stderr
    run, reference = json.loads(streamed.stdout), json.loads(batch.stdout)
    assert run["status"] == "completed"
    assert run["coverage"] == "exact"
    assert set(run) == {
        "run",
        "status",
        "seconds",
        "segments",
        "migrated_segments",
        "malformed_records",
        "coverage",
        "error",
        "rows",
    }
    # The key form's result: its key, then its measures by their names.
    assert list(run["rows"][0]) == ["key", "count", "sum", "min", "max", "avg", "distinct_users"]
    assert run["rows"] == reference["rows"]


def test_unknown_policy_and_missing_input_are_clear_errors(services, tmp_path) -> None:
    from tests.orchestrator.run.scenarios import REFERENCE

    missing = _command(services, str(REFERENCE), "--input", str(tmp_path / "nope.jsonl"))
    assert missing.returncode != 0
    assert "does not exist" in missing.stderr
    unknown = _command(services, str(REFERENCE), "--input", "x", "--policy", "fastest")
    assert unknown.returncode != 0
    assert "unknown policy 'fastest'" in unknown.stderr
