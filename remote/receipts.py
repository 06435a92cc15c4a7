"""The engine's receipts of completed bound deletes, read again while facts they keep expire.

A completed bound delete stores the receipt as the engine gave it when the delete completed.
The engine keeps some content-free facts (audit, usage, billing) for a period after the delete,
then removes them and marks them `expired` (with the date) on its own receipt. Without reading
again, this console would go on showing those facts as kept.

So the hourly job `remote-hourly` reads again, through `GET /v1/operations/{id}`, the receipts
whose `receipt_next_read_at` is due (at most BATCH reads a run, the longest due first), and
only while the receipt keeps facts of a store whose period runs out (`expiring`), for at most
the longest period there is. When it is read next (`next_read`): where the engine gave each
such store's period (`days`, as it stood at completion), just after the first of those
periods runs out (SLACK: the engine's own expiry runs hourly), but no later than LONGEST_WAIT
from now (an admin of the engine may shorten a period meanwhile, down to a day, and the engine
then removes those facts within the hour: a page must not say "kept" for up to a year after);
otherwise, or once that time has passed and the engine still keeps them (a period made longer
since), after a wait that doubles from FIRST_WAIT up to LONGEST_WAIT. A receipt is then read
at most about monthly, not daily: the page says when it was last read ("Receipt as the engine
reported it on ...").

What is taken from the engine's answer (`later_receipt`): a receipt of the same delete (the
same conversation and operation, completed) whose erased figures and engine are the stored
ones and whose kept facts are each unchanged or changed from kept to expired (with a date);
its other parts (physical erasure, holders, verification) as the engine reports them now.
Anything else is not stored: it is logged, and that receipt waits as after a failed read.

Failures: an engine that cannot be reached, refuses the token or is not configured any more
leaves its receipts due and is not asked again in this run (the run goes on with the other
engines' receipts); an answer that cannot be used for one receipt (not found, not this
receipt, malformed) moves that receipt's next read back by the doubling wait, so it never
holds up the others. Reading twice changes nothing, and each receipt is written in one
statement: a run killed anywhere leaves each receipt either read or still due.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from lifecycle import faults
from lifecycle.deletion.executor import figure
from lifecycle.deletion.presentation import receipt_rows
from lifecycle.engine.http import EngineBadAnswer, EngineCredentialsRefused, EngineUnreachable
from lifecycle.errors import ActionRefused
from lifecycle.models import RetainedFactsPolicy
from remote.models import BoundDelete, BoundDeleteState

log = logging.getLogger(__name__)

BATCH = 100
SLACK = timedelta(hours=2)
FIRST_WAIT = timedelta(days=1)
LONGEST_WAIT = timedelta(days=30)
# No period is longer (RetainedFactsPolicy.MAX_DAYS): a receipt still keeping facts that long
# after its delete comes from an engine that does not mark them, and is not read again.
LONGEST = timedelta(days=RetainedFactsPolicy.MAX_DAYS + 1)
OUTCOMES = ("updated", "unchanged", "settled", "not_taken", "unreachable")


def expiring(receipt: Any) -> list[dict[str, Any]]:
    """The receipt's kept facts of stores whose period runs out (audit, usage, billing), with
    records (or a count not given): an entry of none has nothing the engine would mark."""
    kept = receipt.get("kept") if isinstance(receipt, dict) else None
    return [row for row in receipt_rows(kept) if row["action"] == "kept" and row["expires"] and row["records"] != 0]


# The longest retention period a receipt may state (a hundred years; Lethe's own are at most ten):
# a longer one cannot be dated (r40: 999,999,999 days overflowed every read of the receipt).
LONGEST_PERIOD_DAYS = 36500


def period_days(value: Any) -> int | None:
    """A receipt's period in days as this console can date it, or None (not given, or not one)."""
    days = figure(value)
    return days if days is not None and days <= LONGEST_PERIOD_DAYS else None


def _wait(since: timedelta) -> timedelta:
    return min(max(since, FIRST_WAIT), LONGEST_WAIT)


def next_read(receipt: Any, completed_at: datetime, now: datetime, *, last: datetime) -> datetime | None:
    """When the receipt is to be read next (None: never). `completed_at`: when the engine
    completed the delete; `last`: the last time it was read (or stored)."""
    rows = expiring(receipt)
    if not rows or completed_at < now - LONGEST:
        return None
    times = []
    for row in rows:
        days = period_days(row.get("days"))  # (with engine times up to moments.LATEST: never past the calendar)
        expected = completed_at + timedelta(days=days) + SLACK if days else None
        if expected is not None and expected > now:
            times.append(min(expected, now + LONGEST_WAIT))  # a period may have been shortened since
        else:  # no period given, or past it and still kept: wait longer each time
            times.append(now + _wait(now - (expected or last)))
    return min(times)


def later_receipt(stored: Any, answered: Any) -> bool:
    """Whether `answered` is the stored receipt later on: the same engine and erased figures,
    and each kept fact the same or changed from kept to expired (with a date), none added or
    gone; a kept fact's period (`days`) may be another (an admin changed it on the engine), and
    an expired one may say it went after a clean check (`after_check`). Its other parts may have
    moved on (verification, physical erasure, holders)."""
    if not isinstance(stored, dict) or not isinstance(answered, dict):
        return False
    if any(stored.get(name) != answered.get(name) for name in ("engine", "stores")):
        return False
    before, after = stored.get("kept", []), answered.get("kept", [])
    if not isinstance(before, list) or not isinstance(after, list) or len(before) != len(after):
        return False
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if not (isinstance(old, dict) and isinstance(new, dict) and old.get("action") == "kept"):
            return False
        expired = new.get("action") == "expired" and isinstance(new.get("expired_at"), str)
        if new.get("action") != "kept" and not expired:
            return False
        if period_days(new.get("days")) is None and "days" in new:
            return False
        moved = ("action", "expired_at", "days", "after_check")
        if {k: v for k, v in new.items() if k not in moved} != {k: v for k, v in old.items() if k not in moved}:
            return False
    return True


def first_read_at(receipt: Any, completed_at: datetime, now: datetime) -> datetime | None:
    """When a receipt stored now, of a delete the engine completed at `completed_at`, is first read again."""
    return next_read(receipt, completed_at, now, last=now)


def due(now: datetime, *, skip: set[str], limit: int) -> list[BoundDelete]:
    """The completed deletes whose receipts are due, of engines not in `skip`, longest due first."""
    return list(BoundDelete.objects.filter(receipt_next_read_at__lte=now, state=BoundDeleteState.COMPLETED)
                .exclude(engine_url__in=skip).order_by("receipt_next_read_at", "pk")[:limit])


def read_again(now: datetime | None = None) -> dict[str, int]:
    """One run: read the due receipts again, at most BATCH of them. Returns counts by outcome."""
    now = now or timezone.now()
    counts = dict.fromkeys(OUTCOMES, 0)
    down: set[str] = set()  # engines that could not be asked in this run
    engines: dict[str, Any] = {}
    handled = 0
    # Each receipt is written only if its due time is still the one read here (`_store`), so
    # the rows are read once per page, not again one by one.
    while handled < BATCH and (page := due(now, skip=down, limit=BATCH - handled)):
        for op in page:
            if op.engine_url in down:
                continue
            handled += 1
            try:
                outcome = _read_one(op, now, engines)
            except Exception:  # about this receipt alone: it waits, the others go on
                log.exception("receipt of %s not read again: an unexpected error", op.public_id)
                _store(op, receipt_next_read_at=now + _wait(now - (op.receipt_read_at or _completed_on_engine(op))))
                outcome = "not_taken"
            if outcome == "unreachable":
                down.add(op.engine_url)
            counts[outcome] += 1
    return counts


def _completed_on_engine(op: BoundDelete) -> datetime:
    return op.receipt_at or op.completed_at


def _read_one(op: BoundDelete, now: datetime, engines: dict[str, Any]) -> str:
    from remote.delivery import EngineNotConfigured, engine_for

    completed_at = _completed_on_engine(op)
    if first_read_at(op.receipt, completed_at, now) is None:  # nothing left to expire
        _store(op, receipt_next_read_at=None)
        return "settled"
    later = now + _wait(now - (op.receipt_read_at or completed_at))
    try:
        if op.engine_url not in engines:
            engines[op.engine_url] = engine_for(op.engine_url)
        view = engines[op.engine_url].operation(op.engine_operation)
    except EngineBadAnswer as exc:  # about this receipt: it waits, the others go on
        log.warning("receipt of %s not read again: the engine's answer could not be used (%s)", op.public_id,
                    exc.code)
        _store(op, receipt_next_read_at=later)
        return "not_taken"
    except (EngineNotConfigured, EngineUnreachable, EngineCredentialsRefused) as exc:
        log.info("receipt of %s not read again: %s", op.public_id, exc.code)
        return "unreachable"
    except ActionRefused as exc:  # the engine no longer knows the operation, or refuses the read
        log.warning("receipt of %s not read again: the engine answered %s", op.public_id, exc.code)
        _store(op, receipt_next_read_at=later)
        return "not_taken"
    receipt = view.data.get("receipt")
    if (view.id != op.engine_operation or view.target != op.engine_id
            or view.state != BoundDeleteState.COMPLETED or not later_receipt(op.receipt, receipt)):
        log.warning("receipt of %s: the engine's answer was not taken (not this delete's receipt, or one whose "
                    "erased figures or kept facts changed in a way a receipt does not)", op.public_id)
        _store(op, receipt_next_read_at=later)
        return "not_taken"
    faults.kill_point("remote.receipts.read")  # crash tests: read, not stored
    changed = receipt != op.receipt
    _store(op, receipt=receipt, receipt_read_at=now, receipt_next_read_at=first_read_at(receipt, completed_at, now))
    faults.kill_point("remote.receipts.stored")
    return "updated" if changed else "unchanged"


def _store(op: BoundDelete, **fields) -> None:
    """Store what this read found, unless another run read it first (its due time moved)."""
    BoundDelete.objects.filter(pk=op.pk, receipt_next_read_at=op.receipt_next_read_at).update(**fields)
