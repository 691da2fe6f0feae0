"""docs/balancing.md describes every policy field with its real default and range."""

from __future__ import annotations

from pathlib import Path

import pytest

from balancer.policy import PARAMETERS, Param

DOC = Path(__file__).resolve().parents[2] / "docs" / "balancing.md"


def table_row(name: str) -> list[str]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"{name} should have exactly one row in {DOC.name}"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


@pytest.mark.parametrize("param", PARAMETERS, ids=lambda p: p.name)
def test_every_policy_field_is_documented_as_declared(param: Param) -> None:
    _, label, default, unit, range_text, description = table_row(param.name)

    assert (label, default, unit, range_text, description) == (
        param.label,
        str(param.default),
        param.unit,
        param.range_text(),
        param.description,
    )
