from __future__ import annotations

from lifecycle.models import RetainedFactsPolicy
from lifecycle.revisioned import save_revisioned

FIELDS = ("audit_days", "usage_days", "billing_days")


def save_facts_policy(*, values: dict[str, int], revision: int, acting_user) -> RetainedFactsPolicy:
    """Change how long content-free facts are kept after a delete."""
    return save_revisioned(
        RetainedFactsPolicy,
        new={name: values[name] for name in FIELDS},
        revision=revision,
        acting_user=acting_user,
        action="retained_facts_policy.saved",
    )
