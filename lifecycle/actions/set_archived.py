from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from lifecycle import audit
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation


def set_archived(conversation: Conversation, *, archived: bool, acting_user) -> Conversation:
    """Archive (hide from Recent) or unarchive a conversation. Nothing is erased.

    Refused for a conversation with a delete intent; a no-op records nothing. The conversation
    returned says whether this call changed it (`changed`: False when it already was as asked).
    """
    with transaction.atomic():
        locked = lock_writable(conversation)
        locked.changed = (locked.archived_at is not None) != archived
        if not locked.changed:
            return locked
        now = timezone.now()
        locked.archived_at = now if archived else None
        locked.view_changed_at = now
        locked.save(update_fields=["archived_at", "view_changed_at"])
        audit.record(
            "conversation.archived" if archived else "conversation.unarchived",
            actor=acting_user, conversation=locked, old={"archived": not archived}, new={"archived": archived},
        )
    return locked
