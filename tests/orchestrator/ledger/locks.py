"""What the tests of concurrent ledger transactions ask the database."""

from __future__ import annotations

from django.db import connection


def waiting_on_a_lock() -> bool:
    """Some session of the test database waits for a lock another holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])
