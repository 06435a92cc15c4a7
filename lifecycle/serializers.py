"""JSON shapes of the read API. One function per resource."""

from __future__ import annotations

from typing import Any

from lifecycle.models import Conversation, Item


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def thread_json(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.public_id,
        "thread_id": c.thread_id,
        "owner": {"kind": c.owner_kind, "id": c.owner_id},
        "scope": c.scope,
        "title": c.title,
        "archived": c.archived_at is not None,
        "closed": c.closed_at is not None,
        "active": bool(getattr(c, "is_active", False)),
        "last_activity_at": iso(c.last_activity_at),
        "created_at": iso(c.created_at),
        "state": c.state,
    }


def item_json(i: Item) -> dict[str, Any]:
    return {
        "id": i.pk,
        "seq": i.seq,
        "role": i.role,
        "tool_kind": i.tool_kind or None,
        "tool_call_id": i.tool_call_id or None,
        "status": i.status or None,
        "title": i.title,
        "content": i.content,
        "payload": i.payload,
        "payload_bytes": i.payload_bytes,
        "revision": i.revision,
        "created_at": iso(i.created_at),
        "updated_at": iso(i.updated_at),
    }
