"""A database that cannot take a request now: too busy to answer in time (SQLite's write lock
held past the connection's wait, "database is locked", or a PostgreSQL lock or statement
timeout), out of room (SQLite's "database or disk is full", PostgreSQL's disk_full, 53100), or
not there (a SQLite file moved away under the server, a PostgreSQL server down or restarting),
or not taking writes (a PostgreSQL standby or a database set read-only, SQLSTATE 25006, or a
role without the grants, 42501; r114: these were 500s saying part of the request may have been
done). Such a request changed nothing it could not finish (its transaction is rolled back), so screens
and the API answer 503 with Retry-After and a code that says which (`database_busy`,
`database_full`, `database_unavailable`), never the 500 of an unexpected error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError, OperationalError, connection, transaction

RETRY_AFTER_SECONDS = 5
FULL_RETRY_AFTER_SECONDS = 60  # until an operator frees space
UNAVAILABLE_RETRY_AFTER_SECONDS = 30  # until an operator puts the database back


def is_database_busy(exc: BaseException) -> bool:
    if not isinstance(exc, OperationalError):
        return False
    text = str(exc).lower()
    return "locked" in text or "busy" in text or "lock timeout" in text or "could not obtain lock" in text


@contextlib.contextmanager
def waiting_at_most(seconds: float) -> Iterator[None]:
    """Writes in this block wait at most `seconds` for a lock, not the connection's own wait
    (SQLite: 20 s for the write lock; PostgreSQL: DB_LOCK_WAIT_SECONDS on the web server,
    console/web_database.py, and no limit elsewhere): for bookkeeping a request can do without.
    On PostgreSQL the block runs in a transaction (a savepoint inside another one) with
    `SET LOCAL lock_timeout`; once it ends the connection's own wait is back."""
    if connection.vendor == "postgresql":
        from console.web_database import milliseconds

        nested = connection.in_atomic_block
        with transaction.atomic():
            with connection.cursor() as cursor:
                if nested:  # SET LOCAL lasts until the outer transaction ends: put it back below
                    cursor.execute("SELECT current_setting('lock_timeout')")
                    (saved,) = cursor.fetchone()
                cursor.execute(f"SET LOCAL lock_timeout = {milliseconds(seconds)}")
            yield
            if nested:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [saved])
        return
    if connection.vendor != "sqlite":
        yield
        return
    saved = connection.lock_wait
    connection.lock_wait = seconds
    try:
        yield
    finally:
        connection.lock_wait = saved


def is_database_full(exc: BaseException | None) -> bool:
    """The database's disk (or SQLite's page limit) is full: SQLITE_FULL, or SQLSTATE 53100."""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if getattr(cause, "sqlite_errorname", None) == "SQLITE_FULL" or getattr(cause, "sqlstate", None) == "53100":
        return True
    return "database or disk is full" in str(exc).lower()


# SQLite: the file cannot be opened (moved or removed under a running server, its folder
# unreadable) or is not a database (replaced). PostgreSQL: no connection (no SQLSTATE: the
# server cannot be reached), a connection exception (class 08), or the server shutting down or
# starting (57P01, 57P02, 57P03).
_UNAVAILABLE_SQLITE = ("SQLITE_CANTOPEN", "SQLITE_NOTADB")
_UNAVAILABLE_STATES = ("57P01", "57P02", "57P03")


def is_database_unavailable(exc: BaseException | None) -> bool:
    """The database cannot be reached or opened now (see above): nothing of the request was
    stored by it, and trying again later may work once an operator has put it back."""
    if not isinstance(exc, OperationalError):
        return False
    from console.sqlite.base import MissingDatabaseFile

    cause = exc.__cause__
    if isinstance(cause, MissingDatabaseFile) or getattr(cause, "sqlite_errorname", None) in _UNAVAILABLE_SQLITE:
        return True
    if cause is None or not type(cause).__module__.startswith("psycopg"):
        return "unable to open database file" in str(exc).lower()
    state = getattr(cause, "sqlstate", None)
    return state is None or state.startswith("08") or state in _UNAVAILABLE_STATES


# PostgreSQL refusing a write (r114): a read-only transaction (25006 read_only_sql_transaction:
# a hot standby, or default_transaction_read_only on for the server, the database, the role or
# in DATABASE_URL), or the role lacking a grant (42501 insufficient_privilege). Django raises
# them as InternalError and ProgrammingError, not OperationalError.
_REFUSED_STATES = {"25006": "read_only", "42501": "not_permitted"}


def database_refuses(exc: BaseException | None) -> str | None:
    """"read_only" or "not_permitted" when PostgreSQL refused `exc`'s statement for that reason
    (see above); else None. The refused statement's transaction is rolled back."""
    if not isinstance(exc, DatabaseError):
        return None
    cause = exc.__cause__
    if cause is None or not type(cause).__module__.startswith("psycopg"):
        return None
    return _REFUSED_STATES.get(getattr(cause, "sqlstate", None) or "")


def trouble(exc: BaseException | None) -> tuple[str, int] | None:
    """(code, Retry-After seconds) when `exc` is the database being busy, full, unavailable or
    refusing writes (`database_unavailable` too: an operator must put a database that takes
    them back); else None."""
    if is_database_full(exc):
        return "database_full", FULL_RETRY_AFTER_SECONDS
    if exc is not None and is_database_busy(exc):
        return "database_busy", RETRY_AFTER_SECONDS
    if is_database_unavailable(exc) or database_refuses(exc):
        return "database_unavailable", UNAVAILABLE_RETRY_AFTER_SECONDS
    return None
