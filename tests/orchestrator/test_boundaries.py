"""The orchestrator's rooms import only what their ``__init__.py`` says they may, and the
console reaches the orchestrator through its one door (``orchestrator.service``).

Imports are read with ``ast``, lazy ones inside functions included; nothing is imported
and no service is needed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
ORCHESTRATOR = PROJECT / "orchestrator"
WEBAPP = PROJECT / "webapp"

# Sub-packages, named for their jobs; each docstring says what it may import.
ROOMS = (
    "pipeline",
    "sink",
    "ledger",
    "zk",
    "rescale",
    "worker",
    "source",
    "run",
    "services",
    "lab",
)
# The Django app surface at the root: models, the Celery app, tasks, commands and the
# console's door.
EVERYTHING = frozenset({*ROOMS, "models", "celery", "tasks", "service", "management"})

# What each part of orchestrator/ may import of the orchestrator, besides itself.
ALLOWED: dict[str, frozenset[str]] = {
    "pipeline": frozenset(),
    "sink": frozenset({"pipeline"}),
    "ledger": frozenset({"models", "pipeline", "sink"}),
    "zk": frozenset({"pipeline", "services"}),
    "rescale": frozenset({"models", "ledger", "pipeline", "zk"}),
    "worker": frozenset({"models", "ledger", "pipeline", "rescale", "services"}),
    "source": frozenset({"models", "ledger", "pipeline"}),
    "run": frozenset({"models", *ROOMS} - {"run"}),
    "lab": frozenset({"models", "ledger", "pipeline"}),
    "services": frozenset(),
    "models": frozenset(),
    "celery": frozenset(),
    "apps": frozenset(),
    "migrations": frozenset(),
    "__init__": frozenset(),
    "management": EVERYTHING - {"run", "management"},
    "tasks": EVERYTHING - {"tasks", "service", "management"},
    "service": EVERYTHING - {"service", "management"},
}

# The console's door and the models' rows; anything else needs a reason here.
WEBAPP_DOORS = ("orchestrator.service", "orchestrator.models")
WEBAPP_EXCEPTIONS = {
    # Settings are read before Django's apps load (which orchestrator.service needs);
    # where the launcher recorded the services' endpoints needs no Django.
    ("settings", "orchestrator.services.launcher"),
    # A local console's generated SECRET_KEY is kept as the services' secrets are.
    ("settings", "orchestrator.services.credentials"),
}


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path``, relative ones resolved against
    ``package``; ``from a import b`` gives ``a.b`` (b may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def room_of_module(module: str) -> str | None:
    """The part of orchestrator/ ``module`` lies in, or None outside the orchestrator."""
    parts = module.split(".")
    if parts[0] != "orchestrator" or len(parts) < 2:
        return None
    return parts[1]


def room_of_file(path: Path) -> str:
    relative = path.relative_to(ORCHESTRATOR)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def package_of(path: Path) -> str:
    relative = path.relative_to(PROJECT).with_suffix("")
    parts = relative.parts if relative.name == "__init__" else relative.parts[:-1]
    return ".".join(p for p in parts if p != "__init__")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_parser_sees_every_import_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import orchestrator.zk.session\nfrom orchestrator import service, models\n"
        "def f():\n    from orchestrator.run.lifecycle import RunError\n"
        "from . import sibling\nfrom ..ledger import segments\n",
        encoding="utf-8",
    )

    found = {m for _, m in imported_modules(sample, "orchestrator.rescale")}

    assert found == {
        "orchestrator.zk.session",
        "orchestrator.service",
        "orchestrator.models",
        "orchestrator.run.lifecycle.RunError",
        "orchestrator.rescale.sibling",
        "orchestrator.ledger.segments",
    }
    assert {room_of_module(m) for m in found} == {
        "zk",
        "service",
        "models",
        "run",
        "rescale",
        "ledger",
    }


def test_every_part_of_the_orchestrator_has_rules() -> None:
    parts = {room_of_file(p) for p in _files(ORCHESTRATOR)}

    assert parts == set(ALLOWED)


def test_nothing_but_tasks_and_service_may_import_run() -> None:
    assert {part for part, allowed in ALLOWED.items() if "run" in allowed} == {"tasks", "service"}


def test_the_ledger_never_imports_the_protocols_built_on_it() -> None:
    assert not ALLOWED["ledger"] & {"zk", "rescale", "worker", "run"}
    assert not ALLOWED["services"]


@pytest.mark.parametrize("room", ROOMS)
def test_the_rules_are_the_ones_each_room_writes_down(room: str) -> None:
    docstring = ast.get_docstring(ast.parse((ORCHESTRATOR / room / "__init__.py").read_text()))
    assert docstring is not None
    assert "May import:" in docstring, f"orchestrator/{room}/__init__.py says what it may import"
    may = docstring.split("May import:", 1)[1]
    named = set(re.findall(r"``orchestrator\.(\w+)``", may))
    if may.lstrip().startswith("every other room"):
        named |= set(ROOMS) - {room}

    assert named == ALLOWED[room]


@pytest.mark.parametrize(
    "path", _files(ORCHESTRATOR), ids=lambda p: str(p.relative_to(ORCHESTRATOR))
)
def test_no_orchestrator_module_crosses_a_boundary(path: Path) -> None:
    room = room_of_file(path)
    crossing = [
        f"orchestrator/{path.relative_to(ORCHESTRATOR)}:{line} imports {module}"
        for line, module in imported_modules(path, package_of(path))
        if (target := room_of_module(module)) not in (None, room) and target not in ALLOWED[room]
    ]

    assert not crossing, f"{room} may import only {sorted(ALLOWED[room])}: {crossing}"


@pytest.mark.parametrize("path", _files(WEBAPP), ids=lambda p: str(p.relative_to(WEBAPP)))
def test_the_console_reaches_the_orchestrator_only_through_its_door(path: Path) -> None:
    where = path.relative_to(WEBAPP).parts[0]
    crossing = [
        f"webapp/{path.relative_to(WEBAPP)}:{line} imports {module}"
        for line, module in imported_modules(path, package_of(path))
        if room_of_module(module) is not None
        and not any(module == door or module.startswith(f"{door}.") for door in WEBAPP_DOORS)
        and not any(where == w and module.startswith(m) for w, m in WEBAPP_EXCEPTIONS)
    ]

    assert not crossing, f"webapp/ imports the orchestrator through {WEBAPP_DOORS}: {crossing}"
