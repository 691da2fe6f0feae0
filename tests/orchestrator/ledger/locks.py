"""Two ledger transactions at once, on the real database: the second made to wait on a
lock the first holds, then the first ended."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection, transaction

from tests.waiting import wait_for


def second_waits_on_first(
    first: Callable[[], object],
    second: Callable[[], object],
    *,
    waiting: str,
    rollback: bool = False,
    timeout_s: float = 120.0,
) -> None:
    """``first`` in a transaction held open on a thread of its own; once it has run,
    ``second`` on another thread; once ``second`` waits on a lock (``waiting`` says
    which, for a wait that times out), the first committed (or rolled back), and both
    threads ended. An error in either is raised here."""
    ran, end = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                first()
                ran.set()
                end.wait(timeout=timeout_s)
                if rollback:
                    transaction.set_rollback(True)
        except BaseException as error:  # noqa: BLE001 - raised in the test's thread
            errors.append(error)
        finally:
            ran.set()
            connection.close()

    def then() -> None:
        try:
            second()
        except BaseException as error:  # noqa: BLE001 - raised in the test's thread
            errors.append(error)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert ran.wait(timeout=timeout_s), "the first transaction never ran"
    other = threading.Thread(target=then)
    other.start()
    try:
        if not errors:
            wait_for(waiting, _waiting_on_a_lock, timeout_s=timeout_s)
    finally:
        end.set()
        holder.join(timeout=timeout_s)
        other.join(timeout=timeout_s)
    assert not holder.is_alive() and not other.is_alive(), "a transaction did not end"
    if errors:
        raise errors[0]


def _waiting_on_a_lock() -> bool:
    """Some session of the test database waits for a lock another holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])
