"""A folder of a run's input swapped for a symbolic link is never followed: a bounded
run's files are opened from their root's descriptor with no component followed, and a
landing run holds its folder from its start, so a swap fails the run, naming the folder,
and nothing outside is read, moved or deleted (real workers, real files and links)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.models import ResultGroup, SourceFile
from orchestrator.run.lifecycle import create_run
from orchestrator.source.spec import LandingSpec
from orchestrator.tasks import start_run
from tests.orchestrator.run.scenarios import (
    landed_at_once,
    policy,
    skewed_reference,
    start,
    wait_started,
    wait_until_done,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

SECRET = '{"key": "secret", "value": 1, "user": "x"}\n'


def swap_for_link(folder: Path, target: Path) -> None:
    """``folder`` renamed away and a symbolic link to ``target`` put in its place."""
    folder.rename(folder.with_name(folder.name + ".old"))
    folder.symlink_to(target, target_is_directory=True)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


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
    # (tmp_path is below no input root of the workers: the walk is from /)
    assert f"{str(tmp_path / 'in')[1:]!r} is a symbolic link" in run.error
    assert not ResultGroup.objects.filter(run=run, group=["secret"]).exists()


def test_a_bounded_run_whose_input_folder_becomes_a_link_mid_run_fails_and_reads_nothing_behind_it(
    workers, tmp_path: Path
) -> None:
    # Given a run over three files of 2.4 MB whose branches take 1 MB/s each into pools
    # of 0.5 MB (the third file is not read for at least a second), and a folder outside
    # holding files of the same names and sizes whose keys are all "s..."
    (tmp_path / "in").mkdir()
    (tmp_path / "outside").mkdir()
    for n in range(3):
        rows = [
            {"key": f"k{(n * 40_000 + i) % 9}", "value": i % 997, "user": f"u{i % 50}"}
            for i in range(40_000)
        ]
        body = "".join(json.dumps(r) + "\n" for r in rows)
        (tmp_path / "in" / f"part-{n}.jsonl").write_text(body)
        (tmp_path / "outside" / f"part-{n}.jsonl").write_text(
            body.replace('"key": "k', '"key": "s')
        )
    doc = skewed_reference(slow_mbps=1.0)
    for node in doc["nodes"]:
        if node["kind"] == "operator":
            node["max_rate_mbps"] = 1.0
    run = start(doc, policy(), input_path=str(tmp_path / "in" / "*.jsonl"))
    # When the folder is swapped for a link to the other once the run finished a batch
    wait_started(run)
    swap_for_link(tmp_path / "in", tmp_path / "outside")
    # Then the run fails, naming a file and the link, and nothing behind it was read
    run = wait_until_done(run, timeout_s=120)
    assert run.status == "failed", run.status
    assert "changed since it was measured" in run.error
    assert f"{str(tmp_path / 'in')[1:]!r} is a symbolic link" in run.error
    assert not ResultGroup.objects.filter(run=run, group__0__startswith="s").exists()


def test_a_landing_folder_swapped_for_a_link_mid_run_fails_it_and_nothing_behind_it_is_touched(
    workers, tmp_path: Path
) -> None:
    # Given a landing run that deletes what it merged, over a folder that also holds a
    # file it does not match; every file it matched taken, merged and deleted
    spec = landed_at_once(tmp_path / "landing", mb=0.25, seed=3, file_kb=64)
    spec = LandingSpec(spec.folder, stable_s=0, clean="delete")
    (tmp_path / "landing" / "notes.txt").write_text("not a landing file\n")
    landed = len(list((tmp_path / "landing").glob("*.jsonl")))
    run = start(skewed_reference(), policy(), source=spec)

    def all_deleted() -> bool:
        if SourceFile.objects.filter(run=run, state="cleaned").count() >= landed:
            return True
        run.refresh_from_db()
        assert run.is_active, f"the run ended before deleting what it read: {run.error}"
        return False

    wait_for("the run to take and delete every file", all_deleted, timeout_s=120)
    # When the folder is swapped for a link to another folder, holding files of the
    # names the run deleted and new ones
    other = tmp_path / "other"
    landed_at_once(other, mb=0.25, seed=4, file_kb=64)
    (other / "secret.jsonl").write_text(SECRET * 50)
    before = digests(other)
    swap_for_link(tmp_path / "landing", other)
    # Then the run fails, naming the folder, at its next listing
    run = wait_until_done(run, timeout_s=60)
    assert run.status == "failed", run.status
    assert run.error.startswith(
        f"the input could not be read: the landing folder cannot be opened: {spec.folder}: "
    ), run.error
    assert run.error.endswith("landing' is a symbolic link, which is never followed"), run.error
    # And nothing behind the link was read or deleted; the folder it held keeps the
    # file it never matched
    assert digests(other) == before
    assert SourceFile.objects.filter(run=run).count() == landed
    assert not ResultGroup.objects.filter(run=run, group=["secret"]).exists()
    assert [p.name for p in (tmp_path / "landing.old").iterdir()] == ["notes.txt"]
