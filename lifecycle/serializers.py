"""JSON shapes of the engine API: one function per resource, and the schema it answers with.

The `*Out` models are the published schema (OpenAPI); tests check every answer against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field as PydanticField
from pydantic import JsonValue

from console.api import Schema
from lifecycle.models import Conversation, Item


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


class OwnerOut(Schema):
    kind: Literal["account", "computer"]
    id: int


class ThreadOut(Schema):
    id: str
    thread_id: str
    owner: OwnerOut
    scope: Literal["bound", "local"]
    title: str
    archived: bool
    closed: bool
    active: bool
    last_activity_at: str
    created_at: str
    state: Literal["live", "pending_delete", "deleted"]


class ThreadPageOut(Schema):
    results: list[ThreadOut]
    next: str | None
    as_of: str = PydanticField(description="The snapshot moment the pages are listed against.")
    changed_since_start: int = PydanticField(
        ge=0, description="Matching conversations with activity after `as_of`, which these pages leave out."
    )


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


Payload = dict[str, JsonValue] | list[JsonValue] | str | int | float | None


class ItemOut(Schema):
    id: int
    seq: int
    role: Literal["user", "assistant", "tool"]
    tool_kind: str | None
    tool_call_id: str | None
    status: str | None
    title: str
    content: str
    payload: Payload
    payload_bytes: int
    revision: int
    created_at: str
    updated_at: str


class ItemPageOut(Schema):
    results: list[ItemOut]
    next: str | None


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
