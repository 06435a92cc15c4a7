from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle import audit
from lifecycle.errors import ActionRefused
from retention.models import ToolPayloadPolicy

FIELDS = ("enabled", "age_value", "age_unit")


def save_tool_payload_policy(
    *, enabled: bool, age_value: int, age_unit: str, revision: int, acting_user
) -> ToolPayloadPolicy:
    """Save the installation-wide tool payload cleanup policy."""
    with transaction.atomic():
        ToolPayloadPolicy.load()
        policy = ToolPayloadPolicy.objects.select_for_update().get(id=1)
        if revision != policy.revision:
            raise ActionRefused(
                "stale_revision", _("Someone else saved these settings meanwhile. Reload to see them.")
            )
        old = {f: getattr(policy, f) for f in FIELDS}
        new = {"enabled": enabled, "age_value": age_value, "age_unit": age_unit}
        if old == new:
            return policy
        for name, value in new.items():
            setattr(policy, name, value)
        policy.revision += 1
        policy.updated_at = timezone.now()
        policy.updated_by = acting_user
        policy.save()
        audit.record("tool_payload_policy.saved", actor=acting_user, old=old, new=new)
    return policy
