"""The console API for conversations on a remote engine: bindings and bound deletes."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from django.utils.translation import gettext as _
from pydantic import Field, JsonValue, model_validator

from console.api import OWNER_PAIR, ApiError, QueryRule, QuerySchema, Schema, endpoint
from lifecycle.api import DEFAULT_LIMIT, IDEMPOTENCY_KEY, Limit, WholeNumber, cursor_of_another_list
from lifecycle.paging import InvalidCursor, encode_token, token_fields, token_pk
from lifecycle.serializers import HolderOut, OwnerOut, PhysicalOut, WayOutOut, iso
from ops.health import cluster_stopped
from remote.delivery import error_text, request_bound_delete
from remote.models import BoundDelete, EngineBinding
from remote.physical import console_copy
from remote.status import waiting_text

State = Literal["pending", "completed", "refused", "unavailable"]


class BindingOut(Schema):
    id: str
    engine_id: str = Field(description="The conversation's id on its engine.")
    engine: str = Field(description="The engine it lives on; empty for the one at ENGINE_URL.")
    owner: OwnerOut
    scope: Literal["bound", "local"]
    thread_id: str
    title: str
    engine_state: str
    last_activity_at: str | None
    delete: str | None = Field(description="The bound delete under way or done, if any.")
    delete_state: State | None
    returned_after: str | None = Field(
        description="The completed bound delete after which the engine listed this conversation again "
                    "(restored there from a backup): its title is not copied here; delete it again.")
    synced_at: str = Field(description="When the read of the engine's list that last listed it here began.")
    title_copy_pending_since: str | None = Field(
        description="When a read found it deleted on the engine by other means (another console, the engine "
                    "itself) and cleared the title copied here: the old title is still in this console's database "
                    "files until a checkpoint (SQLite, tried every minute) or manage.py finish_erasure "
                    "(PostgreSQL). Null once erased, and when no title was cleared that way.")


class RejectedOut(Schema):
    id: str | None = Field(description="The engine's id of the conversation; null when its row gave none this "
                                       "console can show.")
    field: str = Field(description="The field of the engine's row that is not in the form expected: id, owner, "
                                   "scope, thread_id, state, title, last_activity_at, another field of the row "
                                   "holding text with NUL or a lone surrogate (row when its name is longer than 64 "
                                   "characters or not printable), or row.")


class EngineReadOut(Schema):
    engine: str = Field(description="The engine read; empty for the one at ENGINE_URL.")
    state: Literal["never", "ok", "reading", "failed", "unfinished"] = Field(
        description="How the latest read went: none began yet; it went through the whole list; it is under way; "
                    "it failed (`error`); it never ended, and no read has shown a sign of life (a page read) for "
                    "longer than one page may take (its job's time limit, or its process ended).")
    started_at: str | None = Field(description="When the latest read began.")
    read_at: str | None = Field(description="When the last read that went through the engine's whole list began.")
    failed_at: str | None = Field(description="When the last read that failed began.")
    failing: bool = Field(description="Whether the latest read failed or never ended. The pages it read before "
                                      "are kept; the rest of the bindings are as earlier reads left them.")
    error: str | None = Field(description="Why, while `failing` (a code; `read_unfinished` for a read that never "
                                          "ended).")
    error_message: str | None
    rejected: int = Field(description="Rows the last read that went through the whole list left out: not in the "
                                      "form expected, so this console cannot keep them (they are not listed).")
    rejected_conversations: list[RejectedOut] = Field(description="The first 20 of them.")


class BindingPageOut(Schema):
    owner: OwnerOut | None = Field(description="Whose conversations these are (one owner at a time).")
    results: list[BindingOut]
    next: str | None = Field(None, description="The `cursor` of the next page; null on the last page.")
    reads: list[EngineReadOut] = Field(description="Each configured engine's last reads of its list of "
                                                   "conversations (every hour, and when an admin asks).")


class ConsoleCopyOut(Schema):
    engine: Literal["sqlite", "postgresql"]
    physical: PhysicalOut
    holders: list[HolderOut]


class BoundDeleteOut(Schema):
    id: str
    kind: Literal["bound_delete"]
    binding: str | None = Field(description="The binding, kept until the engine's receipt is acknowledged.")
    engine_id: str
    engine: str
    owner: OwnerOut
    scope: Literal["bound", "local"]
    thread_id: str
    state: State
    outcome: State
    code: str | None = Field(description="Why it was refused or is unavailable.")
    message: str | None
    way_out: WayOutOut | None = Field(
        description="Refused or unavailable while subagent rows of unknown origin on the engine overlap the "
                    "conversation (among its reasons): those rows, as the engine named them. Resolve each on the "
                    "engine (POST /v1/subagents/{agent_id}/resolve there), then delete again with a new key.")
    waiting_on: Literal["engine", "console"] | None = Field(
        description="While pending: whose next step it is (the engine erasing or unreachable, or this "
                    "console acknowledging, or its job cluster, which sends every request, not running).")
    waiting_message: str | None
    attempts: int = Field(description="Calls made to the engine's delete.")
    next_attempt_at: str | None = Field(description="When the engine is tried again, while it is unreachable.")
    last_error: str | None = Field(description="What keeps a pending delete from going on now (a code); null "
                                               "once it goes on, and once it ended.")
    last_error_message: str | None = Field(description="last_error in words, in the request's language.")
    last_error_at: str | None = Field(description="When last_error was met (for engine_stalled, first seen); null "
                                                  "whenever last_error is.")
    engine_operation: str | None = Field(description="The engine's operation id.")
    engine_state: str | None
    engine_step: str | None
    receipt: dict[str, JsonValue] | None = Field(
        description="The engine's erasure receipt, as the engine gave it; read again while it keeps facts that "
                    "expire, so a kept fact the engine has since removed shows as expired, with its date.")
    receipt_at: str | None
    receipt_read_at: str | None = Field(
        description="When the receipt was last read again from the engine (null: as given at completion).")
    acknowledged_at: str | None
    requested_at: str
    completed_at: str | None = Field(description="When it ended: Completed, Refused or Unavailable (the engine's "
                                                 "own operation gives a time only for Completed).")
    console_copy: ConsoleCopyOut | None = Field(
        description="Completed: this console's own copy of the conversation's title (its binding's), cleared at "
                    "the request and deleted with the binding. `physical` is pending while this console's "
                    "database files still hold it (SQLite: until a checkpoint, retried every minute; PostgreSQL: "
                    "until an operator runs manage.py finish_erasure), then erased; `holders` names what still "
                    "holds it, as a receipt of the embedded engine does.")


def binding_json(b: EngineBinding, current: BoundDelete | None = None) -> dict[str, Any]:
    return {
        "id": b.public_id, "engine_id": b.engine_id, "engine": b.engine_url,
        "owner": {"kind": b.owner_kind, "id": b.owner_id}, "scope": b.scope, "thread_id": b.thread_id,
        "title": b.title, "engine_state": b.engine_state, "last_activity_at": iso(b.last_activity_at),
        "delete": current.public_id if current else None, "delete_state": current.state if current else None,
        "returned_after": b.returned_after.public_id if b.returned_after_id else None,
        "synced_at": iso(b.synced_at), "title_copy_pending_since": iso(b.copy_pending_since),
    }


def engine_read_json(read) -> dict[str, Any]:
    """One of `remote.sync.configured_reads()`, as the list shows it."""
    return {"engine": read.engine_url, "state": read.shown_state, "started_at": iso(read.started_at),
            "read_at": iso(read.read_at), "failed_at": iso(read.failed_at), "failing": bool(read.shown_code),
            "error": read.shown_code or None, "error_message": read.words or None,
            "rejected": read.left_out, "rejected_conversations": read.left_out_named}


def bound_delete_json(op: BoundDelete) -> dict[str, Any]:
    pending = op.state == "pending"
    # This console's job cluster takes every next step of a pending delete: stopped, it is whose
    # next step it is, whatever the delete waited for before.
    stopped = cluster_stopped() if pending else None
    return {
        "id": op.public_id, "kind": "bound_delete", "binding": op.binding.public_id if op.binding_id else None,
        "engine_id": op.engine_id, "engine": op.engine_url, "owner": {"kind": op.owner_kind, "id": op.owner_id},
        "scope": op.scope, "thread_id": op.thread_id, "state": op.state, "outcome": op.state,
        "code": op.code or None, "message": error_text(op.code) or None, "way_out": op.way_out,
        "waiting_on": ("console" if stopped else op.waiting_on or None) if pending else None,
        "waiting_message": waiting_text(op, stopped) or None,
        "attempts": op.attempts, "next_attempt_at": iso(op.next_attempt_at) if pending else None,
        "last_error": op.last_error or None, "last_error_message": error_text(op.last_error) or None,
        # (a delete ended by code from before r75 kept the time of an error it no longer had)
        "last_error_at": iso(op.last_error_at) if op.last_error else None, "engine_operation": op.engine_operation or None,
        "engine_state": op.engine_state or None, "engine_step": op.engine_step or None,
        "receipt": op.receipt if op.state == "completed" else None, "receipt_at": iso(op.receipt_at),
        "receipt_read_at": iso(op.receipt_read_at), "acknowledged_at": iso(op.acknowledged_at), "requested_at": iso(op.requested_at),
        "completed_at": iso(op.completed_at), "console_copy": console_copy(op),
    }


def current_deletes(bindings) -> dict[int, BoundDelete]:
    rows = BoundDelete.objects.filter(binding__in=bindings, state="pending")
    return {op.binding_id: op for op in rows}


class BindingsQuery(QuerySchema):
    error_codes = {"owner_id": "invalid_filter", "limit": "invalid_limit", "cursor": "invalid_cursor"}

    owner_kind: Literal["account", "computer"] | None = None
    owner_id: Annotated[WholeNumber, Field(ge=0)] | None = None
    limit: Limit = DEFAULT_LIMIT
    cursor: Annotated[str, Field(max_length=200, description="The `next` of the previous page.")] | None = None

    @model_validator(mode="after")
    def _owner_pair(self) -> BindingsQuery:
        if (self.owner_kind is None) != (self.owner_id is None):
            raise QueryRule(OWNER_PAIR)
        return self


BINDING_ID = r"b_[0-9a-f]{20}"
DELETE_ID = r"bd_[0-9a-f]{20}"


@endpoint("GET", "/api/v1/bindings", query=BindingsQuery, response=BindingPageOut, name="api-bindings",
          summary="One owner's conversations on the remote engine (an account or a computer, never both)",
          description="Without `owner_kind` and `owner_id`, the first owner's (accounts first, by id). Pages of "
                      "up to `limit`, in the order this console first listed the conversations (a binding made "
                      "later comes on a later page, never on one already read); `next` is the `cursor` of the "
                      "next page.")
def binding_list(request: HttpRequest, query: BindingsQuery) -> dict:
    kind, owner_id = query.owner_kind, query.owner_id
    after = None
    if query.cursor:  # a bad one is 400 on an empty list too
        cursor_kind, cursor_owner, after = _cursor_place(query.cursor)
        if kind is None:  # the owner the pages before listed (the first one then)
            kind, owner_id = cursor_kind, cursor_owner
        elif (kind, owner_id) != (cursor_kind, cursor_owner):  # another owner's list: it would skip rows
            raise cursor_of_another_list()
    from remote.sync import configured_reads

    reads = [engine_read_json(read) for read in configured_reads()]
    if kind is None:
        first = EngineBinding.objects.order_by("owner_kind", "owner_id").values_list("owner_kind", "owner_id").first()
        if first is None:
            return {"owner": None, "results": [], "next": None, "reads": reads}
        kind, owner_id = first
    rows = EngineBinding.objects.select_related("returned_after").filter(owner_kind=kind, owner_id=owner_id)
    if after is not None:
        rows = rows.filter(pk__gt=after)
    rows = list(rows.order_by("pk")[: query.limit + 1])
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    current = current_deletes(rows)
    return {"owner": {"kind": kind, "id": owner_id}, "results": [binding_json(b, current.get(b.pk)) for b in rows],
            "next": encode_token("b2", kind, str(owner_id), str(rows[-1].pk)) if more else None, "reads": reads}


def _cursor_place(token: str) -> tuple[str, int, int]:
    """The owner whose list a `next` was handed out by, and the place it stands for (the last
    binding of the page before, which may be gone since: its delete completed)."""
    try:
        version, kind, owner_id, place = token_fields(token, 4)
        if version != "b2" or kind not in ("account", "computer"):
            raise InvalidCursor(token)
        return kind, token_pk(owner_id), token_pk(place)
    except InvalidCursor:  # the words every list's cursor has (r153: these were shorter)
        raise cursor_of_another_list() from None


@endpoint("DELETE", "/api/v1/bindings/{binding_id}", response={202: BoundDeleteOut}, admin=True,
          errors=(409, 422), headers=(IDEMPOTENCY_KEY,), name="api-binding-delete",
          summary="Delete a conversation on its engine, keeping its binding until the engine's receipt",
          description="202 with the bound delete: Pending while the engine erases it or cannot be reached "
                      "(retried by itself, with the same key), Completed once the engine's receipt is "
                      "acknowledged. An engine that does not offer delete answers 409 with outcome "
                      "unavailable; with LIFECYCLE_OFFLINE_DELETE=refuse an unreachable engine answers 409 "
                      "`engine_offline` and nothing is recorded. The same key answers with the recorded outcome "
                      "ever after (422 when it was used for another conversation). A new key joins the delete "
                      "under way; once a delete completed it let the binding go, and the binding's id then "
                      "answers a new key with that delete (202, Completed), as the engine answers a new key for "
                      "a conversation it deleted; 404 only for an id this console never bound.")
def binding_delete(request: HttpRequest, binding_id: str) -> tuple[int, dict]:
    key = request.headers.get("Idempotency-Key")
    well_formed = re.fullmatch(BINDING_ID, binding_id) is not None
    binding = EngineBinding.objects.filter(public_id=binding_id).first() if well_formed else None
    if binding is None:
        # A completed delete let its binding go: the same key still answers with its outcome, and
        # a new one with that delete (r122: 404), as the engine's delete answers a new key.
        from remote.delivery import released_delete, request_released_delete

        done = released_delete(binding_id) if well_formed else None
        if done is None:
            raise ApiError(404, "not_found", _("Nothing with that id exists here."))
        op, _new = request_released_delete(done, key=key)
    else:
        op = request_bound_delete(binding, key=key, actor=request.user)
    if op.state in ("refused", "unavailable"):
        raise ApiError(409, op.code or "refused", error_text(op.code), outcome=op.state, operation=op.public_id)
    return 202, bound_delete_json(op)


@endpoint("GET", "/api/v1/bound-deletes/{delete_id}", response=BoundDeleteOut, name="api-bound-delete",
          summary="A bound delete: whose step it is, attempts, next retry, last error, the engine's receipt")
def bound_delete_detail(request: HttpRequest, delete_id: str) -> dict:
    op = BoundDelete.objects.select_related("binding").filter(public_id=delete_id).first() \
        if re.fullmatch(DELETE_ID, delete_id) else None
    if op is None:
        raise ApiError(404, "not_found", _("Nothing with that id exists here."))
    return bound_delete_json(op)


class SyncOut(Schema):
    created: int
    updated: int = Field(description="Conversations already listed here, brought up to date (title, state, "
                                     "activity), whether or not anything about them changed.")
    returned: int = Field(description="Conversations the engine lists again after their delete completed here "
                                      "(restored there): bound again, without their title, for a new delete.")
    rejected: int = Field(description="Rows of the engine's list left out: not in the form expected, so this "
                                      "console cannot keep them. The other conversations were read. (A title "
                                      "longer than 300 characters is not refused: it is shortened.)")
    rejected_conversations: list[RejectedOut] = Field(description="The first 20 rows left out.")


@endpoint("POST", "/api/v1/bindings-sync", response=SyncOut, admin=True, errors=(409,), name="api-bindings-sync",
          summary="Read the engine's conversations and keep their bindings in step")
def bindings_sync(request: HttpRequest) -> dict:
    from django.conf import settings

    from remote.sync import refresh

    if not settings.ENGINE_URL:
        raise ApiError(409, "engine_embedded", _("This console uses its embedded engine; there is nothing to read."))
    return refresh("")
