"""The sink's pre-merge combines a batch's partials per key, exactly."""

from __future__ import annotations

from decimal import Decimal, localcontext

from hypothesis import given
from hypothesis import strategies as st

from sparkjobs.merge import MergedKey, combine


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
