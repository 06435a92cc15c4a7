"""Whole-database backups taken before a tool payload cleanup, and their verification.

What a backup is: a copy of the whole database in the engine's own format (an SQLite file, or a
`pg_dump -Fc` archive), in `LETHE_BACKUP_DIR` (default `var/backups/`, mode 0700, files 0600),
named `lethe-<vendor>-<UTC time>-<6 hex>.<sqlite3|dump>`, with a JSON receipt beside it
(`<name>.json`: name, size, SHA-256, time, vendor, database).

What makes it trustworthy: a copy is written under a `.tmp-` name, checked (SQLite:
`PRAGMA integrity_check`; PostgreSQL: every block read back with `pg_restore -f /dev/null` and
the archive's database name compared with the configured one), hashed, flushed to disk and
only then renamed; the receipt is written last, atomically. Only a backup with a receipt is
listed, so a listed backup is always complete and verified. A run killed at any line leaves at
most a `.tmp-` file (or an archive without a receipt); the next run removes it, under a lock
on the folder so it never removes the file of a run that is still alive.

What it does not do: fill the disk. A backup keeps `LETHE_DISK_RESERVE_BYTES` (256 MiB) free
on the backup folder's disk (where the database often lives too, and a database that cannot
write its log stops): SQLite checks that what is left to copy fits before it starts and at
every step, PostgreSQL checks the free space while pg_dump writes and once it has exited;
both check again once the copy is verified, before it is published. Either stops with
`no_space` and keeps nothing; so does a disk that fills up anyway (a write fails for lack of
room: something else wrote meanwhile, or SQLite's side files did not fit).

What it is not: incremental, encrypted or copied elsewhere. It holds every conversation as it
was, including content that a later cleanup or deletion removes; an operator who restores it
brings that content back and loses everything written after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from console import libpq
from lifecycle import faults
from lifecycle.moments import EARLIEST, LATEST
from retention.errors import BackupFolderUnreadable, CodedError, Message, os_reason, sizes_short
from retention.storage import short_of_room

log = logging.getLogger(__name__)

# Pages copied per step of the SQLite online backup: small enough that cancel and progress
# answer within a fraction of a second, large enough that steps cost nothing noticeable.
SQLITE_STEP_PAGES = 1024
# Where Debian and Ubuntu install the PostgreSQL client tools of each major version.
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
POLL_SECONDS = 0.1
# A write that fails with less than this left free above the reserve failed for lack of room
# (SQLite says only "disk I/O error" when its -shm file cannot grow, pg_dump the system's text).
FULL_DISK_SLACK = 1 << 20
# SQLite's primary result codes (the low byte of an extended code)
SQLITE_IOERR, SQLITE_FULL = 10, 13
# How pg_dump ends a write that found no room: strerror(ENOSPC) and strerror(EDQUOT), in the C locale
NO_ROOM_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
# A tool's session ended under it (a server restart or failover, an ended session):
# libpq's and the server's words (the tools run with LC_MESSAGES=C, so these are English).
# (Not a connection refused at the start: that is a setting to correct, said in the tool's words.)
LOST_CONNECTION_TEXTS = ("server closed the connection unexpectedly", "terminating connection due to",
                         "no connection to the server", "SSL connection has been closed unexpectedly",
                         "the database system is shutting down")
UNREACHABLE = gettext_noop(
    "The database could not be reached during the backup, so it stopped. Retry once the database answers again.")
EXTENSIONS = {"sqlite": ".sqlite3", "postgresql": ".dump"}
NAME_PATTERN = re.compile(r"^lethe-(sqlite|postgresql)-\d{8}T\d{6}Z-[0-9a-f]{6}\.(sqlite3|dump)$")
TEMP_PREFIX = ".tmp-"
LOCK_NAME = ".lock"

Progress = Callable[[int, int | None], None]
DAMAGED = gettext_noop("The backup copy is damaged: %(error)s")
NOT_WRITTEN = gettext_noop(
    "The backup could not be written in %(folder)s: %(error)s. Nothing was kept. Check that Lethe can create "
    "that folder and write in it, or set LETHE_BACKUP_DIR to another folder.")
UNREADABLE = gettext_noop("The backup archive could not be read: %(error)s")
FILLED_UP = gettext_noop(
    "The disk that holds %(folder)s filled up while the backup was being written. Nothing was kept. Free some "
    "space, or set LETHE_BACKUP_DIR to a folder on another disk.")


class BackupError(CodedError):
    """A backup could not be made or does not check out. `code` is stable, `message` localized
    when read (`text` keeps it untranslated: jobs store it)."""


@dataclass(frozen=True)
class BackupReceipt:
    name: str
    path: Path
    size: int
    sha256: str
    created_at: datetime
    vendor: str
    database: str
    # The published file's modification time (receipts written since 2026-12-03 have it).
    mtime_ns: int | None = None
    # The backup operation (its id: a backup is an operation of its own, before the cleanup that
    # waits for it) that made it, when a job made it (receipts since 2026-12-04).
    operation: int | None = None
    # Where the database it was made from is, as a key (`database_key`; receipts since
    # 2026-12-05): a folder may hold another installation's backups too.
    database_key: str | None = None
    # The highest conversation id the database had given out once the copy was made (receipts
    # since 2026-12-06): a conversation with a higher id is not in it (its delete receipt does
    # not name this backup as holding its content).
    conversations_up_to: int | None = None
    # Listing only: the file on disk no longer has the receipt's size or modification time.
    changed: bool = False

    def as_json(self) -> dict:
        data = {
            "name": self.name,
            "size": self.size,
            "sha256": self.sha256,
            "created_at": self.created_at.isoformat(),
            "vendor": self.vendor,
            "database": self.database,
        }
        if self.mtime_ns is not None:
            data["mtime_ns"] = self.mtime_ns
        if self.operation is not None:
            data["operation"] = self.operation
        if self.database_key is not None:
            data["database_key"] = self.database_key
        if self.conversations_up_to is not None:
            data["conversations_up_to"] = self.conversations_up_to
        return data


class _Cancelled(Exception):
    pass


def _configured(name: str) -> str | Path | None:
    """A Django setting of that name, else the environment variable (settings.py does not
    declare these two, so operators set them in the environment; it refuses a value with a
    blank at its start or end). A blank variable is unset, as every other (r114: "  " was a
    folder named two spaces in the project folder)."""
    return getattr(settings, name, None) or (os.environ.get(name) or "").strip() or None


# ---- The folder -------------------------------------------------------------------------


def configured_backup_dir() -> Path:
    """The backup folder's path, whether or not it exists: the `LETHE_BACKUP_DIR` setting or
    environment variable, else a `BACKUP_DIR` setting (an older name), else `VAR_DIR/backups`.

    A relative folder is taken from the project folder, as settings take ENGINE_HOME and
    DATABASE_URL: the job cluster and a command started elsewhere (`verify_erasure` writes
    what this folder holds on receipts) must see one folder."""
    configured = _configured("LETHE_BACKUP_DIR") or getattr(settings, "BACKUP_DIR", None)
    directory = Path(configured) if configured else Path(settings.VAR_DIR) / "backups"
    return directory if directory.is_absolute() else Path(settings.BASE_DIR) / directory


def backup_dir() -> Path:
    """The backup folder (`configured_backup_dir`), created owner-only when missing; OSError
    when it cannot be. Deletion receipts read this same folder (lifecycle.deletion.physical).

    A folder that exists keeps its mode: it is the operator's (a shared folder with a group,
    or a sticky bit), and the status, which reads it every second while something runs, must
    change nothing. Every file a backup writes in it is owner-only (0600) whatever its mode."""
    directory = configured_backup_dir()
    if not directory.is_dir():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def readable_backup_dir() -> Path | None:
    """The backup folder to read; None when it is missing (nothing to read; a read creates
    nothing: r149, the status made an empty folder on a host that lacked the shared one, and the
    receipts then said their backups were gone from it). Something there that cannot be used as
    the folder raises BackupFolderUnreadable: it may hold backups this process cannot see."""
    directory = configured_backup_dir()
    try:
        if directory.is_dir():
            return directory
        if not os.path.lexists(directory):
            return None
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    except OSError as exc:
        raise BackupFolderUnreadable(exc.errno, exc.strerror, str(directory)) from exc


def ever_used(directory: Path) -> bool:
    """Whether a backup was ever made in the folder: every backup leaves its lock file there
    (`_folder_lock`), and an operator removing old backups leaves it. A folder without it holds
    no backup Lethe made: an empty mount point of a disk not mounted, another host's empty
    folder. Whether one of Lethe's backups is gone from the folder is told only in a folder where
    one was made (r156: such a folder said every backup was gone, and the erasure check dated
    their removal). (What a folder holds is read in any: an operator's own copy there is named
    as holding a conversation.)"""
    return os.path.lexists(directory / LOCK_NAME)


def list_backup_folder(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError as exc:
        raise BackupFolderUnreadable(exc.errno, exc.strerror, str(directory)) from exc


def _not_written(directory: Path, error: OSError) -> BackupError:
    """`io_error`, naming the folder and the system's reason: a bare OSError reached the job as
    an unexpected error, which told the admin nothing and the log no path."""
    return BackupError("io_error", Message(NOT_WRITTEN, {"folder": directory, "error": os_reason(error)}))


@contextlib.contextmanager
def _writing_in(directory: Path) -> Iterator[None]:
    """OSError raised inside becomes `_not_written`."""
    try:
        yield
    except OSError as error:
        raise _not_written(directory, error) from error


@contextlib.contextmanager
def _folder_lock(directory: Path) -> Iterator[None]:
    """One backup at a time per folder. The kernel drops the lock when its process dies, so a
    killed run never blocks the next one."""
    with _writing_in(directory):
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError("busy", Message(gettext_noop(
                "Another backup is being made. Try again when it has finished."))) from None
        yield
    finally:
        os.close(fd)


def _no_space(directory: Path, free: int, needed: int, reserve: int) -> BackupError:
    """`needed`: the bytes the copy still has to write (all of it before it starts), not what is
    missing (r93: "28.8 MB more needed" of a copy of 28.8 MB with 3 MB free)."""
    free_size, needed_size, reserve_size = sizes_short(free, needed, reserve)
    return BackupError("no_space", Message(gettext_noop(
        "There is not enough free disk space for the backup in %(folder)s: %(free)s free, %(needed)s still "
        "to write and %(reserve)s kept free for the database. Nothing was kept. Free some space, or set "
        "LETHE_BACKUP_DIR to a folder on another disk."
    ), {"folder": directory, "free": free_size, "needed": needed_size, "reserve": reserve_size}))


def _ensure_room(directory: Path, still_to_write: int = 0) -> None:
    """Raise `no_space` unless the folder's disk holds `still_to_write` more bytes with
    DISK_RESERVE_BYTES left free."""
    short = short_of_room(directory, still_to_write)
    if short is not None:
        raise _no_space(directory, short[0], still_to_write, short[1])


def _ensure_room_kept(copy: Path) -> None:
    """Raise `no_space` when the disk that holds `copy`, written, is below DISK_RESERVE_BYTES
    free: a PostgreSQL archive written between two checks (a small database, all of it), or
    something else that wrote meanwhile. The figures are the disk's without the copy, which the
    caller discards: free with its size added back, and its size needed."""
    short = short_of_room(copy.parent, 0)
    if short is not None:
        size = copy.stat().st_size
        raise _no_space(copy.parent, short[0] + size, size, short[1])


def _disk_filled(directory: Path) -> bool:
    """After a failed write: the folder's disk has less than FULL_DISK_SLACK free above the
    reserve, so the write failed for lack of room (measured before the copy is discarded)."""
    try:
        return short_of_room(directory, FULL_DISK_SLACK) is not None
    except OSError:
        return False


def _filled_up(directory: Path) -> BackupError:
    """`no_space` for a write that failed for lack of room (the figures at the check before it
    showed room: the copy's own side files, or another writer, took it)."""
    return BackupError("no_space", Message(FILLED_UP, {"folder": directory}))


def _remove_leftovers(directory: Path) -> None:
    """Remove what a killed run left: temp files, and archives whose receipt was never written
    (a receipt is the last step, so such an archive was never reported as made)."""
    for path in directory.iterdir():
        killed_mid_copy = path.name.startswith(TEMP_PREFIX)
        killed_before_receipt = bool(NAME_PATTERN.match(path.name)) and not _receipt_path(path).exists()
        if killed_mid_copy or killed_before_receipt:
            path.unlink(missing_ok=True)
            named = path.name.removeprefix(TEMP_PREFIX)
            if NAME_PATTERN.match(named):  # never published: receipts that named it stop naming it
                from lifecycle.deletion.physical import forget_backup

                forget_backup(named)


def _receipt_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".json")


def _owner_path(directory: Path, name: str) -> Path:
    """Beside a backup being made: the temporary name its receipt is written under."""
    return directory / (TEMP_PREFIX + name + ".json")


def database_key(of=None) -> str:
    """Which database this is, as a key: its engine and the SQLite file's absolute path, or the
    PostgreSQL server's own identifier (set when its cluster was made, the same however a host
    reaches it) and the database name. No two installations have the same; a database restored
    in place (the file copied back, or the dump restored into the same database) keeps it, and
    one restored elsewhere is another database (which counts its original's backups as its own
    through the engine folder's mark: `own_keys`). Nothing stored: a key
    kept in the database itself would be lost with a restore of a backup made before it."""
    of = of or connection  # (a migration's own connection)
    if of.vendor == "sqlite":
        return location_key(of)
    settings_dict = of.settings_dict
    cached = (settings_dict.get("HOST"), settings_dict.get("PORT"), settings_dict["NAME"])
    if cached not in _SERVER_IDS:
        try:
            with transaction.atomic(using=of.alias), of.cursor() as cursor:  # (a savepoint inside another)
                cursor.execute("SELECT system_identifier::text FROM pg_control_system()")
                _SERVER_IDS[cached] = str(cursor.fetchone()[0])
        except DatabaseError:  # a server that does not say (a hosted one may not): where it is reached
            _SERVER_IDS[cached] = None
    server = _SERVER_IDS[cached]
    if server is None:
        return location_key(of)
    return hashlib.sha256(f"{of.vendor}\0server {server}/{settings_dict['NAME']}".encode()).hexdigest()[:32]


# The PostgreSQL server's identifier by (host, port, database) as settings name them, read once
# per process; None where the server does not say.
_SERVER_IDS: dict[tuple, str | None] = {}


def location_key(of=None) -> str:
    """Where the database is reached, as a key: the SQLite file's absolute path (its folder's
    links resolved, not the file's own: the restore steps move the name aside, and a link there
    goes with it, r32), or the PostgreSQL host, port and database name as DATABASE_URL gives
    them. PostgreSQL receipts written before `database_key` read the server's identifier bear
    this one."""
    of = of or connection
    settings_dict = of.settings_dict
    if of.vendor == "sqlite":
        named = Path(str(settings_dict["NAME"]))
        where = str(named.absolute().parent.resolve() / named.name)
    else:
        where = f"{settings_dict.get('HOST') or 'localhost'}:{settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"
    return hashlib.sha256(f"{of.vendor}\0{where}".encode()).hexdigest()[:32]


def earlier_keys(of=None) -> set[str]:
    """The keys this database's receipts may bear from earlier releases: its location's, and for
    a SQLite file reached through a link, the link's target's (keys once resolved it)."""
    of = of or connection
    keys = {location_key(of)}
    if of.vendor == "sqlite":
        target = str(Path(str(of.settings_dict["NAME"])).resolve())
        keys.add(hashlib.sha256(f"sqlite\0{target}".encode()).hexdigest()[:32])
    return keys


def own_keys() -> frozenset[str]:
    """The keys whose backups hold this database's content: its own (`database_key`), and those
    of the database it is a copy of (restored from its backup into another database, or moved),
    as recorded with the engine folder's mark (lifecycle.engine_folder), even once it took the
    folder over. A backup of the original holds everything the copy had when it was made."""
    from lifecycle.engine_folder import recorded_keys

    keys = {database_key(), *earlier_keys()}
    if found := recorded_keys():
        keys.update(key for key in [found[0], *(found[1] or [])] if isinstance(key, str) and key)
    return frozenset(keys)


# A receipt (or the note beside a backup being made) larger than this is not one Lethe wrote.
SIDECAR_MAX_BYTES = 64 * 1024


def _read_sidecar(path: Path) -> object:
    """A sidecar's JSON, or None when it is missing, too large or not JSON (another installation
    or anyone who can write in the folder may have put anything there: never an error here)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(SIDECAR_MAX_BYTES + 1)
        if len(raw) > SIDECAR_MAX_BYTES:
            return None
        return json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _write_owner(directory: Path, name: str) -> None:
    fd = os.open(_owner_path(directory, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"name": name, "database_key": database_key()}, handle)


def being_made_elsewhere(directory: Path, name: str) -> bool:
    """Whether the backup `name`, being made (its copy still under its temporary name), is
    another database's: another engine's by its name, or another database's by the key
    written beside it when it started."""
    match = NAME_PATTERN.match(name)
    if match is None:
        return False
    if match.group(1) != connection.vendor:
        return True
    owner = _read_sidecar(_owner_path(directory, name))
    if not isinstance(owner, dict):
        return False  # (a copy started before owners were written: counted, as it may be this one's)
    key = owner.get("database_key")
    return isinstance(key, str) and key not in own_keys()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _write_receipt(receipt: BackupReceipt) -> None:
    final = _receipt_path(receipt.path)
    temp = final.with_name(TEMP_PREFIX + final.name)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(receipt.as_json(), handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, final)
    _fsync_dir(final.parent)


def _read_receipt(archive: Path) -> BackupReceipt | None:
    """The receipt beside `archive`, or None when it is missing or does not describe it."""
    data = _read_sidecar(_receipt_path(archive))
    try:
        created_at = datetime.fromisoformat(data["created_at"])
        receipt = BackupReceipt(
            name=str(data["name"]),
            path=archive,
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            created_at=created_at,
            vendor=str(data["vendor"]),
            database=str(data["database"]),
            mtime_ns=int(data["mtime_ns"]) if data.get("mtime_ns") is not None else None,
            operation=int(data["operation"]) if data.get("operation") is not None else None,
            database_key=str(data["database_key"]) if data.get("database_key") is not None else None,
            # Only a whole number Lethe could have written: anything else (true, a float, text, a
            # negative) says nothing, and the backup is taken to hold every conversation.
            conversations_up_to=(data["conversations_up_to"] if type(data.get("conversations_up_to")) is int
                                 and data["conversations_up_to"] >= 0 else None),
        )
    except (ValueError, KeyError, TypeError, OverflowError):  # (a size of Infinity, say)
        return None
    if receipt.name != archive.name or created_at.tzinfo is None or not re.fullmatch(r"[0-9a-f]{64}", receipt.sha256):
        return None
    if not EARLIEST <= created_at <= LATEST:  # (r46: year 1 or 9999 failed the page in far time zones)
        return None
    return receipt


def is_receipt_sidecar(path: Path) -> bool:
    """Whether `path` is a readable receipt of a Lethe backup (a sidecar, which holds no content),
    whether or not its backup is still beside it."""
    archive = path.with_suffix("")
    return path.suffix == ".json" and bool(NAME_PATTERN.match(archive.name)) and _read_receipt(archive) is not None


def _configured_database() -> str:
    if connection.vendor == "sqlite":
        return Path(str(connection.settings_dict["NAME"])).name
    return str(connection.settings_dict["NAME"])


# ---- Public functions ---------------------------------------------------------------------


def list_backups() -> list[BackupReceipt]:
    """This database's backups with a readable receipt, newest first. Temp files, archives
    without a receipt and another database's backups (`foreign_backups`) are never listed. A
    file whose size or modification time is no longer the receipt's is listed as `changed` (its
    checksum is not read here: the status is read every second while something runs;
    verify_backup reads it). A folder that is missing and cannot be created holds no backups:
    the status reads on, and the backup that tries to write there says why it cannot."""
    ours, _foreign = _receipts()
    return ours


def foreign_backups() -> frozenset[str]:
    """The names of the backups in the folder whose receipt says another database made them
    (another installation sharing the folder): not this database's to list, restore, or name as
    holding its deleted content."""
    return frozenset(receipt.name for receipt in _receipts()[1])


def _receipts() -> tuple[list[BackupReceipt], list[BackupReceipt]]:
    """The backups with a readable receipt, this database's and other databases', newest first.
    A receipt from before the key was written is this database's when its engine and database
    name are this one's."""
    directory = readable_backup_dir()
    if directory is None:
        return [], []
    is_ours = _ownership()
    receipts = []
    for path in list_backup_folder(directory):
        if NAME_PATTERN.match(path.name) and path.is_file() and (receipt := _read_receipt(path)):
            try:
                found = path.stat()
            except OSError:
                continue
            changed = found.st_size != receipt.size or (
                receipt.mtime_ns is not None and found.st_mtime_ns != receipt.mtime_ns)
            receipts.append(replace(receipt, changed=changed) if changed else receipt)
    receipts.sort(key=lambda r: (r.created_at, r.name), reverse=True)
    ours = [r for r in receipts if is_ours(r)]
    return ours, [r for r in receipts if r not in ours]


def _ownership() -> Callable[[BackupReceipt], bool]:
    """Whether a receipt is this database's, the keys read once (a listing asks it of every
    receipt; verify_backup of one). A backup is this database's when its receipt bears one of
    its keys (its own, its earlier releases', or, for a copy, its original's: a PostgreSQL copy
    has another database name), or, on a receipt from before the key, when its engine and
    database name are this one's."""
    keys, vendor, database = own_keys(), connection.vendor, _configured_database()
    direct = {database_key(), *earlier_keys()}

    def is_ours(receipt: BackupReceipt) -> bool:
        if receipt.vendor != vendor:
            return False
        if receipt.database_key is None:
            return receipt.database == database
        # This database's own keys name its database too: a receipt with one of them that
        # names another database is not one Lethe wrote (a copy's original had its own name).
        return receipt.database_key in keys and (receipt.database == database or receipt.database_key not in direct)

    return is_ours


def create_backup(*, should_cancel: Callable[[], bool] = lambda: False, progress: Progress | None = None,
                  operation: int | None = None) -> BackupReceipt:
    """Back up the whole database and return its receipt.

    1. Take the folder lock and remove what a killed run left behind.
    2. Copy the database to a `.tmp-` file (SQLite online backup from its own connection, or
       `pg_dump -Fc`), asking `should_cancel()` between steps; `progress(done, total)` gets
       pages (SQLite) or archive bytes with total None (PostgreSQL).
    3. Verify the copy, hash it, flush it to disk and rename it to its final name.
    4. Write the receipt atomically (naming `operation`, the job's operation, when given).
       Until then the backup is not listed.

    Any failure or cancel removes the temp file and raises BackupError (code "cancelled" for
    a cancel); nothing is published.
    """
    if connection.vendor not in EXTENSIONS:
        raise BackupError("unsupported", Message(gettext_noop("Backups are not supported for this database.")))
    if connection.in_atomic_block:
        # SQLite: the request's own write transaction would keep the copy waiting forever.
        raise BackupError("in_transaction", Message(gettext_noop(
            "A backup cannot start inside a database transaction.")))
    directory = configured_backup_dir()
    with _writing_in(directory):
        backup_dir()
    with _folder_lock(directory):
        with _writing_in(directory):
            _remove_leftovers(directory)
        vendor = connection.vendor
        # Microseconds kept in the receipt: two backups in one second still sort.
        created_at = datetime.now(UTC)
        name = f"lethe-{vendor}-{created_at:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}{EXTENSIONS[vendor]}"
        final = directory / name
        temp = directory / (TEMP_PREFIX + name)
        try:
            # Whose backup is being made, before there is a copy (the receipt's own temporary
            # name; the receipt itself replaces it): a delete of another database sharing this
            # folder does not name this copy as holding its content (lifecycle.deletion.physical).
            _write_owner(directory, name)
            if should_cancel():
                raise _Cancelled
            if vendor == "sqlite":
                _copy_sqlite(temp, should_cancel, progress)
                _check_sqlite(temp)
            else:
                _dump_postgresql(temp, should_cancel, progress)
                _check_postgresql(temp, _configured_database(), should_cancel)
            given_out = _conversations_given_out()  # read after the copy: every one in it is at most this
            sha256, size = _sha256(temp)
            faults.kill_point("tool-backup-copied")  # crash tests: a whole copy, not published
            if should_cancel():
                raise _Cancelled
            _ensure_room_kept(temp)  # the disk may have filled up while the copy was verified
            temp.chmod(0o600)
            _fsync_file(temp)
            os.replace(temp, final)
            _fsync_dir(directory)
            receipt = BackupReceipt(name, final, size, sha256, created_at, vendor, _configured_database(),
                                    mtime_ns=final.stat().st_mtime_ns, operation=operation,
                                    database_key=database_key(), conversations_up_to=given_out)
            _write_receipt(receipt)
            faults.kill_point("tool-backup-published")  # crash tests: published, its job not told
            return receipt
        except _Cancelled:
            _discard(temp, final)
            raise BackupError("cancelled", Message(gettext_noop(
                "The backup was cancelled; nothing was kept."))) from None
        except BackupError:
            _discard(temp, final)
            raise
        except BaseException as exc:
            filled = isinstance(exc, OSError) and exc.errno in {errno.ENOSPC, errno.EDQUOT}
            _discard(temp, final)
            if filled:
                raise _filled_up(directory) from exc
            if isinstance(exc, sqlite3.Error):
                raise BackupError("copy_failed", Message(gettext_noop(
                    "The database could not be copied: %(error)s"), {"error": exc})) from exc
            if isinstance(exc, OSError):
                raise _not_written(directory, exc) from exc
            raise


def _conversations_given_out() -> int | None:
    """The highest conversation id the database has given out so far (its id sequence, which
    never goes back, unlike the highest id still there), or None when it cannot say."""
    from lifecycle.models import Conversation

    table = Conversation._meta.db_table
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
                row = cursor.fetchone()
                return int(row[0]) if row else None  # no id given out yet, or none counted: every one
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            sequence = cursor.fetchone()[0]
            if sequence is None:
                return None
            cursor.execute(f"SELECT last_value, is_called FROM {sequence}")  # noqa: S608 (the catalog's own name)
            last, called = cursor.fetchone()
            return int(last) if called else int(last) - 1
    except DatabaseError:
        log.warning("the conversation id sequence could not be read; the backup is taken to hold every one")
        return None


def clear_leftovers() -> bool:
    """Remove what a killed run left in the backup folder (a whole unpublished copy of the
    database can be there: see _remove_leftovers) now, rather than at the next backup; False
    when a backup is being made meanwhile (its lock is held), which removes them itself."""
    directory = configured_backup_dir()
    if not directory.is_dir():
        return True
    try:
        with _folder_lock(directory), _writing_in(directory):
            _remove_leftovers(directory)
    except BackupError as exc:
        if exc.code == "busy":
            return False
        raise
    return True


def names_in_folder() -> frozenset[str] | None:
    """The names in the backup folder now, one listing (a backup being made counts under the
    name it will have), for pages and receipts that say whether past backups are still there (an
    operator may remove old ones; Lethe never does). None when that cannot be told: the folder is
    missing (a disk not mounted looks exactly like a folder emptied) or cannot be read. Nothing is
    created."""
    folder = configured_backup_dir()
    try:
        if not folder.is_dir() or not ever_used(folder):
            return None
        return frozenset(path.name.removeprefix(TEMP_PREFIX) for path in folder.iterdir())
    except OSError:
        return None


def still_there(name: str, names: frozenset[str] | None) -> bool | None:
    """Whether the backup `name`, its file and its receipt, is among `names` (names_in_folder);
    None when the folder could not be read."""
    if names is None:
        return None
    return name in names and _receipt_path(Path(name)).name in names


def made_by(operation: int) -> BackupReceipt | None:
    """The listed, unchanged backup whose receipt names that operation, if any: a backup job
    that published its copy and then lost its run (killed before it recorded the success),
    or, after a restore from that very copy, the job the copy shows running."""
    return next((r for r in list_backups() if r.operation == operation and not r.changed), None)


def verify_backup(name: str) -> BackupReceipt:
    """Check a listed backup again: its size and SHA-256 against the receipt, then the copy
    itself (integrity check, or a full read of the archive and its database name)."""
    directory = configured_backup_dir()  # a folder that is not there holds no backup: not made for this
    if not NAME_PATTERN.match(name):
        raise BackupError("not_found", Message(gettext_noop("There is no backup with that name.")))
    archive = directory / name
    receipt = _read_receipt(archive) if archive.is_file() else None
    if receipt is None:
        raise BackupError("not_found", Message(gettext_noop("There is no backup with that name.")))
    if not _ownership()(receipt):
        raise BackupError("wrong_database", Message(gettext_noop("This backup was made from another database.")))
    sha256, size = _sha256(archive)
    if (sha256, size) != (receipt.sha256, receipt.size):
        raise BackupError("checksum_mismatch", Message(gettext_noop(
            "The backup file changed since it was made: its checksum no longer matches.")))
    if receipt.vendor == "sqlite":
        _check_sqlite(archive)
    else:
        _check_postgresql(archive, receipt.database, lambda: False, every_table=False)
    return receipt


@dataclass(frozen=True)
class RestorePart:
    """A piece of a restore paragraph: words, or a command to type (`code`)."""

    text: str
    code: bool = False

    @property
    def words(self) -> list[str]:
        """A command's words: a page keeps each whole (a line may break after a hyphen)."""
        return self.text.split()


def _with_commands(sentence: str, **commands: str) -> list[RestorePart]:
    """A translated sentence with %(name)s places for commands, as words and commands apart."""
    parts = []
    for n, piece in enumerate(re.split(r"%\((\w+)\)s", sentence)):
        if n % 2:
            parts.append(RestorePart(commands[piece], code=True))
        elif piece:
            parts.append(RestorePart(piece))
    return parts


def restore_paragraphs(vendor: str) -> list[list[RestorePart]]:
    """How an operator restores a backup of this engine, localized: paragraphs of words and
    commands (a page shows each command as code; `restore_instructions` is the plain text)."""
    warning = _(
        "A restore replaces the whole database with the backup: everything written after the "
        "backup was made is lost, and anything removed since then comes back."
    )
    # migrate: a backup made before an upgrade has the older schema (r20: the console's pages
    # then failed until someone ran it)
    if vendor == "sqlite":
        steps = _with_commands(_(
            "Stop the console and the job cluster. Move the current database file aside together "
            "with the files next to it whose names end in -wal and -shm (after an unclean stop they "
            "hold its latest writes), then copy the backup file in its place and run %(migrate)s (a "
            "backup made before an upgrade has an older schema). Start the console and the job "
            "cluster again."
        ), migrate="manage.py migrate")
    else:
        command = "pg_restore --no-owner --dbname={} {}".format(_("<new database>"), _("<backup file>"))
        # adopt: the restored database is a copy, which must take the engine folder from the
        # one set aside (r30: both said it was theirs, and both erased in it)
        steps = _with_commands(_(
            "Stop the console and the job cluster. Create an empty database, restore the backup "
            "into it with %(command)s, point DATABASE_URL at it and run %(migrate)s (a backup made "
            "before an upgrade has an older schema), then %(adopt)s: the engine folder becomes the "
            "restored database's, and the database set aside no longer erases in it. Then start the "
            "console and the job cluster again."
        ), command=command, migrate="manage.py migrate",
            adopt="manage.py engine_folder --adopt --take-from-other-database")
    # r50: the card named the deletes only, and a token revoked since worked again after a
    # restore made by it; the database set aside holds every conversation and no receipt names it
    deletes = _with_commands(_(
        "Conversations deleted after the backup come back too, and so do API tokens revoked, users "
        "deactivated and passwords changed since. Before you restore, note the deletes requested after "
        "the backup was made (the Operations page) and those account and token changes; once restored, "
        "redo the changes before anyone signs in, delete each conversation again, then have an operator "
        "run this (the operations guide gives every step): %(command)s"
    ), command="manage.py verify_erasure --all")
    set_aside = _(
        "The database you set aside still holds every conversation as it was, and no later deletion "
        "receipt names it: remove it once you no longer need its receipts."
    )
    cleanup = _(
        "Tool details removed after the backup come back, and the next cleanup removes them again "
        "while Automatic cleanup is on: to keep them, start the console alone first, turn Automatic "
        "cleanup off, then start the job cluster."
    )
    return [steps, [RestorePart(warning)], deletes, [RestorePart(set_aside)], [RestorePart(cleanup)]]


def restore_instructions(vendor: str) -> str:
    """How an operator restores a backup of this engine (plain text, localized)."""
    return "\n\n".join("".join(part.text for part in paragraph) for paragraph in restore_paragraphs(vendor))


# ---- SQLite -----------------------------------------------------------------------------


def _copy_sqlite(temp: Path, should_cancel: Callable[[], bool], progress: Progress | None) -> None:
    """Online backup from a connection of its own, never the caller's: a write transaction on
    the caller's connection would make every step busy. The source holds one read transaction
    for the whole copy, so it reads one snapshot and other connections' commits neither block
    nor restart it (WAL lets them write meanwhile)."""
    source_path = str(connection.settings_dict["NAME"])
    source = sqlite3.connect(source_path, isolation_level=None, timeout=20)
    target = sqlite3.connect(temp, isolation_level=None)
    try:
        os.chmod(temp, 0o600)
        source.execute("BEGIN")
        source.execute("SELECT count(*) FROM sqlite_master").fetchone()
        page_size = source.execute("PRAGMA page_size").fetchone()[0]
        _ensure_room(temp.parent, source.execute("PRAGMA page_count").fetchone()[0] * page_size)

        def step(status: int, remaining: int, total: int) -> None:
            if progress is not None:
                progress(total - remaining, total)
            if should_cancel():
                raise _Cancelled
            _ensure_room(temp.parent, remaining * page_size)

        source.backup(target, pages=SQLITE_STEP_PAGES, progress=step)
        source.execute("COMMIT")
        # One self-contained file: no -wal beside the copy.
        target.execute("PRAGMA journal_mode=DELETE").fetchone()
    except sqlite3.Error as exc:
        # A full disk: SQLITE_FULL, or an I/O error (an -shm file that cannot grow) with no
        # room left. Measured now, with the partial copy still on the disk.
        primary = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if primary == SQLITE_FULL or (primary == SQLITE_IOERR and _disk_filled(temp.parent)):
            raise _filled_up(temp.parent) from exc
        raise
    finally:
        target.close()
        source.close()
        _remove_side_files(temp)


def _remove_side_files(copy: Path) -> None:
    """The -wal, -shm and -journal files SQLite made beside a copy (the copy is in DELETE mode
    once whole, so none belongs to a published backup)."""
    for suffix in ("-wal", "-shm", "-journal"):
        Path(str(copy) + suffix).unlink(missing_ok=True)


def _check_sqlite(path: Path) -> None:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [row[0] for row in db.execute("PRAGMA integrity_check(20)")]
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise BackupError("verify_failed", Message(DAMAGED, {"error": exc})) from exc
    if rows != ["ok"]:
        raise BackupError("verify_failed", Message(DAMAGED, {"error": "; ".join(rows)}))


# ---- PostgreSQL -------------------------------------------------------------------------


def _tool_version(binary: str) -> int | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout  # noqa: S603
    except OSError:
        return None
    match = re.search(r"\)\s+(\d+)", out)
    return int(match.group(1)) if match else None


def _pg_tools() -> tuple[str, str]:
    """pg_dump and pg_restore of one installation, at least as new as the server.

    `LETHE_PG_BIN_DIR`, when set, is the only place looked at; otherwise PATH, then
    /usr/lib/postgresql/<major>/bin, preferring the server's major version."""
    server_major = connection.pg_version // 10000
    configured = _configured("LETHE_PG_BIN_DIR")
    if configured:
        directories = [str(configured)]
    else:
        on_path = shutil.which("pg_dump")
        directories = ([str(Path(on_path).parent)] if on_path else []) + sorted(glob.glob(PG_BIN_GLOB), reverse=True)
    found = []
    for directory in directories:
        dump, restore = Path(directory) / "pg_dump", Path(directory) / "pg_restore"
        if os.access(dump, os.X_OK) and os.access(restore, os.X_OK):
            major = _tool_version(str(dump))
            if major is not None:
                found.append((major, str(dump), str(restore)))
    usable = [tool for tool in found if tool[0] >= server_major]
    if not usable:
        if found:
            raise BackupError("tool_too_old", Message(
                gettext_noop("The database server is version %(server)s but the newest pg_dump found is version "
                             "%(tool)s. Install the client tools of version %(server)s or newer."),
                {"server": server_major, "tool": max(tool[0] for tool in found)},
            ))
        raise BackupError("tool_missing", Message(
            gettext_noop("pg_dump and pg_restore were not found (looked in %(places)s). Install the database client "
                         "tools, or set LETHE_PG_BIN_DIR to the folder that holds them."),
            {"places": ", ".join(directories) or "PATH"},
        ))
    exact = [tool for tool in usable if tool[0] == server_major]
    chosen = (exact or sorted(usable))[0]
    return chosen[1], chosen[2]


def _die_with_parent() -> None:
    """Runs in the child before exec: if the job process is SIGKILLed, the kernel kills the
    tool too, so no orphan keeps writing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run(args: list[str], env: dict | None, should_cancel: Callable[[], bool], on_tick: Callable[[], None] | None = None) -> tuple[int, str]:
    """Run a tool, polling `should_cancel`; a cancel kills it. Returns (exit code, stderr)."""
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(  # noqa: S603
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, env=full_env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        try:
            while process.poll() is None:
                if should_cancel():
                    raise _Cancelled
                if on_tick is not None:
                    on_tick()
                time.sleep(POLL_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        errors.seek(0)
        return process.returncode, errors.read().decode("utf-8", "replace").strip()


def _connection_args(tool: str, parameters: list[str]) -> tuple[list[str], dict]:
    """The tool's command line and environment to connect as Lethe does: host, port, user and
    database on the command line, the password and DATABASE_URL's parameters (sslmode,
    sslrootcert, connect_timeout...) in its environment, never on the command line."""
    args, env = connection.client.settings_to_cmd_args_env(connection.settings_dict, parameters)
    args[0] = tool
    # Its messages in English whatever the locale (LOST_CONNECTION_TEXTS; an empty LC_ALL is unset)
    return args, {**(env or {}), **libpq.environment(connection.settings_dict["OPTIONS"]), "LC_ALL": "",
                  "LC_MESSAGES": "C"}


def _dump_postgresql(temp: Path, should_cancel: Callable[[], bool], progress: Progress | None) -> None:
    dump, _restore = _pg_tools()
    _ensure_room(temp.parent)
    # Created empty and owner-only first, so the archive is never readable by others.
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    args, env = _connection_args(dump, ["--format=custom", "--no-password", f"--file={temp}"])

    def tick() -> None:
        _ensure_room(temp.parent)  # the archive's size is not known before it is written
        if progress is not None:
            with contextlib.suppress(OSError):
                progress(temp.stat().st_size, None)

    code, errors = _run(args, env, should_cancel, tick)
    if code != 0:
        # Its own words for a full disk are the system's, in the server's language: the disk
        # measured before the archive is discarded tells too. Its text is not logged (it can
        # quote anything the server said).
        if any(text in errors for text in NO_ROOM_TEXTS) or _disk_filled(temp.parent):
            raise _filled_up(temp.parent)
        if any(text in errors for text in LOST_CONNECTION_TEXTS):  # (r97: pg_dump's own English words)
            raise BackupError("database_unavailable", Message(UNREACHABLE))
        raise BackupError("dump_failed", Message(gettext_noop("pg_dump failed: %(error)s"), {"error": errors or code}))
    _ensure_room_kept(temp)  # written whole between two ticks, or after the last one


def _check_postgresql(path: Path, database: str, should_cancel: Callable[[], bool], *, every_table: bool = True) -> None:
    """The archive names `database`, holds data for every table of the project (checked when
    it is made; a later upgrade may add tables an older backup cannot have), and every block
    of it reads back (`--list` alone reads only the table of contents)."""
    _dump, restore = _pg_tools()
    try:
        listing = subprocess.run(  # noqa: S603
            [restore, "--list", str(path)], capture_output=True, text=True, timeout=600, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BackupError("verify_failed", Message(UNREADABLE, {"error": exc})) from exc
    if listing.returncode != 0:
        raise BackupError("verify_failed", Message(UNREADABLE, {"error": listing.stderr.strip()}))
    header = re.search(r"^;\s+dbname:\s*(.*)$", listing.stdout, re.MULTILINE)
    if header is None or header.group(1).strip() != database:
        raise BackupError("wrong_database", Message(
            gettext_noop("The backup archive is of database %(found)s, not %(expected)s."),
            {"found": header.group(1).strip() if header else "?", "expected": database},
        ))
    with_data = set(re.findall(r"^\d+;\s.*\bTABLE DATA \S+ (\S+) ", listing.stdout, re.MULTILINE))
    expected = set(connection.introspection.django_table_names(only_existing=True)) if every_table else set()
    missing = sorted(expected - with_data)
    if missing:
        raise BackupError("verify_failed", Message(
            gettext_noop("The backup archive lacks the data of %(tables)s."), {"tables": ", ".join(missing[:5])},
        ))
    code, errors = _run([restore, "--file=/dev/null", str(path)], None, should_cancel)
    if code != 0 or "error" in errors.lower():
        raise BackupError("verify_failed", Message(UNREADABLE, {"error": errors or code}))


def _discard(temp: Path, final: Path) -> None:
    from lifecycle.deletion.physical import forget_backup

    temp.unlink(missing_ok=True)
    _remove_side_files(temp)
    _owner_path(final.parent, final.name).unlink(missing_ok=True)
    if not _receipt_path(final).exists():
        final.unlink(missing_ok=True)
        # Deletes that completed while it was being made named it as holding their content
        forget_backup(final.name)
