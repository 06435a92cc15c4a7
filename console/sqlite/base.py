"""Django's SQLite backend, with one change: how a writer waits for the write lock.

SQLite has one write lock. Lethe opens every transaction with BEGIN IMMEDIATE (settings:
`transaction_mode`), so a writer that finds the lock taken waits at BEGIN, where nothing is
read yet and trying again is always safe. SQLite's own busy handler sleeps 1, 2, 5, 10, 15 ms
between tries: a writer that arrives just after another took the lock for 10 ms tries again
only 18 ms later, and one arriving while a tool payload cleanup batch holds it may miss the
short gap the cleanup leaves between batches and wait for the next one (33 ms and more).

Here BEGIN IMMEDIATE is tried with no busy handler and, while the lock is taken, again every
POLL_SECONDS: a waiting writer takes the lock within about half a millisecond of its release.
After FAST_SECONDS of waiting (something holds the lock long: a backup, a VACUUM) the tries
slow to SLOW_POLL_SECONDS. It gives up after the connection's `timeout` (settings: 20 s), as
the busy handler did, with the same "database is locked" error. Statements outside an
explicit transaction keep the busy handler (`PRAGMA busy_timeout`), as before.
"""

from __future__ import annotations

import sqlite3
import time

from django.db import OperationalError
from django.db.backends.sqlite3 import base

POLL_SECONDS = 0.0005
FAST_SECONDS = 0.25
SLOW_POLL_SECONDS = 0.005
SQLITE_BUSY = 5


def _busy(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, OperationalError) else exc
    return isinstance(cause, sqlite3.OperationalError) and (getattr(cause, "sqlite_errorcode", 0) & 0xFF) == SQLITE_BUSY


class DatabaseWrapper(base.DatabaseWrapper):
    def _start_transaction_under_autocommit(self):
        if self.transaction_mode != "IMMEDIATE":
            return super()._start_transaction_under_autocommit()
        raw = self.connection
        handler_ms = raw.execute("PRAGMA busy_timeout").fetchone()[0]
        raw.execute("PRAGMA busy_timeout = 0")
        try:
            started = time.monotonic()
            limit = float(self.settings_dict["OPTIONS"].get("timeout", 5))
            while True:
                try:
                    self.cursor().execute("BEGIN IMMEDIATE")
                    return
                except OperationalError as exc:
                    waited = time.monotonic() - started
                    if not _busy(exc) or waited >= limit:
                        raise
                    time.sleep(POLL_SECONDS if waited < FAST_SECONDS else SLOW_POLL_SECONDS)
        finally:
            raw.execute(f"PRAGMA busy_timeout = {int(handler_ms)}")
