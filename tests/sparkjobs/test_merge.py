"""The sink's pre-merge combines a batch's partials per window and group, exactly
(sparkjobs/merge.py), here the key form's: the count, sum, min, max and average of the
value and the distinct users of each key."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkjobs.measures import Grouping
from sparkjobs.merge import GroupPartial, combine_groups


def _key_form() -> Grouping:
    grouping = Grouping.of({})
    assert grouping is not None
    return grouping


KEY_FORM = _key_form()


def states(
    count: int, total: str, users: Sequence[str], least: str = "", most: str = ""
) -> dict[str, Any]:
    """A key's partial states as the Spark job writes them (sparkjobs/grouped.py)."""
    return {
        "count": count,
        "sum": total,
        "min": least or total,
        "max": most or total,
        "avg": {"sum": total, "count": count},
        "distinct_users": sorted(users),
    }


def partial(
    key: str | None, count: int, total: str, users: Sequence[str], window: int | None = None
) -> dict[str, Any]:
    """A partial line of one key: ``count`` records whose values sum to ``total``."""
    row: dict[str, Any] = {"g": [key], "m": states(count, total, users), "n": count}
    if window is not None:
        row["w"] = window
    return row


def write(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_key_in_one_partial_is_that_partial(tmp_path: Path) -> None:
    alone = partial("k", 3, "1.5", ["u1", "u2"])

    merged = combine_groups(KEY_FORM, [write(tmp_path / "p.jsonl", [alone])])

    assert merged == [GroupPartial(("k",), alone["m"], 3)]


def test_a_key_in_several_partials_adds_counts_and_sums_and_unites_its_sets(
    tmp_path: Path,
) -> None:
    first = write(
        tmp_path / "a.jsonl",
        [partial("k", 3, "1.0000000001", ["u1", "u2"]), partial("j", 1, "7", ["x"])],
    )
    second = write(tmp_path / "b.jsonl", [partial("k", 2, "-0.5", ["u0", "u2"])])

    merged = combine_groups(KEY_FORM, [first, second])

    assert [(p.group, p.records) for p in merged] == [(("j",), 1), (("k",), 5)]
    assert KEY_FORM.finish(merged[1].states) == {
        "count": 5,
        "sum": Decimal("0.5000000001"),
        "min": Decimal("-0.5"),
        "max": Decimal("1.0000000001"),
        "avg": Decimal("0.10000000002"),
        "distinct_users": 3,
    }
    assert merged[1].states["distinct_users"] == ["u0", "u1", "u2"]


def test_windows_keep_their_keys_apart_in_order_no_window_and_a_null_key_first(
    tmp_path: Path,
) -> None:
    rows = [
        partial("k", 1, "1", ["a"], window=10),
        partial("k", 1, "1", ["b"], window=0),
        partial("b", 1, "1", ["c"], window=0),
        partial(None, 1, "1", ["d"], window=0),
        partial("", 1, "1", ["e"], window=0),
    ]

    merged = combine_groups(KEY_FORM, [write(tmp_path / "p.jsonl", rows)])

    assert [(p.window, p.group, p.states["distinct_users"]) for p in merged] == [
        (0, (None,), ["d"]),
        (0, ("",), ["e"]),
        (0, ("b",), ["c"]),
        (0, ("k",), ["b"]),
        (10, ("k",), ["a"]),
    ]
    unwindowed = [partial("k", 1, "1", ["a"]), partial(None, 1, "1", ["b"])]
    merged = combine_groups(KEY_FORM, [write(tmp_path / "q.jsonl", unwindowed)])
    assert [(p.window, p.group) for p in merged] == [(None, (None,)), (None, ("k",))]


numbers = st.decimals(-(10**27), 10**27, places=10, allow_nan=False, allow_infinity=False)
partials = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(["k1", "k2", "k3", None]),
            "window": st.sampled_from([None, 0, 60_000_000]),
            "count": st.integers(1, 10**6),
            "sum": numbers,
            "min": numbers,
            "max": numbers,
            "users": st.lists(st.sampled_from(["a", "b", "c", "", "\x1f"]), unique=True),
        }
    ),
    max_size=12,
)


@settings(deadline=None)
@given(parts=partials, files=st.integers(1, 4))
def test_combining_equals_folding_every_partial_in(
    tmp_path_factory: pytest.TempPathFactory, parts: list[dict[str, Any]], files: int
) -> None:
    # Given a batch's partials, in one to four files
    folder = tmp_path_factory.mktemp("partials")
    rows = [
        {
            "g": [p["key"]],
            "m": states(p["count"], str(p["sum"]), p["users"], str(p["min"]), str(p["max"])),
            "n": p["count"],
            **({} if p["window"] is None else {"w": p["window"]}),
        }
        for p in parts
    ]
    paths = [write(folder / f"{i}.jsonl", rows[i::files]) for i in range(files)]
    expected: dict[tuple[Any, ...], tuple[int, Decimal, Decimal, Decimal, set[str]]] = {}
    with localcontext() as exact:
        exact.prec = 80  # DECIMAL(38, 10) sums, never rounded
        for p in parts:
            at = (p["window"], p["key"])
            c, s, lo, hi, v = expected.get(at, (0, Decimal(0), p["min"], p["max"], set()))
            expected[at] = (
                c + p["count"],
                s + p["sum"],
                min(lo, p["min"]),
                max(hi, p["max"]),
                v | set(p["users"]),
            )

    merged = combine_groups(KEY_FORM, paths)

    # Then each window's keys are there once, in order, each the fold of its partials
    order = sorted(expected, key=lambda at: (at[0] is not None, at[0] or 0, *_key_order(at[1])))
    assert [(m.window, *m.group) for m in merged] == order
    for m in merged:
        c, s, lo, hi, v = expected[(m.window, *m.group)]
        assert m.records == c
        assert m.states["count"] == c and m.states["avg"]["count"] == c
        assert Decimal(m.states["sum"]) == s == Decimal(m.states["avg"]["sum"])
        assert (Decimal(m.states["min"]), Decimal(m.states["max"])) == (lo, hi)
        assert m.states["distinct_users"] == sorted(v)


def _key_order(key: str | None) -> tuple[bool, str]:
    return key is not None, key or ""


def test_combining_files_counts_the_partial_rows_each_held(tmp_path: Path) -> None:
    # Given two segments' partial files, one of three keys (a blank line between), one empty
    rows = [partial(k, 1, "1", ["u"]) for k in ("a", "b", "a")]
    three, empty = tmp_path / "three.jsonl", tmp_path / "empty.jsonl"
    three.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    empty.write_text("")
    # When the sink combines them
    counted: dict[Path, int] = {}
    merged = combine_groups(KEY_FORM, [three, empty], counted)
    # Then it knows how many rows each held: the records its batch took in
    assert counted == {three: 3, empty: 0}
    assert [(m.group, m.records, m.states["count"]) for m in merged] == [
        (("a",), 2, 2),
        (("b",), 1, 1),
    ]
