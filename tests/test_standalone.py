"""The repository stands alone: what its code and docs refer to is inside it.

A clone has no folder beside it, so a reference to one (the specifications or the
architecture notes the project started from) would point nowhere; those live under
``docs/`` (``docs/spec/``, ``docs/architecture.md``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|(?<![\w/])shared/spec|ARCHITECTURE\.md")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True, timeout=30
    ).stdout.split(b"\0")
    paths = [PROJECT / name.decode() for name in listed if name]
    return [p for p in paths if p.suffix in {".py", ".md", ".html", ".js", ".yaml", ".txt"}]


def test_no_file_refers_to_a_folder_outside_the_repository() -> None:
    files = tracked_text_files()
    assert len(files) > 100, f"only {len(files)} tracked text files: is this a clone?"
    found = [
        f"{path.relative_to(PROJECT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line) and path.name != "test_standalone.py"
    ]
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_the_specifications_the_code_cites_are_in_docs() -> None:
    cited = {
        match
        for path in tracked_text_files()
        for match in re.findall(r"docs/spec/([\w-]+\.md)", path.read_text(errors="replace"))
    }
    assert cited, "no file cites a specification"
    missing = sorted(name for name in cited if not (PROJECT / "docs" / "spec" / name).is_file())
    assert not missing, f"cited but not in docs/spec/: {missing}"
