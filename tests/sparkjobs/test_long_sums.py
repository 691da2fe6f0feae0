"""Sums in longs (sparkjobs/long_sums.py, as sparkjobs/measure_parts.py keeps a grouped
stage's sum, min, max and average: here the key form's, of its value): the same bytes
as the decimal plan, exact against an oracle in Python's decimals, and a value or a
group too large for longs aggregated in decimals instead."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from decimal import ROUND_HALF_UP, Context, Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from sparkjobs import grouped, long_sums
from sparkjobs.grouped import grouped_partials
from sparkjobs.measures import Grouping
from sparkjobs.merge import combine_groups

pytestmark = pytest.mark.spark

KEY_FORM = Grouping.of({})  # the key form: count, sum, min, max and avg of the value

SMALL = Decimal(long_sums.SMALL)
ULP = Decimal("1e-10")
EDGES = [
    "0",
    "-0",
    "0.0000000001",
    "-0.0000000001",
    "0.00000000005",  # rounds half up to 1e-10, as the reader reads it
    "-0.00000000005",
    "123.456789012345",
    "1e3",
    "-2.5E-3",
    str(SMALL),
    str(-SMALL),
    str(SMALL - ULP),
]
TOO_LARGE = [str(SMALL + ULP), "-900000000.0000000001", "1e27", "-99999999999999999999.5"]


WIDE = Context(prec=80)


def read_as_spark_does(text: str) -> Decimal:
    return Decimal(text).quantize(ULP, rounding=ROUND_HALF_UP, context=WIDE)


def oracle(
    records: list[tuple[str, str, str]],
) -> dict[str, tuple[int, Decimal, Decimal, Decimal, Decimal]]:
    groups: dict[str, list[Decimal]] = defaultdict(list)
    for key, value, _ in records:
        groups[key].append(read_as_spark_does(value))
    totals = {key: Decimal(0) for key in groups}
    for key, numbers in groups.items():
        for number in numbers:
            totals[key] = WIDE.add(totals[key], number)
    # The average is the one division of the exact sum (in the default context)
    return {k: (len(v), totals[k], min(v), max(v), totals[k] / len(v)) for k, v in groups.items()}


def write(folder: Path, records: list[tuple[str, str, str]], segments: int = 3) -> dict[str, Path]:
    """Records as JSON lines, each value its number's text as written, in segments."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {f"seg{i}": folder / f"seg{i}.jsonl" for i in range(segments)}
    lines: dict[str, list[str]] = {seg: [] for seg in paths}
    for index, (key, value, user) in enumerate(records):
        line = f'{{"key": "{key}", "value": {value}, "user": "{user}"}}\n'
        lines[f"seg{index % segments}"].append(line)
    for seg, path in paths.items():
        path.write_text("".join(lines[seg]))
    return paths


def aggregated(
    spark: Any, folder: Path, inputs: dict[str, Path], *, together: bool
) -> tuple[dict[str, tuple[int, Decimal, Decimal, Decimal, Decimal]], dict[str, bytes]]:
    outputs = {seg: folder / f"{seg}.p.jsonl" for seg in inputs}
    holders = {seg: "seg0" for seg in inputs} if together else None
    assert KEY_FORM is not None
    grouped_partials(spark, inputs, outputs, KEY_FORM, together=holders)
    merged = {}
    for partial in combine_groups(KEY_FORM, list(outputs.values())):
        values = KEY_FORM.finish(partial.states)
        (key,) = partial.group
        assert key is not None
        merged[key] = (values["count"], values["sum"], values["min"], values["max"], values["avg"])
    return merged, {seg: path.read_bytes() for seg, path in outputs.items()}


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process that has not yet seen values too large for longs."""
    monkeypatch.setattr(grouped, "_IN_DECIMALS", set())


def mixed_records(seed: int, count: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    records = [(f"k{i % 4}", value, f"u{i % 7}") for i, value in enumerate(EDGES)]
    for index in range(count):
        magnitude = rng.choice([1, 1000, 10**6, long_sums.SMALL])
        value = Decimal(rng.randint(-(10**12), 10**12)) / 10**12 * magnitude
        records.append((f"k{index % 5}", str(value), f"u{rng.randrange(50)}"))
    return records


@pytest.mark.parametrize("together", [False, True], ids=["own partials", "together"])
def test_sums_in_longs_are_the_oracles_and_the_decimal_plans_bytes(
    spark: Any, tmp_path: Path, together: bool
) -> None:
    records = mixed_records(seed=7, count=400)
    inputs = write(tmp_path / "in", records)
    in_longs, written = aggregated(spark, tmp_path / "longs", inputs, together=together)
    assert in_longs == oracle(records)
    assert KEY_FORM not in grouped._IN_DECIMALS  # no value was too large
    grouped._IN_DECIMALS.add(KEY_FORM)
    _, written_in_decimals = aggregated(spark, tmp_path / "decimals", inputs, together=together)
    assert written == written_in_decimals


@pytest.mark.parametrize("together", [False, True], ids=["own partials", "together"])
def test_a_value_too_large_for_longs_sends_its_batch_and_the_later_ones_to_decimals(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    records = mixed_records(seed=8, count=60)
    records += [(f"k{i}", value, "u1") for i, value in enumerate(TOO_LARGE)]
    inputs = write(tmp_path / "in", records)
    merged, _ = aggregated(spark, tmp_path / "first", inputs, together=together)
    assert merged == oracle(records)
    assert KEY_FORM in grouped._IN_DECIMALS

    def not_in_longs(_: Any) -> Any:
        raise AssertionError("a later batch of the same aggregate summed in longs")

    monkeypatch.setattr(long_sums, "small_unscaled", not_in_longs)
    later = mixed_records(seed=9, count=30)
    merged, _ = aggregated(
        spark, tmp_path / "later", write(tmp_path / "in2", later), together=together
    )
    assert merged == oracle(later)


def test_a_group_of_more_records_than_longs_can_sum_is_summed_in_decimals(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound is 900 million records of one group in one batch; lowered here to 2.
    monkeypatch.setattr(long_sums, "MAX_RECORDS", 2)
    records = [("a", "1.5", "u1"), ("a", "2.25", "u2"), ("a", "-1", "u3"), ("b", "4", "u1")]
    merged, _ = aggregated(spark, tmp_path, write(tmp_path / "in", records), together=True)
    assert merged == oracle(records)
    assert KEY_FORM in grouped._IN_DECIMALS


@settings(max_examples=12, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.decimals(min_value=-SMALL, max_value=SMALL, places=10, allow_nan=False),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_any_values_within_the_bound_sum_exactly_in_longs(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, values: list[tuple[str, Decimal]]
) -> None:
    grouped._IN_DECIMALS.clear()
    folder = tmp_path_factory.mktemp("values")
    records = [(key, str(value), "u") for key, value in values]
    merged, _ = aggregated(spark, folder, write(folder / "in", records), together=True)
    assert merged == oracle(records)
    assert KEY_FORM not in grouped._IN_DECIMALS


def test_a_value_s_unscaled_column_is_built_on_any_thread(spark: Any) -> None:
    # Given a thread on which no Spark session was made active (a session is active
    # per thread)
    built: dict[str, Any] = {}

    def build() -> None:
        try:
            built["column"] = long_sums.small_unscaled(F.col("v").cast(long_sums.VALUE_TYPE))
        except RuntimeError as error:
            built["error"] = error

    thread = threading.Thread(target=build)
    thread.start()
    thread.join(timeout=30)
    # Then the column is built there, and computes the unscaled value
    assert "error" not in built, built
    frame = spark.createDataFrame([("1.5",), ("-2",), (None,)], "v STRING")
    values = [row[0] for row in frame.select(built["column"]).collect()]
    assert values == [15_000_000_000, -20_000_000_000, None]
