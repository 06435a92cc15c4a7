"""Compacting the database after a cleanup: the engine's VACUUM, with sizes before and after.

What it does per engine:
- SQLite: `VACUUM` rewrites the file without its free pages, so the file shrinks by about the
  reusable space. It holds the write lock while it runs (writers wait), and writes the whole
  database through the WAL; a `wal_checkpoint(TRUNCATE)` afterwards folds it back and empties
  the WAL before the size is measured.
- PostgreSQL: plain `VACUUM` of the whole database marks dead rows' space reusable for new rows
  and trims empty pages at the end of tables; it takes no lock that blocks reads or writes, so
  the files seldom shrink much. `VACUUM FULL` (which would) is never run here: it locks every
  table and waits behind any open reader, a running backup included.

Both refuse to run inside a transaction (the engines do too), so callers run it from a job or
command with the connection in autocommit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.db import connection
from django.utils.translation import gettext as _

from retention.errors import CodedError
from retention.storage import database_size

CHECKPOINT_ATTEMPTS = 50
CHECKPOINT_PAUSE_SECONDS = 0.1


class CompactError(CodedError):
    """Compaction could not run. `code` is stable, `message` localized."""


@dataclass(frozen=True)
class CompactResult:
    before_file_bytes: int
    after_file_bytes: int
    before_reusable_bytes: int
    after_reusable_bytes: int
    seconds: float


def compact_database() -> CompactResult:
    """1. Measure the file size and reusable space.
    2. Run the engine's VACUUM in autocommit (SQLite: then fold the WAL back into the file).
    3. Measure again and return both, with the seconds VACUUM took."""
    if connection.vendor not in {"sqlite", "postgresql"}:
        raise CompactError("unsupported", _("Compacting is not supported for this database."))
    if connection.in_atomic_block:
        raise CompactError("in_transaction", _("The database cannot be compacted inside a transaction."))
    before = database_size()
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")
        if connection.vendor == "sqlite":
            _checkpoint(cursor)
    seconds = time.monotonic() - started
    after = database_size()
    return CompactResult(
        before_file_bytes=before.file_bytes,
        after_file_bytes=after.file_bytes,
        before_reusable_bytes=before.reusable_bytes,
        after_reusable_bytes=after.reusable_bytes,
        seconds=round(seconds, 3),
    )


def _checkpoint(cursor) -> None:
    """Fold the WAL into the file and truncate it; a reader holding an old snapshot makes the
    checkpoint busy, so retry for a few seconds (the size is then measured with the WAL)."""
    for _attempt in range(CHECKPOINT_ATTEMPTS):
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        busy = cursor.fetchone()[0]
        if not busy:
            return
        time.sleep(CHECKPOINT_PAUSE_SECONDS)

