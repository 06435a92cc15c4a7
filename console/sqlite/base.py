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
read as it connects), and the file a process first opened at that path (or the one the serve
that started it did) as `first_identity`: /readyz compares both with the file at the path now,
so a database file deleted or replaced under a running process is reported, and the job
cluster stops (manage.py) rather than write into a file nobody reads (ops/health.py).

A process creates its database file at most once: on its first connection, when the file is
not there yet (a fresh install's `migrate`), made owner-only (0600) before SQLite writes
anything in it; never beside a -wal or -shm left by a file moved or deleted (SQLite would
take that log for the new file's and drop it, with the moved file's last writes). Every later connection opens the file read-write without creating it
(`mode=rw`): a file moved or deleted under a running process is not silently replaced by a
new, empty and world-readable one, which /readyz would then find in place with every
migration unapplied. Such a connection fails with an error naming the path until the file is
back. A database file (or its folder, -wal or -shm) that grants nobody writing is opened
read-only (`mode=ro`), for root too: its first write fails with one line (manage.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

from django.db import OperationalError
from django.db.backends.sqlite3 import base, features
from django.utils.functional import cached_property

POLL_SECONDS = 0.0005
FAST_SECONDS = 0.25
SLOW_POLL_SECONDS = 0.005
SQLITE_BUSY = 5
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

# The database files (absolute paths) this process has opened: it never creates them again.
_OPENED: set[str] = set()

# The file each database path named when this process (or the serve that started it: FIRST_ENV,
# "device:inode:path") first opened it. A web worker opens a new connection per request, so its
# connection's own identity always matches the path; this one tells a file swapped since start.
FIRST_ENV = "LETHE_SQLITE_FIRST_FILE"
_FIRST: dict[str, tuple[int, int]] = {}


def _inherited_first() -> None:
    device, sep, rest = os.environ.get(FIRST_ENV, "").partition(":")
    inode, sep2, path = rest.partition(":")
    if sep and sep2 and device.isdigit() and inode.isdigit() and path:
        _FIRST.setdefault(path, (int(device), int(inode)))


_inherited_first()


def first_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path` when this process, or the serve that started it,
    first opened it; None before then."""
    return _FIRST.get(path)


def watch_file(path: str, interval: float = 2.0) -> threading.Event:
    """A daemon thread that looks at the database file every `interval` seconds and, once it is
    missing or replaced (`file_changed`), sets the returned event and sends this process
    SIGTERM: the job cluster stops gracefully rather than go on writing into a file nobody reads
    (its connections are long-lived, and a connection keeps the file it opened)."""
    changed = threading.Event()

    def look() -> None:
        while not changed.wait(interval):
            if reason := file_changed(path):
                changed.reason = reason  # type: ignore[attr-defined]
                changed.set()
                os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=look, name="lethe-database-file-watch", daemon=True).start()
    return changed


def first_file_env(path: str | None) -> dict[str, str]:
    """The environment that hands this process's first file at `path` to a child process."""
    found = _FIRST.get(path) if path else None
    return {FIRST_ENV: f"{found[0]}:{found[1]}:{path}"} if found else {}


def file_changed(path: str) -> str | None:
    """"missing" when no file is at `path`, "replaced" when it is another file than the one
    first opened; None when it is the same (or none was opened yet)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return "missing"
    first = _FIRST.get(path)
    return "replaced" if first is not None and first != (found.st_dev, found.st_ino) else None


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


def _log_without_file(path: str) -> str | None:
    """The write-ahead log or shared-memory file of a database at `path`, when one is there."""
    return next((name for name in (f"{path}-wal", f"{path}-shm") if os.path.exists(name)), None)


def _create_private(path: str) -> None:
    """An empty file at `path`, owner-only, unless there is one: SQLite would create it with
    0644 (less the umask), readable by every user until settings' first-open chmod. An empty
    file is an empty database to SQLite. Anything that stops it here (no such folder) is left
    for SQLite to report as it connects."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


# SQLite's primary result codes for a file it may not write or open: SQLITE_PERM,
# SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN.
_CANNOT_WRITE = {3, 8, 10, 14}


def first_unwritable(path: str) -> tuple[str, str] | None:
    """The first of the database file's folder, the file, its -wal and -shm (those there) that
    cannot be written, with why; None when all can. Lethe writes the file and SQLite creates
    the -wal and -shm in the folder. The permission bits are read as well as asked about: root
    may write whatever the bits say, but a file or folder that grants nobody writing is meant
    to be read-only (ops/health.py reads it the same way)."""
    folder = os.path.dirname(path)
    for name in (folder, path, f"{path}-wal", f"{path}-shm"):
        try:
            found = os.stat(name)
            if os.statvfs(name).f_flag & os.ST_RDONLY:
                return name, "is on a read-only file system"
        except FileNotFoundError:
            continue
        except OSError as error:
            return name, f"cannot be read ({error.strerror})"
        if not found.st_mode & 0o222:
            return name, "has no write permission"
        if not os.access(name, os.W_OK | os.X_OK if os.path.isdir(name) else os.W_OK):
            return name, "cannot be written by the user Lethe runs as"
    return None


def grants_nobody_writing(path: str) -> bool:
    """The database file, its folder, -wal or -shm (those there) has no write permission bit
    at all: Lethe treats the database as read-only, whoever it runs as."""
    for name in (os.path.dirname(path), path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(OSError):
            if not os.stat(name).st_mode & 0o222:
                return True
    return False


def cannot_write_message(path: str) -> str | None:
    """One line for an operator when the SQLite database at `path` cannot be written: which
    file or folder, why, and what to do. None when nothing is in the way."""
    found = first_unwritable(path)
    if found is None:
        return None
    name, why = found
    folder = os.path.dirname(path)
    which = f"its folder {name}" if name == folder else name
    return (f"The database {path} cannot be written: {which} {why}. Lethe writes the database file and creates "
            f"its -wal and -shm files in {folder}: make that folder and the files in it writable by the user Lethe "
            "runs as (or mount the disk read-write), then start again.")


def cannot_write_explained(settings_dict: dict, error: BaseException) -> str | None:
    """`cannot_write_message` for a database error that SQLite raised because it could not
    open or write the file (Django's OperationalError, caused by sqlite3's); None for any other
    error, or another database."""
    cause = error.__cause__ if isinstance(error, OperationalError) else error
    if not isinstance(cause, sqlite3.Error) or (getattr(cause, "sqlite_errorcode", 0) & 0xFF) not in _CANNOT_WRITE:
        return None
    name = str(settings_dict.get("NAME", ""))
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    return cannot_write_message(os.path.abspath(name))


class MissingDatabaseFile(sqlite3.OperationalError):
    """The database file this process (or its serve) opened before is not at its path any more:
    screens and the API answer 503 `database_unavailable` (console/busy.py)."""


class DatabaseFeatures(features.DatabaseFeatures):
    @cached_property
    def supports_json_field(self) -> bool:
        """Django asks SQLite whether it has JSON inside a transaction, which here begins with
        BEGIN IMMEDIATE: while anything else held the write lock (a compaction, a backup, an
        operator's shell), every command waited 20 s for it, took the failure for "no JSON",
        and stopped on a screen of false "SQLite does not support JSONFields" system-check
        errors (r30). The question reads no table: asked outside any transaction, it takes no
        lock."""
        with self.connection.cursor() as cursor:
            try:
                cursor.execute("SELECT JSON('{\"a\": \"b\"}')")
            except OperationalError:
                return False
        return True


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
    file_identity: tuple[int, int] | None = None

    def _file_path(self) -> str | None:
        """The database file's absolute path; None for an in-memory database or a name given
        as a URI (`file:...`), which SQLite opens as it says."""
        name = str(self.settings_dict["NAME"])
        if self.is_in_memory_db() or name.startswith("file:"):
            return None
        return os.path.abspath(name)

    def get_new_connection(self, conn_params):
        path = self._file_path()
        # Opened before by this process, or by the serve that started it (a web worker's first
        # connection): a file missing now was moved away, and no empty one is made in its place.
        opened_before = path in _OPENED or path in _FIRST
        if opened_before:
            conn_params = {**conn_params, "database": f"file:{quote(path)}?mode=rw"}
        elif path is not None and not os.path.exists(path) and (left := _log_without_file(path)):
            # A -wal or -shm with no database file beside it: the file was moved or deleted and
            # its log stayed. A new file here would take that log as its own and SQLite would
            # drop it, with the moved file's last committed writes (r83: a restarted serve did).
            raise MissingDatabaseFile(
                f"The database file {path} is missing, but {left} is there: the file was moved or deleted "
                "and its latest writes are still in that log. Lethe does not make a new database beside it, "
                "which would discard them: put the file back (with Lethe stopped) and start Lethe again."
            )
        elif path is not None:
            _create_private(path)
        if path is not None and grants_nobody_writing(path):
            # Read-only for every user, root included (root may write whatever the bits say):
            # reads work, the first write fails as it would for any other user.
            conn_params = {**conn_params, "database": f"file:{quote(path)}?mode=ro"}
        try:
            raw = super().get_new_connection(conn_params)
        except sqlite3.OperationalError:
            if opened_before and not os.path.exists(path):
                raise MissingDatabaseFile(
                    f"The database file {path} is missing: it was there when this process first opened it. "
                    "It was moved or deleted, and Lethe does not make a new, empty one in its place: put it back "
                    "(to start afresh with an empty database instead, stop Lethe and run `manage.py migrate`)."
                ) from None
            raise
        if path is not None:
            _OPENED.add(path)
        # The init commands have read the file by now: it exists, and is the one just opened.
        self.file_identity = None
        if path is not None:
            with contextlib.suppress(OSError):
                found = os.stat(path)
                self.file_identity = (found.st_dev, found.st_ino)
                _FIRST.setdefault(path, self.file_identity)
        return raw

    lock_wait: float | None = None  # set for a while by console.busy.waiting_at_most

    @property
    def lock_timeout(self) -> float:
        """The connection's `timeout` (settings: 20 s): how long a writer waits for the lock."""
        if self.lock_wait is not None:
            return self.lock_wait
        return float(self.settings_dict["OPTIONS"].get("timeout", 5))

    def create_cursor(self, name=None):
        cursor = self.connection.cursor(factory=CursorWrapper)
        cursor.lock_timeout = self.lock_timeout
        return cursor

    def _start_transaction_under_autocommit(self):
        if self.transaction_mode != "IMMEDIATE":
            return super()._start_transaction_under_autocommit()
        take_write_lock(self.connection, lambda: self.cursor().execute("BEGIN IMMEDIATE"), self.lock_timeout)
