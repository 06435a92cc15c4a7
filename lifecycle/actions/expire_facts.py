from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from lifecycle import audit
from lifecycle.models import DeleteOperation, DeleteState, RetainedFactsPolicy
from lifecycle.registry import STORES

BATCH = 2000


def expire_facts(*, now=None) -> dict[str, int]:
    """Remove retained facts whose period, counted from their conversation's completed
    delete, has run out. Facts of live conversations never expire. Idempotent (daily job)."""
    now = now or timezone.now()
    policy = RetainedFactsPolicy.load()
    expired: dict[str, int] = {}
    for store in STORES:
        if not store.period:
            continue
        cutoff = now - timedelta(days=getattr(policy, store.period))
        deleted = DeleteOperation.objects.filter(state=DeleteState.COMPLETED, completed_at__lt=cutoff)
        facts = store.model_class.objects.filter(
            **{f"{store.lookup}__in": deleted.values("conversation_id")}
        )
        count = 0
        while ids := list(facts.values_list("pk", flat=True)[:BATCH]):
            with transaction.atomic():
                count += store.model_class.objects.filter(pk__in=ids).delete()[0]
        if count:
            expired[store.key] = count
    if expired:
        audit.record("retained_facts.expired", new=expired)
    return expired
