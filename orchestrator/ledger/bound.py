"""Statements whose parameters travel to PostgreSQL bound and in binary, not quoted
into the statement's text.

Django's psycopg backend binds parameters on the client (psycopg's ``ClientCursor``):
each one is quoted, escaped and spliced into the SQL in Python, and the server parses
it back. That is nothing for a key or an id and a great deal for a sink batch's
distinct sets: on bench_peers.py's 512 MB input, 1.2 MB of text in 243 strings, the
quoting alone took 32 ms, and the first merge's statement 57 ms, 24 ms with the same
parameters bound in binary (docs/benchmarks.md, "2026-12-02 (late night): a run's last
merge"; ADR 0010). The merge is the last step of every run, so this is time the run
takes.

The cursor is psycopg's own, on Django's connection, in whatever transaction Django
has open there; its errors are Django's, as from any other query.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from django.db import connection


def execute(sql: str, params: Sequence[object]) -> None:
    """Run ``sql``, whose placeholders are ``%b`` (a parameter sent bound, in binary),
    in the current transaction."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)


def fetch(sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
    """:func:`execute`'s statement's rows (one that returns some)."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
