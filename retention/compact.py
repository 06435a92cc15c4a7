"""Compacting the database after a cleanup: the engine's VACUUM, with sizes before and after.

What it does per engine:
- SQLite: `VACUUM` rewrites the file without its free pages, so the file shrinks by about the
  reusable space. It holds the write lock while it runs (writers wait), and writes the whole
  database through the WAL; a `wal_checkpoint(TRUNCATE)` afterwards folds it back and empties
  the WAL before the size is measured. It needs free disk space for two copies of what the
  database holds while it runs: the temporary database VACUUM builds (in SQLite's temporary
  folder) and the WAL beside the database. It does not start unless both fit with
  `LETHE_DISK_RESERVE_BYTES` to spare (a full disk would stop the console's own writes
  too); a disk that fills up anyway ends it with the same refusal, the database unchanged.
- PostgreSQL: plain `VACUUM` of the whole database marks dead rows' space reusable for new rows
  and trims empty pages at the end of tables; it takes no lock that blocks reads or writes, so
  the files seldom shrink much. `VACUUM FULL` (which would) is never run here: it locks every
  table and waits behind any open reader, a running backup included.

Both refuse to run inside a transaction (the engines do too), so callers run it from a job or
command with the connection in autocommit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import OperationalError, connection
from django.utils.translation import gettext_noop

from lifecycle import faults
from retention.errors import CodedError, Message, sizes_short
from retention.storage import database_size, short_of_room, sqlite_pages

# SQLite's own search order on Unix after its two environment variables (only measured here)
_SQLITE_TEMP_FOLDERS = ("/var/tmp", "/usr/tmp", "/tmp")  # noqa: S108
CHECKPOINT_TRIES = 12  # backing off from 50 ms to 2 s between tries: about 15 s in all


class CompactError(CodedError):
    """Compaction could not run. `code` is stable, `message` localized when read (`text`
    keeps it untranslated: the job stores it)."""


@dataclass(frozen=True)
class CompactResult:
    before_file_bytes: int
    after_file_bytes: int
    before_reusable_bytes: int
    after_reusable_bytes: int
    seconds: float


def compact_database(on_measured: Callable[[Any], None] | None = None) -> CompactResult:
    """1. Measure the file size and reusable space (handed to `on_measured` before anything
       changes: a run killed during VACUUM, which the server may finish anyway, leaves them).
    2. Run the engine's VACUUM in autocommit (SQLite: then fold the WAL back into the file).
    3. Measure again and return both, with the seconds VACUUM took."""
    if connection.vendor not in {"sqlite", "postgresql"}:
        raise CompactError("unsupported", Message(gettext_noop("Compacting is not supported for this database.")))
    if connection.in_atomic_block:
        raise CompactError("in_transaction", Message(gettext_noop(
            "The database cannot be compacted inside a transaction.")))
    before = database_size(measure=True)
    if on_measured is not None:
        on_measured(before)
    faults.kill_point("tool-compact-measured")  # crash tests: the sizes before recorded, VACUUM not run
    started = time.monotonic()
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            _check_free_space(cursor)
            try:
                cursor.execute("VACUUM")
            except OperationalError as exc:
                if "full" not in str(exc).lower():  # SQLITE_FULL: "database or disk is full"
                    raise
                raise CompactError("no_space", Message(gettext_noop(
                    "The disk filled up while the database was being compacted; it was left as it was. Free some "
                    "space and try again."))) from exc
            _checkpoint()
        else:
            cursor.execute("VACUUM")
    seconds = time.monotonic() - started
    after = database_size(measure=True)
    return CompactResult(
        before_file_bytes=before.file_bytes,
        after_file_bytes=after.file_bytes,
        before_reusable_bytes=before.reusable_bytes,
        after_reusable_bytes=after.reusable_bytes,
        seconds=round(seconds, 3),
    )


def _checkpoint() -> None:
    """Fold the WAL into the file and truncate it; a reader holding an old snapshot makes the
    checkpoint busy, so retry for about 15 s (the size is then measured with the WAL). Each try
    waits at most 200 ms for that reader (physical.checkpoint_sqlite): a TRUNCATE checkpoint
    keeps every writer out while it waits, and with the connection's 20 s timeout each try held
    the console's writes that long (an append then failed)."""
    from lifecycle.deletion.physical import checkpoint_sqlite

    checkpoint_sqlite(tries=CHECKPOINT_TRIES)



def sqlite_temp_dir() -> Path | None:
    """The folder SQLite puts a temporary database in (VACUUM's copy): on Unix the first of
    SQLITE_TMPDIR, TMPDIR, /var/tmp, /usr/tmp, /tmp and the working folder that is a folder
    this process can write to; None when the connection keeps temporary databases in memory."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA temp_store")
        if cursor.fetchone()[0] == 2:  # MEMORY
            return None
    for candidate in (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"), *_SQLITE_TEMP_FOLDERS, "."):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    return None


def _check_free_space(cursor) -> None:
    """SQLite: refuse (code `no_space`) unless the disks hold VACUUM's two copies of the
    database's pages in use, with DISK_RESERVE_BYTES left on each: one in the temporary
    folder, one in the WAL beside the database (both on the same disk when they share it)."""
    page_size, pages, free_pages = sqlite_pages(cursor)
    in_use = (pages - free_pages) * page_size
    home = Path(str(connection.settings_dict["NAME"])).resolve().parent
    needs = {home.stat().st_dev: [home, in_use]}
    temp = sqlite_temp_dir()
    if temp is not None:
        needs.setdefault(temp.stat().st_dev, [temp, 0])[1] += in_use
    for folder, needed in needs.values():
        short = short_of_room(folder, needed)
        if short is not None:
            free, reserve = short
            free_size, needed_size, reserve_size = sizes_short(free, needed, reserve)
            raise CompactError("no_space", Message(gettext_noop(
                "Compacting needs about %(needed)s of free space in %(folder)s and %(reserve)s to spare; "
                "%(free)s is free. Nothing was changed."
            ), {"needed": needed_size, "folder": folder, "reserve": reserve_size, "free": free_size}))
