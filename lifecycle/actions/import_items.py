from __future__ import annotations

from typing import Any

from django.db import transaction

from lifecycle.actions.append_item import append_item
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation, Item


def import_items(conversation: Conversation, items: list[dict[str, Any]]) -> list[Item]:
    """Import a transcript into a conversation, all or nothing; fenced like every write."""
    with transaction.atomic():
        lock_writable(conversation)
        return [append_item(conversation, **item) for item in items]
