from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from lifecycle import audit, work_order
from lifecycle.fence import lock_writable
from lifecycle.models import (
    ACTIVE_TURN_STATES,
    ClaimKind,
    Conversation,
    ProcessLease,
    RuntimeClaim,
    Turn,
    TurnState,
)

# Work that belongs to the live runtime and ends with it. Task and automation ownership
# outlive a runtime, so Close leaves them (they still hold a delete back).
RUNTIME_CLAIMS = (ClaimKind.APPROVAL, ClaimKind.USER_INPUT, ClaimKind.DYNAMIC_TOOL, ClaimKind.SHELL_JOB)


def set_closed(conversation: Conversation, *, closed: bool, acting_user) -> Conversation:
    """Close (end the live runtime) or resume a conversation. History stays either way.

    Close: 1. running and queued turns stop as Interrupted; 2. the runtime's open approvals,
    input requests, dynamic tools and shell jobs are resolved; 3. the process lease is
    released. Resume reopens the conversation; the engine takes a new lease when it runs.
    Both are refused for a conversation with a delete intent. The conversation returned says
    whether this call changed it (`changed`: False when it already was as asked).
    """
    with transaction.atomic():
        locked = lock_writable(conversation)
        locked.changed = (locked.closed_at is not None) != closed
        if not locked.changed:
            return locked
        if closed:
            work_order.ending_work()  # after a cleanup run's count under way (lifecycle/work_order.py)
        now = timezone.now()
        new: dict = {"closed": closed}
        if closed:
            new["interrupted_turns"] = Turn.objects.filter(
                conversation=locked, state__in=ACTIVE_TURN_STATES
            ).update(state=TurnState.INTERRUPTED, finished_at=now)
            new["resolved_claims"] = RuntimeClaim.objects.open().filter(
                conversation=locked, kind__in=RUNTIME_CLAIMS
            ).update(resolved_at=now)
            new["released_lease"], _by_model = ProcessLease.objects.filter(conversation=locked).delete()
        locked.closed_at = now if closed else None
        locked.view_changed_at = now
        locked.save(update_fields=["closed_at", "view_changed_at"])
        audit.record(
            "conversation.closed" if closed else "conversation.resumed",
            actor=acting_user, conversation=locked, old={"closed": not closed}, new=new,
        )
    return locked
