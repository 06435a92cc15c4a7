"""A database too busy to answer in time: SQLite's write lock held past the connection's wait
("database is locked"), or a PostgreSQL lock or statement timeout. Such a request changed
nothing it could not finish (its transaction is rolled back) and can simply be tried again, so
screens and the API answer 503 with Retry-After, never the 500 of an unexpected error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import OperationalError, connection

RETRY_AFTER_SECONDS = 5


def is_database_busy(exc: BaseException) -> bool:
    if not isinstance(exc, OperationalError):
        return False
    text = str(exc).lower()
    return "locked" in text or "busy" in text or "lock timeout" in text or "could not obtain lock" in text


@contextlib.contextmanager
def waiting_at_most(seconds: float) -> Iterator[None]:
    """Writes in this block wait at most `seconds` for SQLite's write lock (not the connection's
    20 s): for bookkeeping a request can do without. PostgreSQL: unchanged (such a write waits
    only for another write to the same row)."""
    if connection.vendor != "sqlite":
        yield
        return
    saved = connection.lock_wait
    connection.lock_wait = seconds
    try:
        yield
    finally:
        connection.lock_wait = saved
