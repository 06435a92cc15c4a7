"""Physical erasure, told truthfully, and what still holds old bytes after a delete.

SQLite: `secure_delete` zeroes what is deleted, but the pages written before the delete
may sit in the write-ahead log until a checkpoint copies the zeroed pages over them and
truncates it. `wal_checkpoint(TRUNCATE)` reports busy while a reader holds a snapshot, so
it is retried with back-off; until it succeeds the receipt says "physically pending" and
the recovery job tries again every minute.

PostgreSQL: a plain VACUUM leaves deleted bytes in the table files; only a compaction that
rewrites the tables removes them. The receipt says "logically erased, physically pending
until the next compaction" until `record_compaction` marks it.

Backups made before the delete still hold the content, whatever the database does; so does
a WAL archive when `archive_mode` is on. The receipt names them and until when.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

CHECKPOINT_TRIES = 8


def checkpoint_sqlite(tries: int = CHECKPOINT_TRIES) -> bool:
    """Run `wal_checkpoint(TRUNCATE)` until it reports busy=0; False if it stays busy."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return False
    delay = 0.05
    for attempt in range(tries):
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            busy, _log, _done = cursor.fetchone()
        if busy == 0:
            return True
        if attempt < tries - 1:
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return False


def backup_dir() -> Path:
    return Path(getattr(settings, "BACKUP_DIR", None) or Path(settings.VAR_DIR) / "backups")


def backups_before(moment: datetime) -> list[dict[str, Any]]:
    """Backup files made before `moment`: they hold the content until they are deleted."""
    folder = backup_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            made = path.stat().st_mtime
            if made < moment.timestamp():
                out.append({"kind": "backup", "name": path.name,
                            "made_at": datetime.fromtimestamp(made, tz=moment.tzinfo).isoformat()})
    return out


def wal_archive_on() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SHOW archive_mode")
        return cursor.fetchone()[0] in ("on", "always")


def holders(moment: datetime, *, physically_erased: bool) -> list[dict[str, Any]]:
    """What still holds the erased bytes at `moment`, each with what ends it."""
    out = backups_before(moment)
    if not physically_erased:
        out.append({"kind": "database_files" if connection.vendor == "postgresql" else "wal"})
    if wal_archive_on():
        out.append({"kind": "wal_archive"})
    return out
