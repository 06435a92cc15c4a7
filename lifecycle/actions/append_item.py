from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from lifecycle.errors import ActionRefused
from lifecycle.fence import check_writable, lock_writable, refusal
from lifecycle.item_payload import has_bad_text, payload_columns
from lifecycle.models import Conversation, ConversationState, Item, Role
from retention.reducer import MARKER_KEY, Skip, is_marker, normalize


def last_seq(conversation_id: int):
    """The query for the conversation's highest seq (a list of at most one): the (conversation,
    seq) key read backwards, one index entry however long the conversation (see migration
    lifecycle 0010)."""
    return Item.objects.filter(conversation_id=conversation_id).order_by("-seq").values_list("seq", flat=True)[:1]


def invalid_text() -> ActionRefused:
    return ActionRefused(
        "invalid_text", _("The item has text with a NUL character or an invalid character."), status=400
    )


def append_item(
    conversation: Conversation,
    *,
    role: str,
    content: str = "",
    tool_kind: str = "",
    tool_call_id: str = "",
    status: str = "",
    title: str = "",
    payload: Any = None,
    client_key: str | None = None,
) -> Item:
    """Append one message to the conversation's transcript and mark it active now.

    An item of any role reusing the call id of an item whose details cleanup removed is
    refused (`tool_details_removed`): a replayed call cannot bring the removed details back,
    as a tool item or as a message.

    `client_key` (the request's Idempotency-Key): an append retried with the key of an item
    already appended to this conversation, with the same request, answers with that item as
    it is now (`replayed` set on it), appending nothing and leaving the conversation's
    activity alone; the key sent with another request (any field of the append other than
    sent first: role, kind, call id, status, title, text or payload) is refused with 422
    `idempotency_key_reused`. Two appends racing with one key make one item. A retry is
    refused as any write is once a delete is under way or done (it answered with the item's
    content while the delete was pending, then refused once it completed).
    """
    digest = request_digest(role, tool_kind, tool_call_id, status, title, content, payload) if client_key else ""
    if client_key is not None:
        check_writable(Conversation.objects.only("state").get(pk=conversation.pk))
        earlier = _keyed(conversation.pk, client_key, digest, role, tool_kind, tool_call_id, content)
        if earlier is not None:
            return earlier
    try:
        return _append(conversation, role=role, content=content, tool_kind=tool_kind, tool_call_id=tool_call_id,
                       status=status, title=title, payload=payload, client_key=client_key, digest=digest)
    except IntegrityError:
        # Another append with this key committed between the check and this one's insert.
        earlier = (_keyed(conversation.pk, client_key, digest, role, tool_kind, tool_call_id, content)
                   if client_key else None)
        if earlier is None:
            raise
        return earlier


def request_digest(role: str, tool_kind: str, tool_call_id: str, status: str, title: str, content: str,
                   payload: Any) -> str:
    """SHA-256 of an append as it is stored (ASCII JSON: a lone surrogate has a form too): the
    payload's numbers in the form the database keeps, so 1e16 and 10000000000000000, which make
    the same item, are the same request (r52: the payload an answer gave back was refused)."""
    sent = json.dumps([role, tool_kind, tool_call_id, status, title, content, normalize(payload)], ensure_ascii=True,
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(sent.encode()).hexdigest()


def _keyed(conversation_id: int, key: str, digest: str, role: str, tool_kind: str, tool_call_id: str,
           content: str) -> Item | None:
    """The item appended under this key, marked replayed, if the retry is the same request."""
    item = Item.objects.filter(conversation_id=conversation_id, client_key=key).first()
    if item is None:
        return None
    if item.client_key_digest:
        same = item.client_key_digest == digest
    else:  # appended before digests were kept, or its details were removed since
        same = (item.role, item.tool_kind, item.tool_call_id, item.content) == (
            role, tool_kind if role == Role.TOOL else "", tool_call_id, content)
    if not same:
        raise ActionRefused("idempotency_key_reused", _("This Idempotency-Key was used for another item of this "
                                                        "conversation."), status=422)
    item.replayed = True
    return item


def _append(conversation: Conversation, *, role: str, content: str, tool_kind: str, tool_call_id: str, status: str,
            title: str, payload: Any, client_key: str | None, digest: str) -> Item:
    if role != Role.TOOL and (tool_kind or payload is not None):
        raise ActionRefused(
            "invalid_item", _("Only tool items have a tool kind or a payload."), status=400
        )
    if isinstance(payload, dict) and is_marker(payload.get(MARKER_KEY)):
        raise ActionRefused(
            "invalid_item", _("A new item cannot carry a removal marker."), status=400
        )
    if has_bad_text(content, tool_kind, tool_call_id, status, title, payload):
        raise invalid_text()
    pk = conversation.pk
    with transaction.atomic():
        now = timezone.now()
        # One statement locks the conversation row, checks it is live and marks it active: the
        # row lock is what a delete intent takes too, so the append finishes before the intent
        # commits or sees it (see lifecycle.fence). On PostgreSQL a wait for the lock re-reads
        # the row's newest version, so a conversation that stopped being live updates nothing.
        if not Conversation.objects.filter(pk=pk, state=ConversationState.LIVE).update(last_activity_at=now):
            lock_writable(pk)  # gone (DoesNotExist) or not live (the fence's refusal)
            raise refusal()  # a conversation never goes back to live
        if tool_call_id and Item.objects.filter(
            conversation_id=pk, payload_skip=Skip.ALREADY_REMOVED, tool_call_id=tool_call_id
        ).exists():
            raise ActionRefused(
                "tool_details_removed",
                _("The details of this tool call were removed by the retention policy and cannot be restored."),
            )
        columns = payload_columns(role, tool_kind, payload)
        # The next seq is read inside the INSERT, a statement after the lock (so its snapshot
        # sees every append committed before the lock was granted), and returned by it.
        item = Item.objects.create(
            conversation_id=pk,
            seq=Coalesce(Subquery(last_seq(pk)), 0) + 1,
            role=role,
            content=content,
            tool_kind=tool_kind if role == Role.TOOL else "",
            tool_call_id=tool_call_id,
            status=status,
            title=title,
            **columns,
            client_key=client_key,
            client_key_digest=digest,
            created_at=now,
            updated_at=now,
        )
    return item
