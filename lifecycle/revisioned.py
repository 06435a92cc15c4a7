"""Saving a revisioned singleton setting: stale revisions refused, no-ops skipped, audited."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle import audit
from lifecycle.errors import ActionRefused


def save_revisioned(
    model: type[models.Model], *, new: dict[str, Any], revision: int, acting_user, action: str,
    extra: dict[str, Any] | None = None,
):
    """Apply `new` to the singleton row if `revision` is current; audit old and new values.
    Values equal to the stored ones change nothing and are no refusal, whatever revision they
    were read at: a form sent twice (a double click without the page's script) finds its own
    first save and is answered as it was, not told someone else saved meanwhile (r23)."""
    with transaction.atomic():
        model.objects.get_or_create(id=1)
        obj = model.objects.select_for_update().get(id=1)
        old = {name: getattr(obj, name) for name in new}
        if old == new:
            return obj
        if revision != obj.revision:
            raise ActionRefused(
                "stale_revision", _("Someone else saved these settings meanwhile. Reload to see them.")
            )
        for name, value in {**new, **(extra or {})}.items():
            setattr(obj, name, value)
        obj.revision += 1
        obj.updated_at = timezone.now()
        obj.save()
        audit.record(action, actor=acting_user, old=old, new=new)
    return obj
