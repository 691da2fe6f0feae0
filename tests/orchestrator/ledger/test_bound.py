"""Statements with large parameters send them bound, in binary: each value arrives as
itself, in Django's transaction, and a failure is Django's error like any query's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from orchestrator.ledger import bound, segments
from orchestrator.models import ResultGroup, Segment
from tests.orchestrator.key_form import KEY_FORM, key_partial, key_states
from tests.orchestrator.runs import pending_run, segment_row

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "bound_probe"
# Values a record may carry that quoting, splitting or escaping would change.
HOSTILE = [
    "",
    "\x1f",
    "a\x1fb",
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


@pytest.fixture
def probe() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, texts text[], n numeric)")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")


def _rows() -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, texts, n FROM {TABLE} ORDER BY id")  # noqa: S608 - the test's table
        return list(cursor.fetchall())


def test_values_arrive_as_themselves(probe: None) -> None:
    hostile = [*HOSTILE, "'); DROP TABLE bound_probe; --", "%s", "%b", "$1", None]
    bound.execute(
        f"INSERT INTO {TABLE} VALUES (%b, %b::text[], %b)",  # noqa: S608 - the test's table
        [1, hostile, Decimal("-12345678901234567890.0123456789")],
    )
    assert _rows() == [(1, hostile, Decimal("-12345678901234567890.0123456789"))]


def test_the_statement_is_part_of_django_s_transaction(probe: None) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        bound.execute(f"INSERT INTO {TABLE} VALUES (%b, %b::text[], %b)", [1, ["a"], 1])  # noqa: S608
        raise RuntimeError("the caller fails after the statement")
    assert _rows() == []


def test_a_failure_is_django_s_error_and_the_connection_goes_on(probe: None) -> None:
    bound.execute(f"INSERT INTO {TABLE} VALUES (%b, %b::text[], %b)", [1, ["a"], 1])  # noqa: S608
    with pytest.raises(IntegrityError), transaction.atomic():
        bound.execute(f"INSERT INTO {TABLE} VALUES (%b, %b::text[], %b)", [1, ["b"], 2])  # noqa: S608
    assert _rows() == [(1, ["a"], Decimal(1))]


def test_a_sink_batch_s_sets_are_never_spliced_into_a_statement_by_django() -> None:
    # Django's cursor quotes every parameter into the statement's text in Python: 32 ms
    # of a 57 ms merge of 243 keys' sets (orchestrator/ledger/bound.py).
    run = pending_run("reference")
    rows = []
    for n in range(2):
        row = segment_row(run, f"v{n}", node="output", upstream="task1", size=1, chunk=n)
        Segment.objects.filter(pk=row.pk).update(state=Segment.State.CLAIMED, lease_owner="w")
        row.refresh_from_db()
        rows.append(row)
    seen: list[str] = []

    def spy(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(repr(params))
        return execute(sql, params, many, context)

    # The first batch brings a new group (inserted), the second merges into it (updated)
    markers = ["u-bound-marker", "u-bound-merged"]
    with connection.execute_wrapper(spy):
        for row, marker in zip(rows, markers, strict=True):
            batch = [key_partial("k", key_states(1, 1, 1, 1, [marker, "u2"]))]
            segments.complete_sink_batch(run.pk, "output", "w", [row], batch, grouping=KEY_FORM)
    assert seen, "the batch's other statements go through Django"
    assert not [params for params in seen if any(m in params for m in markers)]
    kept = ResultGroup.objects.get(run=run, group=["k"])
    assert kept.states["distinct_users"] == sorted([*markers, "u2"])
    assert kept.records == 2
