"""What an erasure does to one store, by retention class: measure, then change.

`measure` is read-only and its figures are committed before `erase` runs (or with it, in the
same transaction), so a step that is resumed after a crash keeps the figures of what was
there. `erase` is idempotent: it changes only what is still there to change, in batches,
each batch its own transaction.

On PostgreSQL a table without content columns is measured by its own delete (the rows it
removed, in the same transaction): `erase_counted`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from lifecycle import fleet
from lifecycle.deletion import files
from lifecycle.enginefs import EngineHome
from lifecycle.models import Conversation
from lifecycle.registry import RetentionClass, Store

BATCH_ROWS = 2000  # the first batch; later ones are sized to take about BATCH_SECONDS
MAX_BATCH_ROWS = 50000
# PostgreSQL: a later batch finds its rows through an index that still lists every row the
# earlier batches deleted, each a visit to a dead tuple; fewer, larger batches visit fewer.
PG_MAX_BATCH_ROWS = 200000
BATCH_SECONDS = 0.1
# PostgreSQL locks only the rows being deleted (a fenced conversation's, which nobody else
# writes), so its batches can be longer; they only bound a transaction and mark progress.
PG_BATCH_SECONDS = 0.5
# SQLite has one writer at a time: between batches the erasure steps aside so a foreground
# append gets the lock (IMPLEMENTATION-NOTES section 6). A batch holds the lock for about
# BATCH_SECONDS, so a waiting writer waits about that long, not for the whole erasure. A
# batch far shorter than that (the first, small one) is not followed by a pause: the pause
# comes once the lock was held for SQLITE_PAUSE_AFTER since the last one.
SQLITE_PAUSE = 0.01
SQLITE_PAUSE_AFTER = BATCH_SECONDS / 2


def one_transaction_rows() -> int:
    """Up to this many rows a table step measures, changes and is marked done in one
    transaction: one batch's worth (on PostgreSQL its largest batch, which only bounds a
    transaction; on SQLite the first batch, which keeps the lock short)."""
    return BATCH_ROWS if connection.vendor == "sqlite" else PG_MAX_BATCH_ROWS


@dataclass
class Measure:
    records: int = 0
    bytes: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


# Inside `relaxed_commits`, the connection (one per thread) keeps the session's own
# synchronous_commit under this attribute, to restore it for a durable transaction.
RELAXED = "lethe_synchronous_commit"


def _relaxed() -> str | None:
    return getattr(connection, RELAXED, None)


@contextlib.contextmanager
def erasure_transaction() -> Iterator[None]:
    """A transaction of the erasure. On PostgreSQL its commit does not wait for the WAL flush:
    each erasure transaction changes a store and records that together, and is idempotent, so
    one lost in a crash is simply done again. The intent and the completion commit durably."""
    top = not connection.in_atomic_block
    with transaction.atomic():
        if top and connection.vendor == "postgresql" and _relaxed() is None:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


@contextlib.contextmanager
def relaxed_commits() -> Iterator[None]:
    """For a run of the erasure on PostgreSQL: the session's commits do not wait for the WAL
    flush (one setting, instead of one per erasure transaction); back to the session's own setting
    afterwards. What must commit durably inside (the completion) uses `durable_transaction`."""
    if connection.vendor != "postgresql" or connection.in_atomic_block or _relaxed() is not None:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        own = cursor.fetchone()[0]
        cursor.execute("SET synchronous_commit TO OFF")
    setattr(connection, RELAXED, own)
    try:
        yield
    finally:
        setattr(connection, RELAXED, None)
        # A connection that broke takes its session setting with it.
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', %s, false)", [own])


@contextlib.contextmanager
def durable_transaction() -> Iterator[None]:
    """A transaction whose commit waits for the WAL flush, even inside `relaxed_commits`.

    SQLite runs with `synchronous=NORMAL`: a commit survives the process but not a power
    loss. Here the commit syncs the write-ahead log (`synchronous=FULL`, which SQLite lets
    change only outside a transaction), and with it every commit before it, which the log
    holds in order."""
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            own = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous = FULL")
        try:
            with transaction.atomic():
                yield
        finally:
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute(f"PRAGMA synchronous = {int(own)}")
        return
    with transaction.atomic():
        if (own := _relaxed()) is not None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('synchronous_commit', %s, true)", [own])
        yield


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _size(column: str) -> str:
    """Bytes of the column's value as text (UTF-8; JSON in its text form)."""
    if connection.vendor == "sqlite":
        return f"COALESCE(LENGTH(CAST({_q(column)} AS BLOB)), 0)"
    return f"COALESCE(octet_length({_q(column)}::text), 0)"


def _holding_content(store: Store) -> str:
    return "(" + " OR ".join(f"{_q(c)} IS NOT NULL" for c in store.content_columns()) + ")"


def _table_measure(store: Store, conversation_id: int, *, only_content: bool) -> Measure:
    columns = store.content_columns()
    known = dict(store.sized_by)  # sizes computed when the row was written: no need to read the value
    size = " + ".join(_q(known[c]) if c in known else _size(c) for c in columns) if columns else "0"
    where = f"{_q(store.lookup)} = %s"
    if only_content:
        where += " AND " + _holding_content(store)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), COALESCE(SUM({size}), 0) FROM {_q(store.db_table)} WHERE {where}",
                       [conversation_id])
        count, total = cursor.fetchone()
    return Measure(int(count), int(total))


def _batches(sql: str, params: list, renew: Callable[[], None]) -> int:
    """Run a statement that changes at most `limit` rows (its LIMIT placeholder) until it changes
    none, each run its own transaction, sizing runs to about BATCH_SECONDS each."""
    changed, limit, held = 0, BATCH_ROWS, 0.0
    while True:
        started = time.monotonic()
        with erasure_transaction(), connection.cursor() as cursor:
            cursor.execute(sql, [*params, limit])
            n = cursor.rowcount
        changed += n
        if n < limit:
            return changed
        took = time.monotonic() - started
        renew()
        target = BATCH_SECONDS if connection.vendor == "sqlite" else PG_BATCH_SECONDS
        most = MAX_BATCH_ROWS if connection.vendor == "sqlite" else PG_MAX_BATCH_ROWS
        limit = max(500, min(most, int(limit * target / max(took, 1e-3))))
        held += took
        if connection.vendor == "sqlite" and held >= SQLITE_PAUSE_AFTER:
            time.sleep(SQLITE_PAUSE)
            held = 0.0


def _pk(store: Store) -> str:
    return _q(store.model_class._meta.pk.column)


# ---- Per class ------------------------------------------------------------------------------


def measure(store: Store, conversation: Conversation, home: EngineHome) -> Measure:
    if store.kind == "file":
        if store.shared_file:
            rows = fleet.stored_children(store.paths(home, conversation)[0], conversation.public_id)
            # The bytes the rows take in the file as it holds them (a runtime's raw UTF-8 is
            # not Lethe's escaped form). No agent ids in the figures: the step's detail
            # outlives the rows, and the ids are text the runtime wrote.
            return Measure(len(rows), fleet.row_bytes(rows))
        count, size = files.usage(home, store.paths(home, conversation)[0])
        return Measure(count, size)
    if store.tombstone:
        m = _table_measure(store, conversation.pk, only_content=False)
        return Measure(1 if m.bytes else 0, m.bytes)
    if store.retention == RetentionClass.ERASE:
        return _table_measure(store, conversation.pk, only_content=False)
    if store.retention == RetentionClass.COMPACT:
        return _table_measure(store, conversation.pk, only_content=True)
    rows = store.rows(conversation)
    if store.retention == RetentionClass.SHARED:
        revocable = rows.filter(publisher_supports_revoke=True, revoked_at__isnull=True).count()
        remaining = rows.filter(publisher_supports_revoke=False).count()
        return Measure(revocable, 0, {"remaining": remaining})
    return Measure(rows.count(), 0)  # retain-detach: the link is cut, the file stays


def empty_measure(store: Store) -> Measure:
    """What `measure` gives for a table store holding no row of the conversation."""
    return Measure(0, 0, {"remaining": 0}) if store.retention == RetentionClass.SHARED else Measure()


def tables_holding(tables: list[Store], conversation: Conversation) -> set[str]:
    """Which of these table stores hold any row of the conversation: one query for all."""
    if not tables:
        return set()
    parts = [f"SELECT {n} FROM (SELECT 1 FROM {_q(s.db_table)} WHERE {_q(s.lookup)} = %s LIMIT 1) AS t{n}"
             for n, s in enumerate(tables)]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), [conversation.pk] * len(tables))
        return {tables[row[0]].key for row in cursor.fetchall()}


def row_counts(tables: list[Store], conversation_id: int) -> dict[str, int]:
    """Each table store's number of rows of the conversation: one query for all."""
    if not tables:
        return {}
    parts = [f"SELECT {n}, COUNT(*) FROM {_q(s.db_table)} WHERE {_q(s.lookup)} = %s" for n, s in enumerate(tables)]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), [conversation_id] * len(tables))
        return {tables[n].key: int(count) for n, count in cursor.fetchall()}


def erase(store: Store, conversation: Conversation, home: EngineHome, renew: Callable[[], None],
          checkpoint: Callable[[], None], *, whole: bool = False) -> int | None:
    """Change the store for this conversation; `checkpoint` runs after the first change.
    `whole`: the caller's transaction takes all of it (at most `one_transaction_rows()`), so
    an erased table's rows go in one plain statement, not in batches; returns how many."""
    table = _q(store.db_table) if store.kind == "table" else ""
    if store.kind == "file":
        path = store.paths(home, conversation)[0]
        if store.shared_file:
            fleet.compact(home, path, conversation.public_id)
        else:
            files.remove_folder(home, path)
    elif store.tombstone:
        blank = ", ".join(f"{_q(c)} = ''" for c in store.content_columns())
        with erasure_transaction(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET {blank} WHERE {_q(store.lookup)} = %s", [conversation.pk])
    elif store.retention == RetentionClass.ERASE and whole:
        with erasure_transaction(), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE {_q(store.lookup)} = %s", [conversation.pk])
            deleted = cursor.rowcount
        checkpoint()
        return deleted
    elif store.retention == RetentionClass.ERASE:
        # The rows of one batch by their physical address on PostgreSQL (a TID scan), by
        # primary key on SQLite.
        where = f"WHERE {_q(store.lookup)} = %s LIMIT %s"
        sql = (f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} {where}))"
               if connection.vendor == "postgresql"
               else f"DELETE FROM {table} WHERE {_pk(store)} IN (SELECT {_pk(store)} FROM {table} {where})")
        _batches_with_checkpoint(sql, [conversation.pk], renew, checkpoint)
        return None
    elif store.retention == RetentionClass.COMPACT:
        cleared = ", ".join(f"{_q(c)} = NULL" for c in store.content_columns())
        _batches_with_checkpoint(
            f"UPDATE {table} SET {cleared} WHERE {_pk(store)} IN (SELECT {_pk(store)} FROM {table} "
            f"WHERE {_q(store.lookup)} = %s AND {_holding_content(store)} LIMIT %s)",
            [conversation.pk], renew, checkpoint,
        )
        return None
    elif store.retention == RetentionClass.SHARED:
        store.rows(conversation).filter(publisher_supports_revoke=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    elif store.retention == RetentionClass.RETAIN_DETACH:
        store.rows(conversation).update(**{store.lookup: None})
    checkpoint()
    return None


class _TooMany(Exception):
    def __init__(self, figures: Measure) -> None:
        super().__init__()
        self.figures = figures


def counted_by_delete(store: Store) -> bool:
    """A table whose figures its own delete gives, on PostgreSQL: it has no content columns
    (no bytes to sum), so its records are the rows the delete removed, with no read before
    it. Not on SQLite: a table there goes in one statement only when it is known beforehand
    to be small (the write lock is held meanwhile), so it is counted first anyway."""
    return (connection.vendor == "postgresql" and store.kind == "table" and store.retention == RetentionClass.ERASE
            and not store.tombstone and not store.content_columns())


def erase_counted(store: Store, conversation: Conversation, home: EngineHome,
                  checkpoint: Callable[[], None]) -> tuple[Measure, bool]:
    """Delete the table's rows of the conversation in one plain statement and take its figures
    from it (`counted_by_delete`). Must run inside the step's transaction, which records the
    figures and commits: the count is exactly what the delete removed, and a crash loses
    both together. Returns the figures and whether the rows are gone: a table holding more
    rows than one transaction takes (`one_transaction_rows`) has its statement undone, and
    the caller commits the figures and erases in batches."""
    try:
        with transaction.atomic():
            deleted = erase(store, conversation, home, renew=lambda: None, checkpoint=checkpoint, whole=True)
            figures = Measure(deleted or 0)
            if figures.records > one_transaction_rows():
                raise _TooMany(figures)
    except _TooMany as too_many:
        return too_many.figures, False
    return figures, True


def _batches_with_checkpoint(sql: str, params: list, renew, checkpoint) -> None:
    first = True

    def renew_and_checkpoint() -> None:
        nonlocal first
        if first:
            first = False
            checkpoint()
        renew()

    _batches(sql, params, renew_and_checkpoint)
    if first:
        checkpoint()
