from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle import audit
from lifecycle.errors import ActionRefused
from lifecycle.models import RetainedFactsPolicy

FIELDS = ("audit_days", "usage_days", "billing_days")


def save_facts_policy(*, values: dict[str, int], revision: int, acting_user) -> RetainedFactsPolicy:
    """Change how long content-free facts are kept after a delete."""
    with transaction.atomic():
        RetainedFactsPolicy.load()
        policy = RetainedFactsPolicy.objects.select_for_update().get(id=1)
        if revision != policy.revision:
            raise ActionRefused(
                "stale_revision", _("Someone else saved these settings meanwhile. Reload to see them.")
            )
        old = {f: getattr(policy, f) for f in FIELDS}
        new = {f: values[f] for f in FIELDS}
        if old == new:
            return policy
        for name, value in new.items():
            setattr(policy, name, value)
        policy.revision += 1
        policy.updated_at = timezone.now()
        policy.save()
        audit.record("retained_facts_policy.saved", actor=acting_user, old=old, new=new)
    return policy
