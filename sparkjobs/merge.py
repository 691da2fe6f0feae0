"""The sink's pre-merge: partial aggregates of a batch combined per key (per group, for a
stage of grouped measures).

Partials are small (one line per key per segment), so they are folded here in Python:
a Spark job per sink batch cost 0.6 to 2.7 s of scheduling for a fold of a few
thousand lines, and held back the sink's output (docs/benchmarks.md). Arithmetic is
exact: sums are decimals added in a context wide enough for DECIMAL(38, 10).

The result is folded into the run's result table by the orchestrator, in the same
transaction that records which input ranges were merged (so nothing is merged twice).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from sparkjobs.measures import EXACT, Grouping, State


@dataclass(frozen=True)
class MergedKey:
    key: str
    count: int
    sum: Decimal
    min: Decimal
    max: Decimal
    distinct: tuple[str, ...]
    window: int | None = None  # the event-time window's start (us), when windowed


def read_partials(path: Path) -> Iterator[MergedKey]:
    """The per-key partials an aggregating operator wrote for one segment."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                yield MergedKey(
                    key=row["key"],
                    count=int(row["count"]),
                    sum=Decimal(row["sum"]),
                    min=Decimal(row["min"]),
                    max=Decimal(row["max"]),
                    distinct=tuple(row["distinct"]),
                    window=row.get("window"),
                )


def combine(partials: Iterable[MergedKey]) -> list[MergedKey]:
    """Partials combined per (window, key), in (window, key) order: counts and sums add,
    min and max fold, sets unite.

    A key with one partial is that partial: its set is as the operator wrote it,
    distinct and sorted (``sort_array``). In a batch of a stage's siblings every key has
    one (the operator's job aggregates the whole batch under one segment), and uniting
    and sorting the sets of bench_peers.py's 243,000 pairs again took the sink 60 to
    100 ms of each merge; the last merge is the end of the run.
    """
    groups: dict[tuple[int | None, str], list[MergedKey]] = {}
    for p in partials:
        groups.setdefault((p.window, p.key), []).append(p)
    return [
        group[0] if len(group) == 1 else _united(group)
        for _, group in sorted(groups.items(), key=lambda item: (item[0][0] or 0, item[0][1]))
    ]


def _united(group: Sequence[MergedKey]) -> MergedKey:
    first = group[0]
    total, values = first.sum, set(first.distinct)
    for p in group[1:]:
        total = EXACT.add(total, p.sum)
        values.update(p.distinct)
    return MergedKey(
        first.key,
        sum(p.count for p in group),
        total,
        min(p.min for p in group),
        max(p.max for p in group),
        tuple(sorted(values)),
        first.window,
    )


def combine_partials(paths: Sequence[Path], rows: dict[Path, int] | None = None) -> list[MergedKey]:
    """The partials of several segments combined per key; ``rows``, if given, gets how
    many partial rows each path held (the records a sink batch took in)."""

    def counted(path: Path) -> Iterator[MergedKey]:
        seen = 0
        for partial in read_partials(path):
            seen += 1
            yield partial
        if rows is not None:
            rows[path] = seen

    return combine(p for path in paths for p in counted(path))


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
