from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle.errors import ActionRefused
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation, Item, Role
from retention.reducer import MARKER_KEY, encode, measure

_UNSET: Any = object()


def update_item(
    item: Item,
    *,
    status: str = _UNSET,
    title: str = _UNSET,
    payload: Any = _UNSET,
    revision: int | None = None,
) -> Item:
    """The runtime's write path for an existing item (status, title, payload).

    A payload whose details were removed by cleanup can never be restored by a late or
    replayed update: such a write is refused and changes nothing.
    """
    with transaction.atomic():
        conversation = lock_writable(item.conversation_id)
        current = Item.objects.select_for_update().get(pk=item.pk)
        if revision is not None and revision != current.revision:
            raise ActionRefused(
                "stale_revision",
                _("The item changed since revision %(revision)s; reload it and try again.")
                % {"revision": revision},
            )
        changed: list[str] = []
        if status is not _UNSET and status != current.status:
            current.status = status
            changed.append("status")
        if title is not _UNSET and title != current.title:
            current.title = title
            changed.append("title")
        # Compared as canonical JSON: 1, 1.0 and true are equal in Python but not in JSON.
        if payload is not _UNSET and encode(payload) != encode(current.payload):
            if current.role != Role.TOOL:
                raise ActionRefused("invalid_item", _("Only tool items have a payload."), status=400)
            if isinstance(current.payload, dict) and MARKER_KEY in current.payload:
                raise ActionRefused(
                    "tool_details_removed",
                    _("The details of this tool call were removed by the retention policy and cannot be restored."),
                )
            if isinstance(payload, dict) and MARKER_KEY in payload:
                raise ActionRefused("invalid_item", _("An update cannot carry a removal marker."), status=400)
            current.payload = payload
            current.payload_bytes, current.removable_bytes = measure(current.tool_kind, payload)
            changed += ["payload", "payload_bytes", "removable_bytes"]
        if not changed:
            return current
        now = timezone.now()
        current.revision += 1
        current.updated_at = now
        current.save(update_fields=[*changed, "revision", "updated_at"])
        Conversation.objects.filter(pk=conversation.pk).update(last_activity_at=now)
    return current
