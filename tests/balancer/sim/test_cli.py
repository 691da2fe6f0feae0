"""``main(argv)``: one run, a small table, a sweep, a plot, topology files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from balancer.sim.cli import main
from balancer.sim.control import BENCHMARK_POLICIES

ROOT = Path(__file__).resolve().parents[3]
OUTCOME_KEYS = {
    "policy",
    "completion_s",
    "bound_s",
    "ratio_to_bound",
    "migrated_share",
    "minimum_share",
}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_a_small_table_gives_every_policy_at_every_volume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = run_json(capsys, "--table", "--volumes", "16MB,32MB", "--json")

    assert table["seed"] == 1
    assert set(table["volumes"]) == {"16MB", "32MB"}
    for volume in table["volumes"].values():
        assert set(volume) == {"bound_s", "minimum_share", "policies"}
        assert set(volume["policies"]) == set(BENCHMARK_POLICIES)
        for name, outcome in volume["policies"].items():
            assert set(outcome) == OUTCOME_KEYS | {"gain_over_credit"}
            assert outcome["policy"] == name
            assert outcome["bound_s"] == volume["bound_s"]
            assert outcome["completion_s"] >= outcome["bound_s"]
        assert volume["policies"]["credit"]["gain_over_credit"] == 0.0


def test_one_run_reports_its_completion_against_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = run_json(capsys, "--policy", "ours", "--volume", "64MB", "--seed", "2", "--json")

    assert set(run) == OUTCOME_KEYS | {"volume", "seed"}
    assert (run["policy"], run["volume"], run["seed"]) == ("ours", "64MB", 2)


def test_the_text_table_names_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", "--volumes", "16MB"]) == 0

    out = capsys.readouterr().out
    assert all(p.label in out for p in BENCHMARK_POLICIES.values())


def test_the_sweep_covers_the_published_alpha_beta_grid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sweep = run_json(capsys, "--sweep", "--volume", "32MB", "--json")

    grid = {(r["alpha"], r["beta"]) for r in sweep["runs"]}
    assert grid == {(a, b) for a in (0.1, 0.3, 0.5, 0.7, 0.9) for b in (0.3, 0.5, 0.7, 1, 2)}


def test_the_plot_is_written_as_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = tmp_path / "completion.png"

    assert main(["--plot", str(image), "--volume", "32MB"]) == 0

    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(image) in capsys.readouterr().out


DOCUMENT = """
nodes:
  - {name: src, kind: source}
  - {name: fast, kind: operator, buffer_mb: 16}
  - {name: slow, kind: operator, buffer_mb: 16}
  - {name: out, kind: sink}
edges:
  - {from: src, to: fast, bandwidth_mbps: 80}
  - {from: src, to: slow, bandwidth_mbps: 80}
  - {from: fast, to: out, bandwidth_mbps: 60, latency_ms: 5}
  - {from: slow, to: out, bandwidth_mbps: 20}
"""


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_topology_file_replaces_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    import yaml

    path = tmp_path / f"topology{suffix}"
    document = yaml.safe_load(DOCUMENT)
    path.write_text(DOCUMENT if suffix == ".yaml" else json.dumps(document), encoding="utf-8")

    run = run_json(
        capsys, "--policy", "credit", "--volume", "32MB", "--topology", str(path), "--json"
    )

    # Max flow 60 + 20 = 80 Mb/s = 10 MB/s: 32 MB cannot finish in under 3.2 s.
    assert run["bound_s"] >= 3.2


def test_bad_arguments_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", "ours", "--volume", "lots"]) == 2
    assert "not a volume" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--policy", "nope"]) == 2
    assert main(["--help"]) == 0


def test_python_dash_m_runs_the_same_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "balancer.sim", "--policy", "credit", "--volume", "16MB", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )

    assert json.loads(completed.stdout)["policy"] == "credit"
