"""The engine's receipts of completed bound deletes, read again while facts they keep expire.

A completed bound delete stores the receipt as the engine gave it when the delete completed.
The engine keeps some content-free facts (audit, usage, billing) for a period after the delete,
then removes them and marks them `expired` (with the date) on its own receipt. Without reading
again, this console would go on showing those facts as kept.

So the hourly job `remote-hourly` reads again, through `GET /v1/operations/{id}`, the
receipts whose `receipt_next_read_at` is due (at most BATCH a run, the longest due first): a
day after the delete completed, then every READ_EVERY while the receipt still keeps a fact
whose store expires (`still_expiring`), for at most the longest period there is; after that,
never again (`receipt_next_read_at` None).

What is taken from the engine's answer: only a receipt of the same delete (the same
conversation and operation, completed) that differs from the stored one in its kept facts
alone, each either unchanged or changed from kept to expired (`later_receipt`). Anything else
(the erased figures changed, a kept fact back, another shape) is not stored: it is logged and
read again a READ_EVERY later. An engine that cannot be reached ends the run (the rest wait
for the next hour); one that no longer knows the operation (restored from an older backup) is
asked again a READ_EVERY later. Reading twice changes nothing: the job is safe to run anywhere
at any time, and a run killed between two deletes leaves each either read or still due.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from lifecycle.deletion.presentation import receipt_rows
from lifecycle.engine.http import EngineCredentialsRefused, EngineUnreachable
from lifecycle.errors import ActionRefused
from lifecycle.models import RetainedFactsPolicy
from remote.models import BoundDelete, BoundDeleteState

log = logging.getLogger(__name__)

BATCH = 100
READ_EVERY = timedelta(days=1)
# No period is longer (RetainedFactsPolicy.MAX_DAYS): a receipt still keeping facts that long
# after its delete comes from an engine that does not mark them, and is not read again.
LONGEST = timedelta(days=RetainedFactsPolicy.MAX_DAYS + 1)


def still_expiring(receipt: Any) -> bool:
    """Whether the receipt keeps facts of a store whose period runs out (audit, usage, billing):
    a kept entry of such a store with records (or a count not given). An entry of none has
    nothing that can expire: the engine never marks it."""
    kept = receipt.get("kept") if isinstance(receipt, dict) else None
    return any(row["action"] == "kept" and row["expires"] and row["records"] != 0 for row in receipt_rows(kept))


def first_read_at(receipt: Any, completed_at: datetime) -> datetime | None:
    """When a receipt stored at completion is first read again (None: it keeps nothing that expires)."""
    return completed_at + READ_EVERY if still_expiring(receipt) else None


def _entries(receipt: dict, name: str) -> list:
    value = receipt.get(name, [])
    return value if isinstance(value, list) else []


def later_receipt(stored: Any, answered: Any) -> bool:
    """Whether `answered` is the stored receipt later on: the same in all but its kept facts, and
    each kept fact the same or changed from kept to expired (with a date), nothing added or gone."""
    if not isinstance(stored, dict) or not isinstance(answered, dict):
        return False
    others = set(stored) | set(answered)
    if any(stored.get(name) != answered.get(name) for name in others - {"kept"}):
        return False
    before, after = _entries(stored, "kept"), _entries(answered, "kept")
    if len(before) != len(after):
        return False
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if not (isinstance(old, dict) and isinstance(new, dict) and old.get("action") == "kept"
                and new.get("action") == "expired" and isinstance(new.get("expired_at"), str)):
            return False
        if {k: v for k, v in new.items() if k not in ("action", "expired_at")} != \
                {k: v for k, v in old.items() if k != "action"}:
            return False
    return True


def due(now: datetime | None = None) -> list[int]:
    now = now or timezone.now()
    return list(BoundDelete.objects.filter(receipt_next_read_at__lte=now, state=BoundDeleteState.COMPLETED)
                .order_by("receipt_next_read_at", "pk").values_list("pk", flat=True)[:BATCH])


def read_again(now: datetime | None = None) -> dict[str, int]:
    """One run: read the due receipts again. Returns counts by outcome."""
    from remote.delivery import EngineNotConfigured, engine_for

    now = now or timezone.now()
    counts = {"updated": 0, "unchanged": 0, "settled": 0, "not_taken": 0, "unreachable": 0}
    engines: dict[str, Any] = {}
    for pk in due(now):
        op = BoundDelete.objects.filter(pk=pk, receipt_next_read_at__lte=now).first()
        if op is None:
            continue
        if not still_expiring(op.receipt) or op.completed_at < now - LONGEST:  # never asked again
            _done(op, receipt_next_read_at=None)
            counts["settled"] += 1
            continue
        if op.engine_url in engines and engines[op.engine_url] is None:
            continue  # that engine could not be reached in this run
        try:
            if op.engine_url not in engines:
                engines[op.engine_url] = engine_for(op.engine_url)
            view = engines[op.engine_url].operation(op.engine_operation)
        except (EngineNotConfigured, EngineUnreachable, EngineCredentialsRefused) as exc:
            log.info("receipt of %s not read again: %s", op.public_id, getattr(exc, "code", type(exc).__name__))
            engines[op.engine_url] = None
            counts["unreachable"] += 1
            continue
        except ActionRefused as exc:  # the engine no longer knows the operation, or refuses the read
            log.warning("receipt of %s not read again: the engine answered %s", op.public_id, exc.code)
            _done(op, receipt_next_read_at=now + READ_EVERY)
            counts["not_taken"] += 1
            continue
        receipt = view.data.get("receipt")
        if (view.id != op.engine_operation or view.target != op.engine_id
                or view.state != BoundDeleteState.COMPLETED or not later_receipt(op.receipt, receipt)):
            log.warning("receipt of %s: the engine's answer was not taken (not this delete's receipt, later on)",
                        op.public_id)
            _done(op, receipt_next_read_at=now + READ_EVERY)
            counts["not_taken"] += 1
            continue
        changed = receipt != op.receipt
        _done(op, receipt=receipt, receipt_read_at=now,
              receipt_next_read_at=now + READ_EVERY if still_expiring(receipt) else None)
        counts["updated" if changed else "unchanged"] += 1
    return counts


def _done(op: BoundDelete, **fields) -> None:
    """Store what this read found, unless another run read it first (its due time moved)."""
    BoundDelete.objects.filter(pk=op.pk, receipt_next_read_at=op.receipt_next_read_at).update(**fields)
