"""Physical erasure, told truthfully, and what still holds old bytes after a delete.

SQLite: `secure_delete` zeroes what is deleted, but the pages written before the delete
may sit in the write-ahead log until a checkpoint copies the zeroed pages over them and
truncates it. `wal_checkpoint(TRUNCATE)` reports busy while a reader holds a snapshot, so
it is retried with back-off; until it succeeds the receipt says "physically pending" and
the recovery job tries again every minute.

PostgreSQL: a plain VACUUM (what Compact database runs) leaves deleted bytes in the table
files; only a rewrite of the tables removes them: `manage.py finish_erasure` (VACUUM FULL of
every table a delete erases or compacts), which calls `record_compaction`. Until then the receipt says "logically
erased, physically pending" and names that command.

Backups made before the delete still hold the content, whatever the database does; so does
a WAL archive when `archive_mode` is on, and on PostgreSQL the server's own write-ahead log
files until it reuses them. The receipt names them and until when. The backups it names are
looked up again whenever it is shown (`holders_now`): one removed from the backup folder since
is shown as removed, no longer as holding the content (retention.backups.names_in_folder), and
`verify_erasure` records when it first found it gone (`record_removed_backups`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

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


def backups_before(moment: datetime, *, conversation_id: int | None = None) -> list[dict[str, Any]]:
    """Files in the backup folder made before `moment`: they hold the content until they are
    deleted. With `conversation_id`, a verified backup whose receipt says the database had not
    given out that id yet when it was made does not hold it and is not named (r35: a delete's
    receipt named backups made before its conversation existed); any other file is. The folder is the one backups are made in (`retention.backups.backup_dir`);
    besides verified backups it may hold copies an operator put there, which hold content
    as much. A backup's receipt sidecar holds no content and is not named; a verified
    backup is dated by its receipt, any other file by its modification time.

    A backup still being made counts too, under the name it will have: its copy was started
    (its file exists before the copy reads the database) while the content was still there.
    Another database's backups (a folder shared with another installation) do not: by the key
    on their receipt, or, while being made, by the key written beside the copy when it started
    (or another engine in their name).
    Lethe's backups are dated by the time in their name until their receipt is written; one
    that then fails or is cancelled is taken off the receipts again (`forget_backup`).

    A folder that is missing and cannot be created holds nothing (no backup could be made
    there); one that is there but cannot be read raises BackupFolderUnreadable, as no receipt
    may say it is empty."""
    from retention.backups import (
        NAME_PATTERN,
        TEMP_PREFIX,
        being_made_elsewhere,
        foreign_backups,
        is_receipt_sidecar,
        list_backup_folder,
        list_backups,
        readable_backup_dir,
    )

    folder = readable_backup_dir()
    if folder is None:
        return []
    listed = list_backups()
    verified = {receipt.name: receipt.created_at.timestamp() for receipt in listed}
    before_it = {receipt.name for receipt in listed if conversation_id is not None
                 and receipt.conversations_up_to is not None and conversation_id > receipt.conversations_up_to}
    foreign = foreign_backups()  # another installation's, in a folder it shares: not this content
    out = []
    for path in list_backup_folder(folder):
        name = path.name.removeprefix(TEMP_PREFIX)
        if name in foreign or (path.suffix == ".json" and path.with_suffix("").name in foreign):
            continue
        ours = bool(NAME_PATTERN.match(name))
        being_made = ours and path.name.startswith(TEMP_PREFIX)
        if not path.is_file() or (path.name.startswith(".") and not being_made):
            continue
        if ours and name not in verified and being_made_elsewhere(folder, name):
            continue  # another database's, being made (or of another engine): not this content
        if path.suffix == ".json" and (path.with_suffix("").name in verified or is_receipt_sidecar(path)):
            continue  # a backup's receipt holds no content (also once its backup was removed: r74)
        if name in before_it:
            continue
        made = verified.get(name) or (_named_time(name) if ours else None) or path.stat().st_mtime
        if made < moment.timestamp():
            out.append({"kind": "backup", "name": name,
                        "made_at": datetime.fromtimestamp(made, tz=moment.tzinfo).isoformat().replace("+00:00", "Z")})
    return out


def _named_time(name: str) -> float | None:
    """The time in a backup's name (lethe-<engine>-YYYYmmddTHHMMSSZ-...), rounded down."""
    try:
        return datetime.strptime(name.split("-")[2], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except (IndexError, ValueError):
        return None


def forget_backup(name: str) -> int:
    """A backup that was being made when deletes completed, then failed, was cancelled or was
    left behind by a killed run: it was never published, so their receipts stop naming it.
    Only deletes that completed after it was started can name it. Returns how many changed."""
    from lifecycle.models import DeleteOperation, DeleteState

    started = _named_time(name)
    ops = DeleteOperation.objects.filter(state=DeleteState.COMPLETED, receipt__isnull=False)
    if started is not None:
        ops = ops.filter(completed_at__gte=datetime.fromtimestamp(started - 1, tz=UTC))
    changed = 0
    for pk in ops.values_list("pk", flat=True):
        with transaction.atomic():
            op = DeleteOperation.objects.select_for_update().get(pk=pk)
            receipt = dict(op.receipt or {})
            kept = [h for h in receipt.get("holders", []) if not (h.get("kind") == "backup" and h.get("name") == name)]
            if len(kept) != len(receipt.get("holders", [])):
                receipt["holders"] = kept
                DeleteOperation.objects.filter(pk=pk).update(receipt=receipt)
                changed += 1
    return changed


def forget_vanished_backups(operation_id: int) -> None:
    """After a delete's receipt is committed: a backup it named while it was being made that
    is gone now (discarded meanwhile, its `forget_backup` having run before this receipt was
    committed) is taken off again."""
    from lifecycle.models import DeleteOperation
    from retention.backups import (
        NAME_PATTERN,
        TEMP_PREFIX,
        BackupFolderUnreadable,
        ever_used,
        readable_backup_dir,
    )

    receipt = DeleteOperation.objects.filter(pk=operation_id).values_list("receipt", flat=True).first() or {}
    try:
        folder = readable_backup_dir()
    except BackupFolderUnreadable:  # the folder cannot be read now: the receipt keeps naming what it named
        return
    if folder is None or not ever_used(folder):
        # missing, or no backup was made there (a disk not mounted): whether one is gone cannot
        # be told (r154: this made it, empty, and took every backup off the receipts)
        return
    for holder in receipt.get("holders", []):
        name = holder.get("name") or ""
        if holder.get("kind") == "backup" and NAME_PATTERN.match(name) and not (folder / name).exists() \
                and not (folder / (TEMP_PREFIX + name)).exists():
            forget_backup(name)


def _gone(holder: Any, present: frozenset[str] | None) -> bool:
    return (isinstance(holder, dict) and holder.get("kind") == "backup" and present is not None
            and holder.get("name") not in present)


def holders_now(holders: Any, present: frozenset[str] | None) -> tuple[list[Any], list[dict[str, Any]]]:
    """A receipt's holders as they are now, read when it is shown: what still holds the content,
    and the backups it named that are no longer in the backup folder (each with `removed_at`,
    when a check first found it gone, or None). The stored receipt keeps every backup it named at
    completion; a backup is gone only while its file is: one put back holds the content again.
    When the folder cannot be read (`present` is None) every backup named is taken as there."""
    held, removed = [], []
    for holder in holders if isinstance(holders, list) else []:
        if _gone(holder, present):
            removed.append({"name": holder.get("name"), "made_at": holder.get("made_at"),
                            "removed_at": holder.get("removed_at")})
        else:
            held.append({k: v for k, v in holder.items() if k != "removed_at"} if isinstance(holder, dict)
                        else holder)
    return held, removed


def record_removed_backups(operation_id: int, present: frozenset[str] | None, now: datetime) -> bool:
    """verify_erasure: the stored receipt dates each backup it named that is gone from the
    backup folder (`removed_at`, the first time a check finds it gone), and forgets that date for
    one put back. Nothing else of the receipt changes. Returns whether it changed."""
    from lifecycle.models import DeleteOperation

    if present is None:
        return False
    with transaction.atomic():
        op = DeleteOperation.objects.select_for_update().filter(pk=operation_id).first()
        receipt = dict(op.receipt or {}) if op else {}
        holders = receipt.get("holders")
        if not isinstance(holders, list):
            return False
        changed = []
        for holder in holders:
            if _gone(holder, present) and not holder.get("removed_at"):
                holder = {**holder, "removed_at": now.isoformat().replace("+00:00", "Z")}
            elif isinstance(holder, dict) and "removed_at" in holder and not _gone(holder, present):
                holder = {k: v for k, v in holder.items() if k != "removed_at"}
            changed.append(holder)
        if changed == holders:
            return False
        receipt["holders"] = changed
        DeleteOperation.objects.filter(pk=operation_id).update(receipt=receipt)
    return True


def wal_archive_on() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SHOW archive_mode")
        return cursor.fetchone()[0] in ("on", "always")


def holders(moment: datetime, *, physically_erased: bool, conversation_id: int | None = None) -> list[dict[str, Any]]:
    """What still holds the erased bytes (of that conversation) at `moment`, each with what ends it."""
    return (backups_before(moment, conversation_id=conversation_id)
            + database_holders(physically_erased=physically_erased))


def database_holders(*, physically_erased: bool) -> list[dict[str, Any]]:
    """What of the database server still holds erased bytes (no backups)."""
    out: list[dict[str, Any]] = []
    if not physically_erased:
        out.append({"kind": "database_files" if connection.vendor == "postgresql" else "wal"})
    if connection.vendor == "postgresql":
        # The server's write-ahead log files hold the rows as written, and (full-page images)
        # as deleted, until the server reuses those files; nothing here can see when.
        out.append({"kind": "server_wal"})
    if wal_archive_on():
        out.append({"kind": "wal_archive"})
    return out
