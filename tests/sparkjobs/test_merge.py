"""The sink's pre-merge combines a batch's partials per key, exactly."""

from __future__ import annotations

import json
from decimal import Decimal, localcontext
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkjobs.merge import MergedKey, combine, combine_partials


def partial(
    key: str, count: int, total: str, values: tuple[str, ...], window: int | None = None
) -> MergedKey:
    return MergedKey(key, count, Decimal(total), Decimal(total), Decimal(total), values, window)


def test_a_key_in_one_partial_is_that_partial() -> None:
    alone = partial("k", 3, "1.5", ("u1", "u2"))

    assert combine([alone]) == [alone]


def test_a_key_in_several_partials_adds_counts_and_sums_and_unites_its_sets() -> None:
    merged = combine(
        [
            partial("k", 3, "1.0000000001", ("u1", "u2")),
            partial("j", 1, "7", ("x",)),
            partial("k", 2, "-0.5", ("u2", "u0")),
        ]
    )

    assert merged == [
        partial("j", 1, "7", ("x",)),
        MergedKey(
            "k",
            5,
            Decimal("0.5000000001"),
            Decimal("-0.5"),
            Decimal("1.0000000001"),
            ("u0", "u1", "u2"),
        ),
    ]


def test_windows_keep_their_keys_apart() -> None:
    merged = combine([partial("k", 1, "1", ("a",), window=10), partial("k", 1, "1", ("b",), 0)])

    assert [(m.window, m.distinct) for m in merged] == [(0, ("b",)), (10, ("a",))]


values = st.lists(st.sampled_from(["a", "b", "c", "", "\x1f"]), unique=True).map(
    lambda v: tuple(sorted(v))
)
partials = st.lists(
    st.builds(
        MergedKey,
        key=st.sampled_from(["k1", "k2", "k3"]),
        count=st.integers(1, 10**6),
        sum=st.decimals(-(10**27), 10**27, places=10),
        min=st.decimals(-(10**27), 10**27, places=10),
        max=st.decimals(-(10**27), 10**27, places=10),
        distinct=values,
    ),
    max_size=12,
)


@given(partials)
def test_combining_equals_folding_every_partial_in(parts: list[MergedKey]) -> None:
    expected: dict[str, tuple[int, Decimal, Decimal, Decimal, set[str]]] = {}
    with localcontext() as exact:
        exact.prec = 80  # DECIMAL(38, 10) sums, never rounded
        for p in parts:
            c, s, lo, hi, v = expected.get(p.key, (0, Decimal(0), p.min, p.max, set()))
            expected[p.key] = (
                c + p.count,
                s + p.sum,
                min(lo, p.min),
                max(hi, p.max),
                v | set(p.distinct),
            )

    merged = combine(parts)

    assert [m.key for m in merged] == sorted(expected)
    for m in merged:
        c, s, lo, hi, v = expected[m.key]
        assert (m.count, m.sum, m.min, m.max) == (c, s, lo, hi)
        assert sorted(m.distinct) == sorted(v) and len(m.distinct) == len(v)


def test_combining_files_counts_the_partial_rows_each_held(tmp_path: Path) -> None:
    # Given two segments' partial files, one of three keys (a blank line between), one empty
    rows = [
        {"key": k, "count": 1, "sum": "1", "min": "1", "max": "1", "distinct": ["u"]}
        for k in ("a", "b", "a")
    ]
    three, empty = tmp_path / "three.jsonl", tmp_path / "empty.jsonl"
    three.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    empty.write_text("")
    # When the sink combines them
    counted: dict[Path, int] = {}
    merged = combine_partials([three, empty], counted)
    # Then it knows how many rows each held: the records its batch took in
    assert counted == {three: 3, empty: 0}
    assert [(m.key, m.count) for m in merged] == [("a", 2), ("b", 1)]
