from __future__ import annotations

from datetime import datetime

from django.db import transaction

from lifecycle.models import DeleteOperation, DeleteState, PhysicalState


def record_compaction(*, started_at: datetime, finished_at: datetime, tables, statistics_rewritten: bool = True) -> int:
    """A compaction rewrote `tables` between `started_at` and `finished_at`: every completed
    delete that finished before it started and touched only those tables is physically
    erased as of `finished_at`. Without `statistics_rewritten` (PostgreSQL's statistics
    catalog could not be rewritten) the receipt names it as a holder. Returns how many
    receipts changed; running it twice changes nothing more."""
    rewritten = set(tables)
    changed = 0
    with transaction.atomic():
        candidates = DeleteOperation.objects.select_for_update().filter(
            state=DeleteState.COMPLETED, physical_state=PhysicalState.PENDING, completed_at__lt=started_at
        )
        for op in candidates:
            if not set(op.touched_tables) <= rewritten:
                continue
            receipt = dict(op.receipt or {})
            receipt["holders"] = [h for h in receipt.get("holders", []) if h.get("kind") not in ("database_files", "wal")]
            if not statistics_rewritten and not any(h.get("kind") == "statistics" for h in receipt["holders"]):
                receipt["holders"].append({"kind": "statistics"})
            DeleteOperation.objects.filter(pk=op.pk).update(
                physical_state=PhysicalState.ERASED, physically_erased_at=finished_at, receipt=receipt
            )
            changed += 1
    return changed
