"""balancer/ stays pure: it never imports the frameworks, and decisions read no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BALANCER = Path(__file__).resolve().parents[2] / "balancer"
FRAMEWORKS = {"django", "celery", "kazoo", "pyspark"}
# Decision modules take time as an input and are deterministic; the simulator may seed
# its own random traffic, so it is not in this list.
DECISIONS = ("watermark", "rate", "shares", "stepwise", "window", "credit", "rescale", "loop")
IMPURE = {"time", "datetime", "random", "secrets", "uuid", "os", "threading", "asyncio"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots: set[str] = set()
    for statement in ast.walk(tree):
        if isinstance(statement, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            roots.add(statement.module.split(".")[0])
    return roots


def test_the_parser_sees_every_import_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import django.conf\nfrom celery import Celery\n"
        "def f():\n    import kazoo.client as k\n    from pyspark.sql import Row\n"
        "from . import sibling\n",
        encoding="utf-8",
    )

    assert imported_roots(sample) == FRAMEWORKS


@pytest.mark.parametrize(
    "path", sorted(BALANCER.rglob("*.py")), ids=lambda p: str(p.relative_to(BALANCER))
)
def test_no_balancer_module_imports_a_framework(path: Path) -> None:
    assert not imported_roots(path) & FRAMEWORKS


@pytest.mark.parametrize("name", DECISIONS)
def test_decision_modules_read_no_clock_and_draw_no_random_numbers(name: str) -> None:
    assert not imported_roots(BALANCER / f"{name}.py") & IMPURE
