"""Finish the physical erasure of completed deletes that still wait for it.

SQLite: the write-ahead log checkpoint (retried with back-off), the same step the recovery
job retries every minute. PostgreSQL: a plain VACUUM leaves erased bytes in the table files,
so every table a delete erases or compacts (`registry.content_tables`: rows removed before the
delete, such as the process lease Close releases, leave bytes there too, and nothing records
where) is rewritten with `VACUUM (FULL, ANALYZE)` (a new file
for the table, its TOAST table and its indexes; the old files are removed; fresh planner
statistics), then the statistics catalog `pg_statistic` (whose old rows sampled the deleted
values) when the database user owns it, then `record_compaction` marks every receipt whose
tables were all rewritten (and, on a console of a remote engine, `remote.physical` marks its
own copy of a bound-deleted conversation's title, in the bindings' table), and the reusable
space Data & storage shows is measured again (retention.storage). The server's write-ahead log files keep copies until the server
reuses them, which Lethe cannot see: every PostgreSQL receipt names them. `VACUUM FULL`
holds an exclusive lock on one table at a time while it copies it: readers and writers of
that table wait, so run it when the console is quiet.

`VACUUM FULL` copies a deleted row into the new file while any transaction of the whole
server (any database: transaction ids are shared) could still see it. So before rewriting,
the job takes a fresh transaction id and waits (up to `HORIZON_WAIT_SECONDS`) until no other
session, prepared transaction or replication slot holds a snapshot or an id that old; if one
still does, nothing is rewritten or recorded, the deletes stay "physically pending" and the
result names how many sessions held it (the next run tries again).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from lifecycle import faults
from lifecycle.actions.record_compaction import record_compaction
from lifecycle.deletion.executor import finish_physical, unfinished_physical
from lifecycle.models import DeleteOperation, DeleteState, PhysicalState
from lifecycle.registry import content_tables


@dataclass
class RewriteResult:
    waiting: int = 0
    tables: list[str] = field(default_factory=list)
    erased: int = 0
    still_pending: int = 0
    held_by: int = 0  # PostgreSQL: sessions whose old snapshots kept the rewrite from running

    def as_dict(self) -> dict:
        return {"engine": connection.vendor, "waiting": self.waiting, "tables": self.tables,
                "erased": self.erased, "still_pending": self.still_pending, "held_by": self.held_by}


log = logging.getLogger(__name__)

HORIZON_WAIT_SECONDS = settings.ERASURE_HORIZON_WAIT  # LETHE_ERASURE_HORIZON_WAIT

# Sessions, prepared transactions and replication slots holding a transaction id or a snapshot
# at least as old as %(xid)s: while one exists, VACUUM FULL keeps the rows it could see. An
# autovacuum worker counts only while it analyzes (a lazy vacuum holds back no horizon; an
# ANALYZE samples rows under a snapshot, and the statistics rows it replaces stay visible to it).
# What keeps VACUUM FULL from dropping rows deleted before `xid`: a transaction anywhere on
# the server that began writing before it (its id is in every snapshot taken while it runs, the
# rewrite's own too), and a snapshot older than it in this database. Since PostgreSQL 14 a
# snapshot held in another database (a long read there, a pg_dump of it) holds back only that
# database's and the shared catalogs' horizon, not this one's (r35: three sessions of other
# databases kept every receipt pending); a walsender (no database, or a logical one) holds
# back every database's, as before 14 every session did.
_HOLDERS_SQL = """
SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()
            AND (backend_type <> 'autovacuum worker' OR query ILIKE '%%analyze%%') AND (
            (backend_xid IS NOT NULL AND age(backend_xid) >= age(%(xid)s::text::xid))
            OR (backend_xmin IS NOT NULL AND age(backend_xmin) >= age(%(xid)s::text::xid)
                AND (datname IS NULL OR datname = current_database() OR backend_type = 'walsender'
                     OR current_setting('server_version_num')::int < 140000))))
     + (SELECT count(*) FROM pg_prepared_xacts WHERE age(transaction) >= age(%(xid)s::text::xid))
     + (SELECT count(*) FROM pg_replication_slots WHERE xmin IS NOT NULL AND age(xmin) >= age(%(xid)s::text::xid))
"""


def _old_snapshot_holders(cursor, *, wait: float) -> int:
    """PostgreSQL: 0 once nothing can still see rows deleted before now, else how many
    holders remained after `wait` seconds."""
    # Its own transaction, committed at once; the 64-bit id's low 32 bits are the `xid` that
    # pg_stat_activity shows (the text of a 64-bit id past the first epoch is no valid xid).
    cursor.execute("SELECT (pg_current_xact_id()::text::numeric % 4294967296)::text")
    xid = cursor.fetchone()[0]
    deadline = time.monotonic() + wait
    while True:
        cursor.execute(_HOLDERS_SQL, {"xid": xid})
        held = cursor.fetchone()[0]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(0.2)


def may_rewrite_statistics(cursor) -> bool:
    cursor.execute(
        "SELECT r.rolsuper OR d.datdba = r.oid FROM pg_roles r, pg_database d"
        " WHERE r.rolname = current_user AND d.datname = current_database()"
    )
    row = cursor.fetchone()
    return bool(row and row[0])


def _measure_reusable_again() -> None:
    """The rewrite gave the tables' reusable space back to the file system: measure it again
    now, as Compact database does, so Data & storage and the API do not show the figure
    measured before (larger than the database itself) until the next `measure-database` run."""
    from retention.storage import measure_database

    try:
        measure_database()
    except DatabaseError:  # the erasure is done and recorded; the next scheduled measure corrects it
        log.exception("could not measure the reusable space after finish_erasure's rewrite")


def _waiting():
    return DeleteOperation.objects.filter(state=DeleteState.COMPLETED, physical_state=PhysicalState.PENDING)


def finish_waiting_erasures() -> RewriteResult:
    # A console of a remote engine: its own copy of a bound-deleted conversation's title.
    from remote import physical as console_copies

    result = RewriteResult(waiting=_waiting().count() + console_copies.waiting().count()
                           + console_copies.cleared_titles().count())
    if connection.vendor == "sqlite":
        for pk in unfinished_physical():
            if finish_physical(pk):
                result.erased += 1
                faults.kill_point("finish-erasure-checkpoint")  # (crash tests: between two receipts)
        result.erased += console_copies.checkpoint()
    elif result.waiting:
        if connection.in_atomic_block:
            raise RuntimeError("VACUUM cannot run inside a transaction")
        known = set(connection.introspection.table_names())
        wanted: set[str] = set()
        if _waiting().exists():
            # The receipts of earlier releases list only the tables their delete found rows in.
            wanted |= {*content_tables(), *(t for op in _waiting() for t in op.touched_tables)}
        if console_copies.waiting().exists() or console_copies.cleared_titles().exists():
            wanted |= set(console_copies.tables())
        tables = sorted(t for t in wanted if t in known)
        copies_before = console_copies.waiting_now()  # read before the rewrite: only these are erased by it
        started = timezone.now()
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            result.held_by = _old_snapshot_holders(cursor, wait=HORIZON_WAIT_SECONDS)
            if not result.held_by:
                for table in tables:
                    # ANALYZE too: the planner's statistics sample column values (ANALYZE,
                    # which autovacuum runs by itself, may have sampled the deleted ones).
                    cursor.execute(f"VACUUM (FULL, ANALYZE) {quote(table)}")
                    faults.kill_point("finish-erasure-table")
                # The statistics replaced above stay in pg_statistic's file as dead rows
                # until that catalog is rewritten too; only its owner (the database owner
                # or a superuser) may.
                statistics = may_rewrite_statistics(cursor)
                # An ANALYZE (autovacuum's) that began before the tables' own finished can still
                # see the statistics rows they replaced: wait for it, else the receipt keeps
                # naming the statistics as a holder (record_compaction).
                if statistics and _old_snapshot_holders(cursor, wait=HORIZON_WAIT_SECONDS):
                    statistics = False
                if statistics:
                    cursor.execute("VACUUM FULL pg_catalog.pg_statistic")
                    faults.kill_point("finish-erasure-statistics")
        if not result.held_by:
            result.tables = tables
            finished = timezone.now()
            result.erased = record_compaction(started_at=started, finished_at=finished, tables=tables,
                                              statistics_rewritten=statistics)
            faults.kill_point("finish-erasure-recorded")
            result.erased += console_copies.record_compaction(before=copies_before, finished_at=finished,
                                                              tables_rewritten=tables)
            if tables:
                _measure_reusable_again()
    result.still_pending = (_waiting().count() + console_copies.waiting().count()
                            + console_copies.cleared_titles().count())
    return result
