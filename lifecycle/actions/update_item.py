from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle.actions.append_item import invalid_text
from lifecycle.errors import ActionRefused
from lifecycle.fence import lock_writable
from lifecycle.item_payload import has_bad_text, payload_columns
from lifecycle.models import Conversation, Item, Role
from retention.reducer import MARKER_KEY, Skip, encode, is_marker, keep_details_removed

_UNSET: Any = object()


def _only_reduced_since(item: Item, revision: int) -> bool:
    """Whether the one change since `revision` is cleanup's removal of the item's details: it
    bumps the revision by one and stamps `updated_at` with its own time, `details_removed_at`,
    which any later write replaces. A late update sent with the revision its runtime knew then
    still lands its status and title (AC-TPR-002.4): cleanup is not a conflicting write."""
    return (
        item.payload_skip == Skip.ALREADY_REMOVED
        and item.details_removed_at is not None
        and revision == item.revision - 1
        and item.updated_at == item.details_removed_at
    )


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
    replayed update: status and title are applied, the payload fields cleanup removes are
    dropped from the update, and the removal marker stays. The revision cleanup's removal
    took does not make such an update stale (see _only_reduced_since).

    A request that changes nothing (every field sent already holds what it would store: the
    same request sent again after its answer was lost) answers the item as it is, whatever
    revision it names: no new revision, no activity (r122: the retry of an applied change was
    refused as stale, as both policy PUTs never refuse an identical resend).
    """
    if has_bad_text(*(value for value in (status, title, payload) if value is not _UNSET)):
        raise invalid_text()
    with transaction.atomic():
        conversation = lock_writable(item.conversation_id)
        current = Item.objects.select_for_update().get(pk=item.pk)
        changes = _changes(current, status=status, title=title, payload=payload)
        if not changes:
            return current
        if revision is not None and revision != current.revision and not _only_reduced_since(current, revision):
            raise ActionRefused(
                "stale_revision",
                _("The item changed since revision %(revision)s; reload it and try again.")
                % {"revision": revision},
            )
        for name, value in changes.items():
            setattr(current, name, value)
        now = timezone.now()
        current.revision += 1
        current.updated_at = now
        current.save(update_fields=[*changes, "revision", "updated_at"])
        Conversation.objects.filter(pk=conversation.pk).update(last_activity_at=now)
    return current


def _changes(current: Item, *, status: str, title: str, payload: Any) -> dict[str, Any]:
    """The columns the update would write, with their new values: none when every field sent
    already holds what it would store (a payload compared as it would be stored, the removed
    details of a reduced item left out as they stay out)."""
    changes: dict[str, Any] = {}
    if status is not _UNSET and status != current.status:
        changes["status"] = status
    if title is not _UNSET and title != current.title:
        changes["title"] = title
    if payload is not _UNSET:
        if current.role != Role.TOOL:
            if payload is not None:
                raise ActionRefused("invalid_item", _("Only tool items have a payload."), status=400)
            payload = _UNSET
        elif current.payload_skip == Skip.ALREADY_REMOVED and isinstance(current.payload, dict) and is_marker(
                current.payload.get(MARKER_KEY)):
            # Details stay removed; an update that is not an object leaves the payload as is.
            payload = _UNSET if not isinstance(payload, dict) else keep_details_removed(
                current.tool_kind, payload, current.payload[MARKER_KEY])
        elif isinstance(payload, dict) and is_marker(payload.get(MARKER_KEY)):
            raise ActionRefused("invalid_item", _("An update cannot carry a removal marker."), status=400)
    if payload is not _UNSET:
        columns = payload_columns(Role.TOOL, current.tool_kind, payload)
        if current.payload_skip == Skip.ALREADY_REMOVED:
            columns.update(removable_bytes=0, payload_skip=Skip.ALREADY_REMOVED, removal_plan=None)
        # Compared as canonical JSON: 1, 1.0 and true are equal in Python but not in JSON.
        if encode(columns["payload"]) != encode(current.payload):
            changes.update(columns)
    return changes
