"""Finish the physical erasure of completed deletes that still wait for it.

SQLite: the write-ahead log checkpoint (retried with back-off), the same step the recovery
job retries every minute. PostgreSQL: a plain VACUUM leaves erased bytes in the table files,
so each table a waiting delete touched is rewritten with `VACUUM FULL` (a new file for the
table, its TOAST table and its indexes; the old files are removed), then
`record_compaction` marks every receipt whose tables were all rewritten. `VACUUM FULL`
holds an exclusive lock on one table at a time while it copies it: readers and writers of
that table wait, so run it when the console is quiet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone

from lifecycle.actions.record_compaction import record_compaction
from lifecycle.deletion.executor import finish_physical, unfinished_physical
from lifecycle.models import DeleteOperation, DeleteState, PhysicalState


@dataclass
class RewriteResult:
    waiting: int = 0
    tables: list[str] = field(default_factory=list)
    erased: int = 0
    still_pending: int = 0

    def as_dict(self) -> dict:
        return {"engine": connection.vendor, "waiting": self.waiting, "tables": self.tables,
                "erased": self.erased, "still_pending": self.still_pending}


def _waiting():
    return DeleteOperation.objects.filter(state=DeleteState.COMPLETED, physical_state=PhysicalState.PENDING)


def finish_waiting_erasures() -> RewriteResult:
    result = RewriteResult(waiting=_waiting().count())
    if connection.vendor == "sqlite":
        result.erased = sum(1 for pk in unfinished_physical() if finish_physical(pk))
    elif result.waiting:
        if connection.in_atomic_block:
            raise RuntimeError("VACUUM cannot run inside a transaction")
        known = set(connection.introspection.table_names())
        tables = sorted({t for op in _waiting() for t in op.touched_tables if t in known})
        started = timezone.now()
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"VACUUM FULL {quote(table)}")
        result.tables = tables
        result.erased = record_compaction(started_at=started, finished_at=timezone.now(), tables=tables)
    result.still_pending = _waiting().count()
    return result
