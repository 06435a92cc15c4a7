"""Physical erasure of this console's own copy of a conversation deleted on its engine.

A console of a remote engine holds one piece of an engine conversation's content: the copy
of its title in the binding (`EngineBinding.title`, for the list). Its other records of a
bound delete hold none: the `BoundDelete` row and its keys (ids, the raw thread id, the
engine's receipt, which is content-free), and the audit facts (ids). The request clears the
title and the acknowledgement deletes the binding, so no row holds it any more; but the old
row versions are still in the database's files, as after a delete on the embedded engine
(lifecycle.deletion.physical):

- SQLite: in the write-ahead log until a checkpoint succeeds. The acknowledgement tries it
  (retried with back-off while a reader keeps it busy); the minute sweep tries again.
- PostgreSQL: in the table files of TABLES, and in the planner's samples, until
  `manage.py finish_erasure` rewrites them (a plain VACUUM, Compact database, does not).

Until then a completed bound delete is "physically pending"; its page and API say so and
name what still holds the copy (`console_copy`), as an embedded delete's receipt does.

A conversation deleted on the engine by other means (another console, the engine's own API)
is found deleted by a read of the engine's list, which clears the title here: its old bytes
are in the same files, so the binding is marked (`EngineBinding.copy_pending_since`) and
erased by the same checkpoint or rewrite, and Engine conversations says so until then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from lifecycle.deletion import physical
from lifecycle.models import PhysicalState
from lifecycle.serializers import iso
from remote.models import BoundDelete, BoundDeleteState, EngineBinding
from retention.errors import BackupFolderUnreadable

log = logging.getLogger(__name__)


def tables() -> list[str]:
    """The tables that held the copy: rewritten by finish_erasure while a delete waits."""
    return [EngineBinding._meta.db_table]


# Pending deletes marked erased per statement after a checkpoint: one SQL variable each, well
# under SQLite's limit (32,766 on many builds, 999 on old ones).
ERASED_BATCH = 500


def waiting() -> QuerySet[BoundDelete]:
    """Completed deletes whose copy is still in the files. A Completed one with no physical
    state was acknowledged by a server still running the code from before remote 0004 (a
    rolling upgrade; the migration made every earlier one pending): its copy is as pending."""
    return BoundDelete.objects.filter(Q(physical_state=PhysicalState.PENDING) | Q(physical_state=""),
                                      state=BoundDeleteState.COMPLETED)


def cleared_titles() -> QuerySet[EngineBinding]:
    """Bindings whose title a read cleared (deleted on the engine by other means), still in the files."""
    return EngineBinding.objects.filter(copy_pending_since__isnull=False)


def checkpoint() -> int:
    """SQLite: checkpoint the write-ahead log; the deletes completed before it (and the titles
    cleared before it) are physically erased. Returns how many (0 while a reader keeps it busy:
    they stay pending)."""
    if connection.vendor != "sqlite":
        return 0
    # Read before the checkpoint: only these were committed before it (a completion time is
    # taken before its commit, so no bound on it would tell).
    pks = list(waiting().order_by("pk").values_list("pk", flat=True))
    titles = list(cleared_titles().order_by("pk").values_list("pk", flat=True))
    if not (pks or titles) or not physical.checkpoint_sqlite():
        return 0
    now, erased = timezone.now(), 0
    with transaction.atomic():
        for start in range(0, len(pks), ERASED_BATCH):
            erased += waiting().filter(pk__in=pks[start:start + ERASED_BATCH]).update(
                physical_state=PhysicalState.ERASED, physically_erased_at=now)
        for start in range(0, len(titles), ERASED_BATCH):
            erased += cleared_titles().filter(pk__in=titles[start:start + ERASED_BATCH]).update(
                copy_pending_since=None)
    return erased


@dataclass(frozen=True)
class Waiting:
    """What waited, read before a rewrite begins: only these were committed before it (r77: a
    title a read cleared while the rewrite ran was marked erased by a time taken when the read
    began, its old row in the new table file)."""

    deletes: tuple[int, ...]
    titles: tuple[tuple[int, datetime], ...]  # (binding, when its title was cleared)


def waiting_now() -> Waiting:
    return Waiting(tuple(waiting().order_by("pk").values_list("pk", flat=True)),
                   tuple(cleared_titles().order_by("pk").values_list("pk", "copy_pending_since")))


def record_compaction(*, before: Waiting, finished_at: datetime, tables_rewritten) -> int:
    """PostgreSQL: `tables_rewritten` were rewritten (finish_erasure) after `before` was read:
    the deletes and cleared titles it names are physically erased (a title cleared again since,
    by a later read, is not)."""
    if not set(tables()) <= set(tables_rewritten):
        return 0
    erased = 0
    with transaction.atomic():
        deletes = list(before.deletes)
        for start in range(0, len(deletes), ERASED_BATCH):
            erased += waiting().filter(pk__in=deletes[start:start + ERASED_BATCH]).update(
                physical_state=PhysicalState.ERASED, physically_erased_at=finished_at)
        for pk, since in before.titles:
            erased += cleared_titles().filter(pk=pk, copy_pending_since=since).update(copy_pending_since=None)
    return erased


def console_copy(op: BoundDelete) -> dict[str, Any] | None:
    """A completed delete: whether this console's copy is physically erased, and what still
    holds it (backups of this console made before the delete, the database's files or log until
    then, the server's WAL files, a WAL archive, the planner's samples where they could not be
    rewritten)."""
    if op.state != BoundDeleteState.COMPLETED:
        return None
    erased = op.physical_state == PhysicalState.ERASED
    state = PhysicalState.ERASED if erased else PhysicalState.PENDING  # "": acknowledged by older code
    try:
        holders = physical.backups_before(op.completed_at)
    except BackupFolderUnreadable as exc:  # never "no backup": name the folder that cannot be read
        holders = [{"kind": "backup_folder", "name": exc.filename or ""}]
    holders += physical.database_holders(physically_erased=erased)
    if erased and connection.vendor == "postgresql":
        from lifecycle.deletion.rewrite import may_rewrite_statistics

        with connection.cursor() as cursor:
            if not may_rewrite_statistics(cursor):
                holders.append({"kind": "statistics"})
    return {"engine": connection.vendor,
            "physical": {"state": state, "erased_at": iso(op.physically_erased_at)},
            "holders": holders}
