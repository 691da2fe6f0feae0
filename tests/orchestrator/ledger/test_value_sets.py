"""A key's distinct set is one array on its row, merged by one statement per sink batch
(ADR 0010): its values travel one text per set, and any value a record may carry, the
separator and the empty string among them, arrives as itself, exactly once."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.ledger import segments, value_sets
from orchestrator.ledger import windows as window_ledger
from orchestrator.ledger.results import result_values
from orchestrator.models import ResultKey, Run, Segment, WindowKey
from sparkjobs.event_time import WindowSpec
from sparkjobs.merge import MergedKey
from tests.orchestrator.runs import pending_run, segment_row

SEP = value_sets.SEPARATOR
HOSTILE = [
    "",
    SEP,
    f"a{SEP}b",
    f"{SEP}{SEP}",
    "{",
    "}",
    '"',
    "\\",
    ",",
    "NULL",
    " ",
    "é",
    "x" * 3000,
]


def unpacked(packed: value_sets.PackedSets) -> list[set[str]]:
    """What the statement makes of the sets: each text split, its odd values added."""
    sets = [set(text.split(SEP)) if text is not None else set() for text in packed.texts]
    for index, value in zip(packed.odd_sets, packed.odd_values, strict=True):
        sets[index - 1].add(value)
    return sets


def test_plain_values_travel_as_one_text_per_set() -> None:
    packed = value_sets.pack([["u1", "u2"], [], ["u3"]])
    assert packed == value_sets.PackedSets(texts=[f"u1{SEP}u2", None, "u3"])


def test_a_value_holding_the_separator_or_empty_travels_apart_with_its_set() -> None:
    packed = value_sets.pack([["u1", f"a{SEP}b", ""], [""]])
    assert packed.texts == ["u1", None]
    assert list(zip(packed.odd_sets, packed.odd_values, strict=True)) == [
        (1, f"a{SEP}b"),
        (1, ""),
        (2, ""),
    ]


@given(st.lists(st.sets(st.text(alphabet=st.sampled_from(["a", "b", SEP, "é", " "])))))
def test_every_set_reads_back_as_itself(sets: list[set[str]]) -> None:
    assert unpacked(value_sets.pack([sorted(s) for s in sets])) == sets


def _sink_batch(run: Run, chunk: int, sets: dict[str, list[str]]) -> None:
    row = segment_row(run, f"v{chunk}", node="output", upstream="task1", size=1, chunk=chunk)
    Segment.objects.filter(pk=row.pk).update(state=Segment.State.CLAIMED, lease_owner="w")
    row.refresh_from_db()
    deltas = [
        MergedKey(key, len(values), Decimal(1), Decimal(1), Decimal(1), tuple(values))
        for key, values in sets.items()
    ]
    segments.complete_sink_batch(run.pk, "output", "w", [row], deltas)


@pytest.mark.django_db(transaction=True)
def test_batches_unite_each_key_s_set_whatever_its_values_hold() -> None:
    # Given a run whose sink merges three batches: hostile values, some again, a key the
    # third batch brings nothing new, and a key of no values at all
    run = pending_run("reference")
    _sink_batch(run, 0, {"a": HOSTILE[:7], "b": ["u1"], "empty": []})
    _sink_batch(run, 1, {"a": HOSTILE[3:], "b": ["u1", "u2"], "c": [SEP, ""]})
    _sink_batch(run, 2, {"a": HOSTILE, "b": ["u2"], "empty": []})
    # Then each key's set is the union of what it was sent, each value once
    kept = dict(ResultKey.objects.filter(run=run).values_list("key", "values"))
    assert sorted(kept["a"]) == sorted(HOSTILE)
    assert sorted(kept["b"]) == ["u1", "u2"]
    assert sorted(kept["c"]) == ["", SEP]
    assert kept["empty"] is None
    # ...and the result counts them
    counts = {row[0]: (row[1], row[5]) for row in result_values(ResultKey.objects.filter(run=run))}
    assert counts == {
        "a": (7 + 10 + 13, len(HOSTILE)),
        "b": (4, 2),
        "c": (2, 2),
        "empty": (0, 0),
    }


@pytest.mark.django_db(transaction=True)
def test_an_open_window_unites_its_sets_the_same_way() -> None:
    run = pending_run("reference")
    spec = WindowSpec(field="event_time", size_us=60_000_000, slide_us=60_000_000, lateness_us=0)

    def fold(values: list[str]) -> None:
        delta = MergedKey("k", 1, Decimal(1), Decimal(1), Decimal(1), tuple(values), window=0)
        window_ledger.fold(run.pk, spec, [delta])

    fold(HOSTILE[:5])
    fold([])
    fold(HOSTILE[2:])
    row = WindowKey.objects.get(run=run, key="k")
    assert sorted(row.values or []) == sorted(HOSTILE)
    assert window_ledger.distinct_of(row) == len(HOSTILE) and row.count == 3


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_keeps_an_active_run_s_sets_as_its_rows_held_them() -> None:
    # Given a run merged before the sets moved onto the key's rows (migration 0012): a
    # row per value for keys a and b, and key c's count kept already
    run = pending_run("reference")
    executor = MigrationExecutor(connection)
    executor.migrate([("orchestrator", "0011_result_distinct_without_fk")])
    with connection.cursor() as cursor:
        for key, distinct in (("a", None), ("b", None), ("c", 4)):
            cursor.execute(
                "INSERT INTO orchestrator_resultkey (run_id, key, count, sum, min, max, "
                '"distinct") VALUES (%s, %s, 9, 9, 1, 1, %s)',
                [run.pk, key, distinct],
            )
        cursor.execute(
            "INSERT INTO orchestrator_resultdistinct (run_id, key, value) "
            "SELECT %s, d.k, d.v FROM unnest(%s::text[], %s::text[]) AS d(k, v)",
            [run.pk, ["a", "a", "a", "b"], ["u1", "", SEP, "u1"]],
        )
    # When the database is migrated
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("orchestrator"))
    # Then each key's rows are its array, and the kept count stays
    kept = {
        key: (sorted(values or []), n)
        for key, values, n in ResultKey.objects.filter(run=run).values_list(
            "key", "values", "distinct"
        )
    }
    assert kept == {"a": (["", SEP, "u1"], None), "b": (["u1"], None), "c": ([], 4)}


@pytest.mark.django_db
def test_the_sets_are_stored_out_of_line_and_uncompressed() -> None:
    # Compressing a merge's new arrays took 40% of the sink's statement (ADR 0010).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attrelid::regclass::text, attstorage FROM pg_attribute "
            "WHERE attname = 'values' AND attrelid IN "
            "('orchestrator_resultkey'::regclass, 'orchestrator_windowkey'::regclass)"
        )
        storage = dict(cursor.fetchall())
    assert storage == {"orchestrator_resultkey": "e", "orchestrator_windowkey": "e"}
