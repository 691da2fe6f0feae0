"""A folder of a run's input swapped for a symbolic link is never followed: a bounded
run's files are opened from their root's descriptor with no component followed (real
workers, real files and links)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.models import ResultKey
from orchestrator.run.lifecycle import create_run
from orchestrator.tasks import start_run
from tests.orchestrator.run.scenarios import policy, skewed_reference, wait_until_done

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

SECRET = '{"key": "secret", "value": 1, "user": "x"}\n'


def swap_for_link(folder: Path, target: Path) -> None:
    """``folder`` renamed away and a symbolic link to ``target`` put in its place."""
    folder.rename(folder.with_name(folder.name + ".old"))
    folder.symlink_to(target, target_is_directory=True)


def test_a_bounded_run_whose_input_folder_became_a_link_fails_and_reads_nothing_through_it(
    workers, tmp_path: Path
) -> None:
    # Given a run over two files of a folder, then the folder (not the files) replaced
    # by a link to a folder holding files of the same names that the run was not given
    (tmp_path / "in").mkdir()
    (tmp_path / "outside").mkdir()
    for n in range(2):
        line = json.dumps({"key": f"k{n}", "value": n, "user": "u"}) + "\n"
        (tmp_path / "in" / f"part-{n}.jsonl").write_text(line * 200)
        (tmp_path / "outside" / f"part-{n}.jsonl").write_text(SECRET * 200)
    run = create_run(
        topology=skewed_reference(), policy=policy(), input_path=str(tmp_path / "in" / "*.jsonl")
    )
    swap_for_link(tmp_path / "in", tmp_path / "outside")
    # When it runs, then it fails naming the file and the link, and nothing of the
    # files behind the link was read
    start_run(run)
    run = wait_until_done(run, timeout_s=60)
    assert run.status == "failed"
    assert run.error.startswith("the input could not be read")
    assert "part-0.jsonl changed since it was measured" in run.error
    assert "'in' is a symbolic link" in run.error or (
        f"{str(tmp_path / 'in')[1:]!r} is a symbolic link" in run.error  # walked from /
    )
    assert not ResultKey.objects.filter(run=run, key="secret").exists()
