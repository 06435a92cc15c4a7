"""The web server's database connections wait a bounded time for a lock (PostgreSQL).

A request that needs a table or a row another process holds (an erasure's VACUUM FULL holds
the whole conversations table while it rewrites it) waits at most DB_LOCK_WAIT_SECONDS for
each lock, then fails with PostgreSQL's lock timeout, which screens and the API answer 503
`database_busy` with Retry-After (console/busy.py), as SQLite's requests do after their 20 s
wait for the write lock. Without it a page waits for as long as the lock is held: minutes,
for a large table.

Only the web server's processes get it: the WSGI entry (console/wsgi.py, loaded by gunicorn's
workers and by `runserver`) calls `bound_lock_waits()`. The job cluster and the management
commands never load that module, so their connections keep PostgreSQL's default (no limit):
the jobs (an erasure and its VACUUM FULL, cleanup batches, retention) were written to wait for
as long as it takes.

The wait is set for the session when a connection opens. Django opens a connection in
autocommit mode, so the setting takes effect at once and is never undone by a rollback, and
a connection kept for later requests (CONN_MAX_AGE) keeps it for its whole life; a connection
opened again (after a failed health check, say) gets it again.
"""

from __future__ import annotations

from django.conf import settings
from django.db.backends.signals import connection_created


def milliseconds(seconds: float) -> int:
    """PostgreSQL's lock_timeout in whole milliseconds, at least 1 (0 would mean no limit)."""
    return max(1, round(seconds * 1000))


def bounded_lock_wait(sender, connection, **kwargs) -> None:
    if connection.vendor != "postgresql":
        return  # SQLite's connections wait their own 20 s (settings: timeout, busy_timeout)
    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = {milliseconds(settings.DB_LOCK_WAIT_SECONDS)}")


def bound_lock_waits() -> None:
    """From now on every database connection this process opens waits at most
    DB_LOCK_WAIT_SECONDS for a lock. For the web server's processes only."""
    connection_created.connect(bounded_lock_wait, dispatch_uid="lethe.web_lock_wait")
