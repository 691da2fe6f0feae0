"""The sink's pre-merge: a batch's partials combined per group (and window).

Partials are small (one line per group per segment), so they are folded here in Python:
a Spark job per sink batch cost 0.6 to 2.7 s of scheduling for a fold of a few
thousand lines, and held back the sink's output (docs/benchmarks.md). Arithmetic is
exact: sums are decimals added in a context wide enough for DECIMAL(38, 10).

The result is folded into the run's result table by the orchestrator, in the same
transaction that records which input ranges were merged (so nothing is merged twice).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkjobs.measures import Grouping, State


@dataclass(frozen=True)
class GroupPartial:
    """A group's partial states of a grouped stage's measures (sparkjobs/measures.py):
    ``group`` its values, ``states`` by measure name, ``records`` how many records it
    holds; over event-time windows, ``window`` the start of its window (microseconds)."""

    group: tuple[str | None, ...]
    states: dict[str, State]
    records: int = 0
    window: int | None = None


def combine_groups(
    grouping: Grouping, paths: Sequence[Path], rows: dict[Path, int] | None = None
) -> list[GroupPartial]:
    """The grouped partials of several segments combined per window and group, in that
    order (no window and a null value first); ``rows``, if given, gets how many partial
    rows each path held."""
    merged: dict[tuple[int | None, tuple[str | None, ...]], tuple[dict[str, State], int]] = {}
    for path in paths:
        seen = 0
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                seen += 1
                row = json.loads(line)
                at = (row.get("w"), tuple(row["g"]))
                have = merged.get(at)
                records = int(row.get("n", 0))
                merged[at] = (
                    (row["m"], records)
                    if have is None
                    else (grouping.merge(have[0], row["m"]), have[1] + records)
                )
        if rows is not None:
            rows[path] = seen
    ordered = sorted(merged, key=lambda at: (at[0] is not None, at[0] or 0, group_order(at[1])))
    return [GroupPartial(g, merged[(w, g)][0], merged[(w, g)][1], w) for w, g in ordered]


def group_order(group: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    """A group's place among others: by each value, a null one first."""
    return tuple((value is not None, value or "") for value in group)
