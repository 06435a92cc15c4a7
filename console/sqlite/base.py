"""Django's SQLite backend, with two changes: how a writer waits for the write lock, and
each connection remembers which file it opened.

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
the busy handler did, with the same "database is locked" error.

A write statement outside any transaction (Django's `.update()`, a save outside `atomic()`,
django-q2 taking a task) gets the same: it runs in a BEGIN IMMEDIATE ... COMMIT of its own,
which is what SQLite does for it anyway, with the lock taken the same way. Not a statement
that returns rows (INSERT ... RETURNING: its rows are read after it), which keeps the busy
handler (`PRAGMA busy_timeout`), as every other statement outside a transaction does.

The file a connection opened is remembered as `file_identity` (device and inode of its path,
read as it connects): /readyz compares it with the file at the path now, so a database file
deleted or replaced under a running process is reported, not written into unseen
(ops/health.py).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable

from django.db import OperationalError
from django.db.backends.sqlite3 import base

POLL_SECONDS = 0.0005
FAST_SECONDS = 0.25
SLOW_POLL_SECONDS = 0.005
SQLITE_BUSY = 5
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def _busy(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, OperationalError) else exc
    return isinstance(cause, sqlite3.OperationalError) and (getattr(cause, "sqlite_errorcode", 0) & 0xFF) == SQLITE_BUSY


def take_write_lock(raw: sqlite3.Connection, begin: Callable[[], object], limit: float) -> None:
    """Run `begin` (a BEGIN IMMEDIATE) until it is not refused for the lock, polling; SQLite's
    error once `limit` seconds have passed. The busy handler is off meanwhile, then restored."""
    handler_ms = raw.execute("PRAGMA busy_timeout").fetchone()[0]
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        started = time.monotonic()
        while True:
            try:
                begin()
                return
            except (OperationalError, sqlite3.OperationalError) as exc:
                waited = time.monotonic() - started
                if not _busy(exc) or waited >= limit:
                    raise
                time.sleep(POLL_SECONDS if waited < FAST_SECONDS else SLOW_POLL_SECONDS)
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(handler_ms)}")


def _takes_own_lock(raw: sqlite3.Connection, query: str) -> bool:
    """A write outside any transaction that returns no rows."""
    if raw.in_transaction:
        return False
    head = query.lstrip()[:8].upper()
    return head.startswith(WRITES) and "RETURNING" not in query.upper()


class CursorWrapper(base.SQLiteCursorWrapper):
    lock_timeout = 5.0

    def execute(self, query, params=None):
        if not _takes_own_lock(self.connection, query):
            return super().execute(query, params)
        return self._own_transaction(lambda: super(CursorWrapper, self).execute(query, params))

    def executemany(self, query, param_list):
        if not _takes_own_lock(self.connection, query):
            return super().executemany(query, param_list)
        return self._own_transaction(lambda: super(CursorWrapper, self).executemany(query, param_list))

    def _own_transaction(self, run):
        raw = self.connection
        take_write_lock(raw, lambda: raw.execute("BEGIN IMMEDIATE"), self.lock_timeout)
        try:
            result = run()
        except BaseException:
            if raw.in_transaction:  # some errors end the transaction themselves
                raw.execute("ROLLBACK")
            raise
        raw.execute("COMMIT")
        return result


class DatabaseWrapper(base.DatabaseWrapper):
    file_identity: tuple[int, int] | None = None

    def get_new_connection(self, conn_params):
        raw = super().get_new_connection(conn_params)
        # The init commands have read the file by now: it exists, and is the one just opened.
        self.file_identity = None
        if not self.is_in_memory_db():
            with contextlib.suppress(OSError):  # a name that is no path (a URI): nothing to compare
                found = os.stat(self.settings_dict["NAME"])
                self.file_identity = (found.st_dev, found.st_ino)
        return raw

    @property
    def lock_timeout(self) -> float:
        """The connection's `timeout` (settings: 20 s): how long a writer waits for the lock."""
        return float(self.settings_dict["OPTIONS"].get("timeout", 5))

    def create_cursor(self, name=None):
        cursor = self.connection.cursor(factory=CursorWrapper)
        cursor.lock_timeout = self.lock_timeout
        return cursor

    def _start_transaction_under_autocommit(self):
        if self.transaction_mode != "IMMEDIATE":
            return super()._start_transaction_under_autocommit()
        take_write_lock(self.connection, lambda: self.cursor().execute("BEGIN IMMEDIATE"), self.lock_timeout)
