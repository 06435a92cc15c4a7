"""The last measurement's figures as the Storage card and `GET /api/v1/system/storage` give
them, read from the snapshot tables (never measured here: a read does no heavy work).

The lists follow deletes made since the measurement: a conversation deleted since leaves the
largest conversations and its owner's figures at once (r53); the tool kinds' figures are the
whole measurement's and say how many conversations deleted since they still count (r55).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from insight.models import ConversationSize, Measurement, OwnerKind, OwnerSize, ToolKindSize
from lifecycle.models import Account, Computer, Conversation, ConversationState, Scope

TOP = 20


@dataclass
class Row:
    name: Any  # the conversation, account or computer (the tool kinds: the kind's label)
    size: Any  # its ConversationSize, OwnerSize or ToolKindSize


def measurement() -> Measurement:
    """The singleton, unsaved when nothing was ever measured or asked for."""
    return Measurement.objects.filter(id=1).first() or Measurement(id=1)


def _deleted_since() -> dict[tuple[str, int], list[ConversationSize]]:
    """(owner kind, owner id) -> the measured sizes of its conversations deleted since the
    measurement (one read for both kinds, and for the tool kinds' note)."""
    deleted = Conversation.objects.filter(state=ConversationState.DELETED)
    gone = {s.conversation_id: s for s in ConversationSize.objects.filter(conversation_id__in=deleted.values("pk"))}
    owned: dict[tuple[str, int], list[ConversationSize]] = {}
    rows = deleted.filter(pk__in=list(gone)).values_list("pk", "scope", "account_id", "computer_id")
    for pk, scope, account_id, computer_id in rows:
        owner = (OwnerKind.ACCOUNT, account_id) if scope == Scope.BOUND else (OwnerKind.COMPUTER, computer_id)
        owned.setdefault(owner, []).append(gone[pk])
    return owned


def _owners(kind: str, model, deleted: dict[tuple[str, int], list[ConversationSize]]) -> list[Row]:
    """The largest owners, without the conversations deleted since the measurement (r53: the
    conversation list dropped a deleted conversation at once, its owner's figures kept it)."""
    deleted = {owner_id: sizes for (owner_kind, owner_id), sizes in deleted.items() if owner_kind == kind}
    sizes = list(OwnerSize.objects.filter(kind=kind).order_by("-total_bytes", "owner_id")[:TOP + len(deleted)])
    for size in sizes:
        for gone in deleted.get(size.owner_id, ()):
            size.conversations = max(size.conversations - 1, 0)
            size.db_bytes = max(size.db_bytes - gone.db_bytes, 0)
            size.engine_bytes = max(size.engine_bytes - gone.engine_bytes, 0)
            size.total_bytes = max(size.total_bytes - gone.total_bytes, 0)
    sizes = sorted((s for s in sizes if s.conversations), key=lambda s: (-s.total_bytes, s.owner_id))[:TOP]
    names = model.objects.in_bulk([s.owner_id for s in sizes])
    return [Row(names[s.owner_id], s) for s in sizes if s.owner_id in names]


def _conversations() -> list[Row]:
    shown = Conversation.objects.exclude(state=ConversationState.DELETED).values("pk")
    sizes = list(ConversationSize.objects.filter(conversation_id__in=shown, total_bytes__gt=0)
                 .order_by("-total_bytes", "conversation_id")[:TOP])
    found = Conversation.objects.select_related("account", "computer").in_bulk([s.conversation_id for s in sizes])
    return [Row(found[s.conversation_id], s) for s in sizes if s.conversation_id in found]


def lists() -> dict[str, Any]:
    """The largest conversations, accounts and computers, the tool kinds (largest first, `name`
    the stored kind) and how many conversations deleted since the tool kinds still count."""
    deleted = _deleted_since()
    return {
        "conversations": _conversations(),
        "accounts": _owners(OwnerKind.ACCOUNT, Account, deleted),
        "computers": _owners(OwnerKind.COMPUTER, Computer, deleted),
        "tool_kinds": [Row(k.tool_kind, k) for k in ToolKindSize.objects.order_by("-payload_bytes", "tool_kind")],
        "deleted_since": sum(len(sizes) for sizes in deleted.values()),
    }
