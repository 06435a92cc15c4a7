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
from typing import Any

from django.db import connection

CHECKPOINT_TRIES = 8
CHECKPOINT_WAIT_MS = 200


def checkpoint_sqlite(tries: int = CHECKPOINT_TRIES) -> bool:
    """Run `wal_checkpoint(TRUNCATE)` until it reports busy=0; False if it stays busy."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return False
    delay = 0.05
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        saved = cursor.fetchone()[0]
        # A TRUNCATE checkpoint calls the busy handler while a reader holds a snapshot: with
        # the connection's 20 s timeout each try would wait that long. Try briefly and back
        # off here instead.
        cursor.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
        try:
            for attempt in range(tries):
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                busy, _log, _done = cursor.fetchone()
                if busy == 0:
                    return True
                if attempt < tries - 1:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {int(saved)}")
    return False


def backups_before(moment: datetime) -> list[dict[str, Any]]:
    """Files in the backup folder made before `moment`: they hold the content until they are
    deleted. The folder is the one backups are made in (`retention.backups.backup_dir`);
    besides verified backups it may hold copies an operator put there, which hold content
    as much. A backup's receipt sidecar holds no content and is not named; a verified
    backup is dated by its receipt, any other file by its modification time."""
    from retention.backups import backup_dir, list_backups

    folder = backup_dir()
    verified = {receipt.name: receipt.created_at.timestamp() for receipt in list_backups()}
    out = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        if path.suffix == ".json" and path.with_suffix("").name in verified:
            continue
        made = verified.get(path.name, path.stat().st_mtime)
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
