from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from lifecycle.models import AuditFact


def record(action: str, *, actor=None, conversation=None, old: Any = None, new: Any = None,
           at: datetime | None = None) -> AuditFact:
    """One content-free audit row with the old and new values, recorded now (or `at`: the time
    a job runs as, so that what it records is never older than what it works on)."""
    return AuditFact.objects.create(
        action=action,
        actor=actor if actor is not None and actor.is_authenticated else None,
        conversation=conversation,
        old_value=old,
        new_value=new,
        recorded_at=at or timezone.now(),
    )
