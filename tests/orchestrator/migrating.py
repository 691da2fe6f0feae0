"""Taking the test database's orchestrator schema back to an older migration and forward
again, as an upgrade of a running installation would; a test that goes back leaves the
database at the latest migration, whatever it asserted."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(target: str) -> None:
    """The orchestrator's schema (and its data) migrated to ``target``, back or forward."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("orchestrator", target)])


def latest() -> str:
    """The orchestrator's latest migration."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes("orchestrator")[0][1]


@contextmanager
def back_to_latest() -> Iterator[None]:
    """Whatever happens inside (a migration back among it), the database is at the
    latest migration after it."""
    try:
        yield
    finally:
        migrate(latest())
