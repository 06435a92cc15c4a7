from __future__ import annotations

from typing import Any

from lifecycle.models import AuditFact


def record(action: str, *, actor=None, conversation=None, old: Any = None, new: Any = None) -> AuditFact:
    """One content-free audit row with the old and new values."""
    return AuditFact.objects.create(
        action=action,
        actor=actor if actor is not None and actor.is_authenticated else None,
        conversation=conversation,
        old_value=old,
        new_value=new,
    )
