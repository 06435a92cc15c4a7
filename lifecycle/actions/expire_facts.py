from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from lifecycle import audit, faults
from lifecycle.models import (
    AuditFact,
    DeleteOperation,
    DeleteState,
    RetainedFactsPolicy,
)
from lifecycle.registry import STORES, Store

BATCH = 200  # deletes (conversations) per transaction
CONSOLE_BATCH = 1000  # the console's own audit facts per transaction
# The key under which the console's own audit facts are counted (return value, audit fact).
CONSOLE_AUDIT = "console.audit"
# The key under which the delete operations whose requester was forgotten are counted.
REQUESTERS = "lifecycle.DeleteOperation.requested_by"
# The raw-byte scan's fingerprints (keyed digests of the content, with their key) are a store
# of the registry with a fixed period (registry.FINGERPRINT_DAYS after the delete), expired
# here like the other facts; a clean `verify_erasure --physical` drops them sooner. Short
# guessable content (a PIN) could be confirmed against them.


def expire_facts(*, now=None) -> dict[str, int]:
    """Remove retained facts whose period, counted from their conversation's completed
    delete, has run out, the console's own audit facts older than the audit period, and the
    fingerprints of deletes older than FINGERPRINT_DAYS. Facts of live conversations never
    expire. Idempotent (hourly job).

    Who asked for each delete is forgotten the audit period after the request
    (`forget_requesters`).

    A run with nothing due is cheap: it reads indexes only, no table rows. Per store, the
    completed deletes older than the period (`delete_op_completed_idx`), each with one probe
    of the facts' conversation index; the console's own audit facts older than the period
    (`audit_console_recorded_idx`: none, once they have expired); the operations that still
    name a requester (`delete_op_requester_idx`); the fingerprints, a table that holds only
    the last week's deletes.

    Each batch deletes the facts of up to BATCH deletes, marks those stores "expired" on their
    receipts and records the audit fact, in one transaction: a run killed at any point and run
    again accounts for every expired fact exactly once."""
    now = now or timezone.now()
    expired: dict[str, int] = {}
    for store in STORES:
        if store.period or store.days:
            count = _expire_store(store, now)
            if count:
                expired[store.key] = count
    count = _expire_console_audit(now)
    if count:
        expired[CONSOLE_AUDIT] = count
    count = forget_requesters(DeleteOperation, now, key=REQUESTERS)
    if count:
        expired[REQUESTERS] = count
    return expired


def days_in_force(period: str) -> int:
    """A period of the retained facts policy (its field name) as saved now, read in the
    calling batch's transaction and, on PostgreSQL, held until it commits: a save of the policy
    waits for the batch, and every batch after a save uses the saved period (a run read it
    once: an admin who lengthened a period saw the rest of the hour's run expire facts by the
    old one). SQLite's batch holds the one write lock, which orders them the same way."""
    policy = RetainedFactsPolicy.objects.select_for_update(no_key=True).filter(id=1).first()
    return getattr(policy or RetainedFactsPolicy(id=1), period)


def due_deletes(store: Store, cutoff: datetime) -> QuerySet:
    """(pk, conversation id) of the completed deletes older than `cutoff` that still have
    facts in the store, oldest first."""
    facts = store.model_class.objects.filter(**{store.lookup: OuterRef("conversation_id")})
    return (DeleteOperation.objects.filter(state=DeleteState.COMPLETED, completed_at__lt=cutoff)
            .filter(Exists(facts)).order_by("completed_at", "pk").values_list("pk", "conversation_id"))


def due_console_audit(cutoff: datetime) -> QuerySet:
    """Ids of the console's own audit facts recorded before `cutoff`, oldest first."""
    return (AuditFact.objects.filter(conversation__isnull=True, recorded_at__lt=cutoff)
            .order_by("recorded_at", "pk").values_list("pk", flat=True))


def _expire_store(store: Store, now: datetime) -> int:
    count = 0
    while True:
        with transaction.atomic():
            days = days_in_force(store.period) if store.period else store.days
            batch = list(due_deletes(store, now - timedelta(days=days))[:BATCH])
            if not batch:
                return count
            n = store.model_class.objects.filter(**{f"{store.lookup}__in": [c for _pk, c in batch]}).delete()[0]
            for op in DeleteOperation.objects.select_for_update().filter(pk__in=[pk for pk, _c in batch]):
                _mark_expired(op, store.key, now, days)
            if n:
                audit.record("retained_facts.expired", new={store.key: n}, at=now)
            faults.kill_point(f"expire_facts.{store.key}")  # crash tests: the batch not committed
        faults.kill_point(f"expire_facts.{store.key}.committed")
        count += n


def _expire_console_audit(now: datetime) -> int:
    """The console's own audit facts, those of no conversation (sign-in failures and lockouts
    with the address they came from, API tokens, settings changes, earlier expiries), expire
    the audit period after they were recorded. Each batch deletes them and records how many
    in one transaction. That record is made at the run's `now`, so it expires a period later
    and never in this run: recorded at the clock's time by a run given a later `now` (as an
    operator's or a test's run may be), each batch's own record was due again and the run
    never ended."""
    count = 0
    while True:
        with transaction.atomic():
            cutoff = now - timedelta(days=days_in_force("audit_days"))
            batch = list(due_console_audit(cutoff)[:CONSOLE_BATCH])
            if not batch:
                return count
            n = AuditFact.objects.filter(pk__in=batch, conversation__isnull=True).delete()[0]
            if n:
                audit.record("retained_facts.expired", new={CONSOLE_AUDIT: n}, at=now)
            faults.kill_point("expire_facts.console")  # crash tests: the batch not committed
        faults.kill_point("expire_facts.console.committed")
        count += n


def due_requesters(model, cutoff: datetime) -> QuerySet:
    """Ids of the operations of `model` (a delete, or a bound delete) asked before `cutoff`
    that still name who asked and are no longer pending, oldest first."""
    return (model.objects.filter(requested_by__isnull=False, requested_at__lt=cutoff).exclude(state="pending")
            .order_by("requested_at", "pk").values_list("pk", flat=True))


def forget_requesters(model, now: datetime, *, key: str) -> int:
    """Who asked for a delete is an audit fact: the operation (kept with its receipt, so a
    retry gets the same answer) names them for the audit period after the request, then no
    one (a pending one keeps its requester until it ends). Each batch clears them and records
    how many in one transaction, by the audit period in force when it runs."""
    count = 0
    while True:
        with transaction.atomic():
            cutoff = now - timedelta(days=days_in_force("audit_days"))
            batch = list(due_requesters(model, cutoff)[:CONSOLE_BATCH])
            if not batch:
                return count
            n = model.objects.filter(pk__in=batch, requested_by__isnull=False).update(requested_by=None)
            if n:
                audit.record("retained_facts.expired", new={key: n}, at=now)
        count += n


def _mark_expired(op: DeleteOperation, key: str, now: datetime, days: int) -> None:
    """The receipt stops saying the store's facts are kept: they expired, on this date, after
    the period that applied (the one in force now: an admin may have changed it since the
    receipt was written)."""
    receipt = dict(op.receipt or {})
    kept = [dict(entry) for entry in receipt.get("kept", [])]
    changed = [e for e in kept if e.get("store") == key and e.get("action") == "kept"]
    for entry in changed:
        entry.update(action="expired", expired_at=now.isoformat().replace("+00:00", "Z"), days=days)  # (as every time the API gives)
    if changed:
        DeleteOperation.objects.filter(pk=op.pk).update(receipt={**receipt, "kept": kept})
