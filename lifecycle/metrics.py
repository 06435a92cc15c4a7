"""The lifecycle's figures on /metrics, read at scrape time (see ops.metrics)."""

from __future__ import annotations

from django.db.models import Count

from lifecycle.models import Conversation, ConversationState
from ops.metrics import gauge


@gauge("lethe_conversations", "Conversations by state (deleted ones are their tombstones).", labels=("state",))
def conversations_by_state() -> dict[str, int]:
    counts = dict.fromkeys(ConversationState.values, 0)
    counts.update(Conversation.objects.order_by().values_list("state").annotate(n=Count("id")))
    return counts
