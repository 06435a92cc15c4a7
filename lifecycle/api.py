"""The engine API under /v1/: read threads and items; the runtime's item write path."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from pydantic import BeforeValidator, Field, model_validator

from console.api import (
    MAX_REVISION,
    MAX_WHOLE_NUMBER,
    OWNER_PAIR,
    AnyText,
    ApiError,
    Header,
    QueryRule,
    QuerySchema,
    Schema,
    endpoint,
    is_number,
)
from lifecycle import runtime_status as runtime
from lifecycle import transcript
from lifecycle.actions.append_item import append_item
from lifecycle.actions.request_deletion import KEY_INVALID, KEY_PATTERN
from lifecycle.actions.update_item import update_item
from lifecycle.engine import get_engine
from lifecycle.engine_health import REASONS
from lifecycle.errors import ActionRefused
from lifecycle.fence import check_readable, check_writable
from lifecycle.functions import OctetLength
from lifecycle.models import (
    Account,
    ClaimKind,
    Computer,
    Conversation,
    Item,
    ItemStatus,
    Role,
    ToolKind,
)
from lifecycle.paging import (
    Cursor,
    InvalidCursor,
    changed_since,
    encode_token,
    list_scope,
    listing,
    snapshot_page,
    token_fields,
    token_pk,
)
from lifecycle.serializers import (
    ItemOut,
    ItemPageOut,
    OperationOut,
    OperationPageOut,
    Payload,
    PreviewOut,
    ThreadOut,
    ThreadPageOut,
    iso,
    item_json,
    thread_json,
)

MAX_LIMIT = 200
DEFAULT_LIMIT = 50


def _whole_number(value: Any) -> Any:
    # Query values are text: only plain ASCII digits count (int() would also take "²" or " 5").
    if isinstance(value, str):
        if not is_number(value):
            raise ValueError("not a whole number")
        return int(value)
    return value


# A whole number in a query; its bound is the one is_number enforces, so the document says it.
WholeNumber = Annotated[int, BeforeValidator(_whole_number), Field(le=MAX_WHOLE_NUMBER)]
Limit = Annotated[WholeNumber, Field(ge=1, le=MAX_LIMIT, description=f"Page size, 1 to {MAX_LIMIT}.")]
Flag = Literal["true", "false"]

ITEM_KEY = Header(
    "Idempotency-Key", required=False, pattern=KEY_PATTERN, invalid_code="idempotency_key_invalid",
    invalid_message=KEY_INVALID,
    description="Optional: 1 to 200 printable ASCII characters without spaces, unique per item the runtime "
                "appends to this conversation. A retry of the same request with the same key answers with that "
                "item instead of appending it again.",
)


class ThreadsQuery(QuerySchema):
    error_codes = {"limit": "invalid_limit", "cursor": "invalid_cursor"}

    view: Literal["recent", "archived", "closed", "pending_delete", "deleted", "all"] | None = None
    owner_kind: Literal["account", "computer"] | None = None
    owner_id: Annotated[WholeNumber, Field(ge=0)] | None = None
    q: Annotated[str, Field(max_length=200, description="Search in thread ids, and in the titles of live conversations.")] | None = None
    archived: Flag | None = None
    closed: Flag | None = None
    active: Flag | None = None
    limit: Limit = DEFAULT_LIMIT
    cursor: Annotated[str, Field(max_length=200, description="The `next` of the previous page.")] | None = None

    @model_validator(mode="after")
    def _owner_pair(self) -> ThreadsQuery:
        if (self.owner_kind is None) != (self.owner_id is None):
            raise QueryRule(OWNER_PAIR)
        return self


def cursor_of_another_list() -> ApiError:
    """A cursor handed out for other filters, by an earlier version, or damaged: 400."""
    return ApiError(400, "invalid_cursor", _("The cursor is not valid for this list: it was handed out for other "
                                             "filters or by an earlier version, or it is damaged. Ask for the first "
                                             "page again, without a cursor."))


def filtered_threads(query: ThreadsQuery):
    qs = Conversation.objects.with_activity()
    if query.view is not None:
        qs = {"recent": qs.recent, "archived": qs.archived, "closed": qs.closed, "pending_delete": qs.pending_delete,
              "deleted": qs.deleted, "all": qs.all}[query.view]()
    if query.owner_kind is not None and query.owner_id is not None:
        qs = qs.owned_by(query.owner_kind, query.owner_id)
    if query.q:
        qs = qs.search(query.q)
    for flag, lookup in ((query.archived, "archived_at__isnull"), (query.closed, "closed_at__isnull")):
        if flag is not None:
            qs = qs.filter(**{lookup: flag != "true"})
    if query.active is not None:
        qs = qs.filter(is_active=query.active == "true")
    return qs


@endpoint("GET", "/v1/threads", query=ThreadsQuery, response=ThreadPageOut, name="api-thread-list",
          summary="List conversations, newest activity first, paged against a snapshot",
          description=(
              "The first page fixes `as_of`, the moment the listing started, and every `next` cursor "
              "carries it. Later pages list, in activity order, the conversations whose latest activity "
              "is at or before `as_of`, after the previous page's last row: each exactly once, however "
              "the conversations change meanwhile. A conversation whose activity is after `as_of` (it "
              "changed, or is new, since the first page), or that came into the view after it "
              "(unarchived, resumed, deleted), is left out of later pages and counted in "
              "`changed_since_start`, as is one whose write committed after a page was read with a moment "
              "before `as_of` (unless, between the same two pages, a conversation already passed leaves "
              "the list's filters); ask for the first page again, without a cursor, to see it in its "
              "new place. `view=deleted` lists tombstones newest deletion first instead."
          ))
def thread_list(request: HttpRequest, query: ThreadsQuery) -> dict:
    qs = filtered_threads(query).select_related("account", "computer").with_delete_operation()
    cursor = None
    # A cursor is of one list: these filters (another list's would skip rows of this one)
    scope = list_scope("api", query.view, query.owner_kind, query.owner_id, query.q, query.archived, query.closed,
                       query.active)
    if query.cursor:
        try:
            cursor = Cursor.decode(query.cursor, scope)
        except InvalidCursor:
            raise cursor_of_another_list() from None
        if cursor.backward:
            raise cursor_of_another_list()
    qs, key = listing(qs, query.view)
    page = snapshot_page(qs, cursor, query.limit, count=False, key=key, scope=scope)
    return {
        "results": [thread_json(c) for c in page.rows],
        "next": page.next.encode() if page.next else None,
        "as_of": iso(page.as_of),
        "changed_since_start": changed_since(qs, page.as_of) + page.late if cursor else 0,
    }


class OwnerListedOut(Schema):
    kind: Literal["account", "computer"]
    id: int = Field(description="The `owner_id` of `GET /v1/threads?owner_kind=&owner_id=`.")
    name: str
    account_id: int | None = Field(description="A computer's account, when it has one (always null for an account).")


class OwnersOut(Schema):
    results: list[OwnerListedOut]
    next: str | None = Field(description="The `cursor` of the next page; null on the last.")


class OwnersQuery(QuerySchema):
    error_codes = {"limit": "invalid_limit", "cursor": "invalid_cursor"}

    kind: Literal["account", "computer"] | None = None
    limit: Limit = DEFAULT_LIMIT
    cursor: Annotated[str, Field(max_length=200, description="The `next` of the previous page.")] | None = None


@endpoint("GET", "/v1/owners", query=OwnersQuery, response=OwnersOut, name="api-owners",
          summary="The accounts and computers conversations belong to",
          description="Accounts, then computers (or only the `kind` asked for), each in the order they were "
                      "added, in pages of up to `limit`: the owners the conversation list's owner filter offers "
                      "(accounts own synced conversations, computers local ones). One added meanwhile comes on a "
                      "later page, never on one already read.")
def owner_list(request: HttpRequest, query: OwnersQuery) -> dict:
    kinds = [query.kind] if query.kind else ["account", "computer"]
    after_kind, after = kinds[0], 0
    if query.cursor:
        try:
            version, after_kind, place = token_fields(query.cursor, 3)
            after = token_pk(place)
            if version != "w1" or after_kind not in kinds:
                raise InvalidCursor(query.cursor)
        except InvalidCursor:
            raise cursor_of_another_list() from None
    rows: list[dict[str, Any]] = []
    for kind in kinds[kinds.index(after_kind):]:
        model = Account if kind == "account" else Computer
        found = model.objects.filter(pk__gt=after if kind == after_kind else 0).order_by("pk")
        rows += [{"kind": kind, "id": o.pk, "name": o.name, "account_id": getattr(o, "account_id", None)}
                 for o in found[: query.limit + 1 - len(rows)]]
        if len(rows) > query.limit:
            break
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    return {"results": rows, "next": encode_token("w1", rows[-1]["kind"], str(rows[-1]["id"])) if more else None}


def _thread(public_id: str) -> Conversation:
    return get_object_or_404(Conversation.objects.with_activity().with_delete_operation().select_related(
        "account", "computer"), public_id=public_id)


@endpoint("GET", "/v1/threads/{public_id}", response=ThreadOut, name="api-thread-detail",
          summary="One conversation")
def thread_detail(request: HttpRequest, public_id: str) -> dict:
    return thread_json(_thread(public_id))


class ItemsQuery(QuerySchema):
    error_codes = {"limit": "invalid_limit", "after": "invalid_cursor"}

    after: Annotated[WholeNumber, Field(ge=0, description="Items after this sequence number.")] = 0
    limit: Limit = DEFAULT_LIMIT


class ItemIn(Schema):
    role: Literal[tuple(Role.values)]  # type: ignore[valid-type]
    content: Annotated[str, Field(max_length=200_000)] = ""
    tool_kind: Annotated[Literal[("", *ToolKind.values)], Field(  # type: ignore[valid-type]
        description="Required for a tool item (400 missing_field without it); empty for a message.")] = ""
    tool_call_id: Annotated[str, Field(max_length=80)] = ""
    status: Literal[("", *ItemStatus.values)] = ""  # type: ignore[valid-type]
    title: Annotated[str, Field(max_length=300)] = ""
    payload: Payload = None


def _no_default(schema: dict[str, Any]) -> None:
    """A field of a change left out means "as it is", which no value stands for: the published
    schema shows no default (r108: `status: ""`, `title: ""`, `payload: null` were declared as
    defaults, and a generated client that filled them in cleared the status and erased the output)."""
    schema.pop("default", None)


class ItemPatchIn(Schema):
    status: Annotated[Literal[("", *ItemStatus.values)], Field(  # type: ignore[valid-type]
        description="Leave it out to keep the status; \"\" clears it.", json_schema_extra=_no_default)] = ""
    title: Annotated[str, Field(max_length=300, description="Leave it out to keep the title; \"\" clears it.",
                                json_schema_extra=_no_default)] = ""
    payload: Annotated[Payload, Field(description=(
        "Leave it out to keep the payload; a value replaces it whole, and null removes it (and with it "
        "the tool's output)."), json_schema_extra=_no_default)] = None
    # Optional: without it the change is not checked against a revision (the schema says so: a
    # default of 1 made generated clients believe every change was checked).
    revision: Annotated[int, Field(ge=1, le=MAX_REVISION, description=(
        "Refuse the change (409 `stale_revision`) unless the item is at this revision. A change whose every "
        "field already holds what it would store (the same change sent again) is answered with the item as it "
        "is, whatever this says. Leave it out to change the item whatever its revision."),
        json_schema_extra=_no_default)] = None  # type: ignore[assignment]


def _item_page(conversation: Conversation, after: int, limit: int) -> tuple[list[Item], bool]:
    """Up to `limit` items after `after`, stopping early at API_MAX_PAGE_BYTES (at least one).

    Sizes are read first, so a page of huge items is cut without loading their payloads.
    """
    sizes = list(
        Item.objects.filter(conversation=conversation, seq__gt=after)
        .order_by("seq")
        .values_list("pk", "payload_bytes", OctetLength("content"))[: limit + 1]
    )
    chosen, total = [], 0
    for pk, payload_bytes, content_bytes in sizes[:limit]:
        total += payload_bytes + (content_bytes or 0)
        if chosen and total > settings.API_MAX_PAGE_BYTES:
            break
        chosen.append(pk)
    items = list(Item.objects.filter(pk__in=chosen).order_by("seq"))
    return items, len(sizes) > len(chosen)


def _readable_thread(public_id: str) -> Conversation:
    """The conversation whose content is asked for: 410 `conversation_deletion_pending` once its
    delete intent exists (Pending or Completed), before any item is looked up."""
    conversation = _thread(public_id)
    check_readable(conversation)
    return conversation


ERASED = ("410 `conversation_deletion_pending` once the conversation's delete is requested, while it is "
          "Pending as after it completed: its content is being erased, or is, and is not served.")


@endpoint("GET", "/v1/threads/{public_id}/items", query=ItemsQuery, response=ItemPageOut, errors=(410,),
          name="api-thread-items", summary="A page of a conversation's items, in order",
          description="A page holds at most `limit` items and stops early, after at least one item, "
                      "once the items reach the configured byte budget; follow `next` for the rest. " + ERASED)
def thread_items(request: HttpRequest, public_id: str, query: ItemsQuery) -> dict:
    items, more = _item_page(_readable_thread(public_id), query.after, query.limit)
    return {"results": [item_json(i) for i in items], "next": str(items[-1].seq) if more else None}


@endpoint("POST", "/v1/threads/{public_id}/items", body=ItemIn, response={201: ItemOut, 200: ItemOut},
          admin=True, errors=(409, 422), headers=(ITEM_KEY,), name="api-thread-items-append",
          summary="Append an item (the runtime's write path)",
          description="201 with the new item. A tool item reusing the `tool_call_id` of an item whose details the "
                      "tool payload cleanup removed is refused with 409 `tool_details_removed`. With an "
                      "`Idempotency-Key`, a retry of the same request answers 200 with the item that key appended, as "
                      "it is now, and appends nothing; the key sent with another request is refused with 422 "
                      "`idempotency_key_reused`.")
def thread_items_append(request: HttpRequest, public_id: str, body: ItemIn) -> tuple[int, dict]:
    conversation = _thread(public_id)
    if body.role == Role.TOOL and not body.tool_kind:
        raise ApiError(400, "missing_field", _("Missing field: %(field)s.") % {"field": "tool_kind"})
    key = request.headers.get(ITEM_KEY.name)  # checked against ITEM_KEY.pattern before the view
    item = append_item(conversation, **body.model_dump(), client_key=key)
    return (200 if getattr(item, "replayed", False) else 201), item_json(item)


@endpoint("GET", "/v1/threads/{public_id}/items/{item_id}", response=ItemOut, errors=(410,),
          name="api-thread-item", summary="One item", description=ERASED)
def thread_item(request: HttpRequest, public_id: str, item_id: int) -> dict:
    return item_json(get_object_or_404(Item, conversation=_readable_thread(public_id), pk=item_id))


class ItemOutputOut(Schema):
    id: int
    output: str


def details_removed(item: Item) -> ActionRefused:
    """410 for the full output of a tool item whose details cleanup removed."""
    refusal = ActionRefused(
        "tool_details_removed",
        _("The details of this tool call were removed by the retention policy and cannot be restored."),
        status=410,
    )
    refusal.extra = {"removed_at": iso(transcript.removed_at(item)), "summary": transcript.kept_summary(item)}
    return refusal


@endpoint("GET", "/v1/threads/{public_id}/items/{item_id}/output", response=ItemOutputOut, errors=(410,),
          name="api-thread-item-output", summary="The full output of one tool item",
          description="410 `tool_details_removed` with `removed_at` and the kept `summary` when the tool "
                      "payload cleanup removed the item's details. " + ERASED)
def thread_item_output(request: HttpRequest, public_id: str, item_id: int) -> dict:
    item = get_object_or_404(Item, conversation=_readable_thread(public_id), pk=item_id)
    if transcript.removed_at(item) is not None:
        raise details_removed(item)
    return {"id": item.pk, "output": transcript.full_output(item) if item.role == Role.TOOL else item.content}


@endpoint("PATCH", "/v1/threads/{public_id}/items/{item_id}", body=ItemPatchIn, response=ItemOut, admin=True,
          errors=(409,), name="api-thread-item-update",
          summary="Change an item's status, title or payload (only the fields sent)",
          description="Only the fields sent change; a payload sent replaces the whole. A `revision` other than "
                      "the item's is 409 `stale_revision`, except for a change that changes nothing (every "
                      "field sent already holds what it would store, as when the same change is sent again "
                      "after its answer was lost): that answers 200 with the item as it is, with no new "
                      "revision. On an item whose tool details cleanup removed, status and title apply and the payload "
                      "fields cleanup removes are dropped from the update; the removal marker stays. A "
                      "conversation being deleted, or deleted, refuses with 409 `conversation_deletion_pending` "
                      "before the item is looked up.")
def thread_item_update(request: HttpRequest, public_id: str, item_id: int, body: ItemPatchIn) -> dict:
    conversation = _thread(public_id)
    # The fence first, as appends and reads: once the delete is requested the items go, and a
    # runtime told 404 would take its item id for a wrong one (r36).
    check_writable(conversation)
    item = get_object_or_404(Item, conversation=conversation, pk=item_id)
    sent = body.model_dump(include=body.model_fields_set)
    revision = sent.pop("revision", None)
    return item_json(update_item(item, revision=revision, **sent))


# ---- Lifecycle: archive, close, delete, operations ------------------------------------------
# Every effect goes through the engine-client seam (lifecycle.engine), like the screens'.


class ThreadPatchIn(Schema):
    archived: bool | None = None
    closed: bool | None = None


class ClaimOut(Schema):
    kind: Literal[tuple(ClaimKind.values)]  # type: ignore[valid-type]
    label: str
    opened_at: str


class SubagentOut(Schema):
    agent_id: str
    status: Literal[(*runtime.CHILD_STATUS, "unknown")]  # type: ignore[valid-type]


class EngineProblemOut(Schema):
    path: str = Field(description="Relative to the engine folder.")
    code: Literal[tuple(REASONS)]  # type: ignore[valid-type]
    message: str


class RuntimeOut(Schema):
    messages: int = Field(description=f"Counted up to {runtime.COUNT_CAP:,}; `messages_over` says there are more.")
    messages_over: bool
    turns: int = Field(description="Running or queued turns.")
    claims: list[ClaimOut] = Field(description="Open runtime work, oldest first.")
    subagents: list[SubagentOut] | None = Field(description="Null when the fleet file cannot be read: unknown, "
                                                            "not none.")
    engine_files: int
    engine_bytes: int
    engine_complete: bool = Field(description="False when some of the conversation's engine files or folders "
                                              "could not be read: the figures are then at least these.")
    engine_problems: list[EngineProblemOut] = Field(description="Engine files that could not be read, and why.")


@endpoint("GET", "/v1/threads/{public_id}/runtime", response=RuntimeOut, name="api-thread-runtime",
          summary="A conversation's runtime status, as its page shows it",
          description="Messages, running or queued turns, open runtime work, subagents and engine files. Engine "
                      "files are read, never guessed at: one that cannot be read is named with why.")
def thread_runtime(request: HttpRequest, public_id: str) -> dict:
    status = runtime.runtime_status(get_object_or_404(Conversation, public_id=public_id))
    return {
        "messages": status.messages, "messages_over": status.messages_over, "turns": status.turns,
        "claims": [{"kind": c.kind, "label": c.label, "opened_at": iso(c.opened_at)} for c in status.claims],
        "subagents": None if status.fleet_unreadable else [{"agent_id": s.agent_id, "status": s.status}
                                                           for s in status.subagents],
        "engine_files": status.engine_files, "engine_bytes": status.engine_bytes,
        "engine_complete": not status.engine_uncounted,
        "engine_problems": [{"path": p.path, "code": p.code, "message": p.reason} for p in status.engine_problems],
    }


@endpoint("PATCH", "/v1/threads/{public_id}", body=ThreadPatchIn, response=ThreadOut, admin=True,
          errors=(409,), name="api-thread-update",
          summary="Archive or unarchive, close or resume a conversation",
          description="Each change is recorded as an audit fact; sending the current value changes nothing. "
                      "A conversation being deleted refuses with 409 `conversation_deletion_pending`. Both "
                      "changes of one request are made together or not at all.")
def thread_update(request: HttpRequest, public_id: str, body: ThreadPatchIn) -> dict:
    engine = get_engine()
    conversation = _thread(public_id)
    if body.archived is None and body.closed is None:
        check_writable(conversation)  # a change of nothing is refused too once a delete has begun
    # One transaction: a delete requested between the two changes left the first one made
    # under the second one's refusal (this route answers for the embedded engine only).
    with transaction.atomic():
        if body.archived is not None:
            engine.set_archived(public_id, body.archived, actor=request.user)
        if body.closed is not None:
            engine.set_closed(public_id, body.closed, actor=request.user)
    return thread_json(_thread(public_id))


IDEMPOTENCY_KEY = Header(
    "Idempotency-Key", required=True, pattern=KEY_PATTERN, code="idempotency_key_missing",
    invalid_code="idempotency_key_invalid", invalid_message=KEY_INVALID,
    description="The operation key: 1 to 200 printable ASCII characters without spaces. The same key and "
                "conversation answer with the recorded outcome ever after; the same key for another "
                "conversation is refused with 422.",
)


@endpoint("DELETE", "/v1/threads/{public_id}", response={202: OperationOut}, admin=True, errors=(409, 422),
          headers=(IDEMPOTENCY_KEY,), name="api-thread-delete",
          summary="Delete a conversation for good (erase its content, keep a tombstone)",
          description="202 with the operation while it is Pending or once Completed. A delete that is not "
                      "admitted answers 409 `{code, message, outcome: refused|unavailable, operation}` and "
                      "records no intent. Unknown ids and ids you may not see answer the same 404.")
def thread_delete(request: HttpRequest, public_id: str) -> tuple[int, dict]:
    op = get_engine().request_delete(public_id, key=request.headers.get("Idempotency-Key"), actor=request.user)
    if op.state in ("refused", "unavailable"):
        raise ApiError(409, op.code or "refused", op.message or "", outcome=op.state, operation=op.id)
    return 202, op.data


@endpoint("GET", "/v1/threads/{public_id}/deletion-preview", response=PreviewOut, name="api-thread-delete-preview",
          summary="What a delete of this conversation would erase, compact and keep, and whether it is admitted")
def thread_delete_preview(request: HttpRequest, public_id: str) -> dict:
    return get_engine().preview_delete(public_id)


OPERATION_ID = r"op_[0-9a-f]{20}"


def _operation_id(operation_id: str) -> str:
    if not re.fullmatch(OPERATION_ID, operation_id):
        raise ApiError(404, "not_found", _("Nothing with that id exists here."))
    return operation_id


@endpoint("GET", "/v1/operations/{operation_id}", response=OperationOut, name="api-operation",
          summary="A delete operation: state, current step, attempts, and the erasure receipt once completed")
def operation_detail(request: HttpRequest, operation_id: str) -> dict:
    return get_engine().operation(_operation_id(operation_id)).data


class OperationsQuery(QuerySchema):
    error_codes = {"limit": "invalid_limit", "cursor": "invalid_cursor", "offset": "invalid_cursor"}

    state: Literal["pending", "completed", "refused", "unavailable"] | None = None
    limit: Limit = DEFAULT_LIMIT
    cursor: Annotated[str, Field(max_length=200, description="The `next` or `previous` of a page.")] | None = None
    offset: Annotated[str, Field(
        max_length=200, description="Deprecated name of `cursor`; a whole number here skips that many rows, at "
                                    "most 1,000,000 (beyond: 400 invalid_cursor; follow `next` instead).",
    )] | None = None

    @model_validator(mode="after")
    def _one_position(self) -> OperationsQuery:
        if self.cursor is not None and self.offset is not None:
            raise QueryRule(gettext_lazy("cursor and offset do not go together: send one of them."))
        return self


@endpoint("GET", "/v1/operations", query=OperationsQuery, response=OperationPageOut, name="api-operations",
          summary="Delete operations, newest first, paged by `next` and `previous`")
def operation_list(request: HttpRequest, query: OperationsQuery) -> dict:
    try:
        page = get_engine().operations(state=query.state, limit=query.limit, position=query.cursor or query.offset)
    except ActionRefused as exc:
        if exc.code != "invalid_cursor" or query.offset is None or (query.offset.isascii() and query.offset.isdigit()):
            raise  # (a whole number fails only past the bound, which the engine's words say)
        # (r80: "The cursor is not valid." to a client that sent an offset and no cursor)
        raise ApiError(400, "invalid_cursor", _("The offset is neither a whole number of rows nor a cursor a page "
                                                "handed out.")) from None
    return {"results": [op.data for op in page.rows], "next": page.next, "previous": page.previous}


@endpoint("POST", "/v1/operations/{operation_id}/retry", response={202: OperationOut}, admin=True, errors=(409,),
          name="api-operation-retry", summary="Retry a pending delete that stopped retrying by itself")
def operation_retry(request: HttpRequest, operation_id: str) -> tuple[int, dict]:
    op = get_engine().operation(_operation_id(operation_id))
    if not op.is_pending:
        raise ApiError(409, "operation_not_pending", _("Only a pending delete can be retried."))
    return 202, get_engine().retry_operation(op.id, actor=request.user).data


class SubagentResolveIn(Schema):
    action: Literal["attribute", "clear"]
    conversation: Annotated[str, Field(max_length=32, description="attribute: the conversation the row belongs to.")] \
        | None = None


class SubagentResolveOut(Schema):
    agent_id: str
    action: Literal["attribute", "clear"]
    conversation: str | None


@endpoint("POST", "/v1/subagents/{agent_id}/resolve", body=SubagentResolveIn, response=SubagentResolveOut,
          admin=True, errors=(409,), name="api-subagent-resolve",
          summary="Attribute a subagent row of unknown origin to a conversation, or clear it",
          description="The way out of a delete not admitted with `conversation_child_ownership_ambiguous` among its "
                      "reasons (Unavailable, or Refused for another reason besides). "
                      "Recorded as an audit fact (agent id and origin only). A retry of a resolution "
                      "already made answers 200 again and changes nothing, also one sent while the first is "
                      "still under way: it waits for it (a row lock: on PostgreSQL at most DB_LOCK_WAIT_SECONDS, "
                      "then 503 `database_busy`), then answers as a retry. While another resolution of the row "
                      "is under way (the other action, or an attribution to another conversation) it answers "
                      "409 `busy` and changes nothing; 409 `subagent_not_ambiguous` for a row that names its "
                      "conversation itself.")
def subagent_resolve(request: HttpRequest, agent_id: AnyText, body: SubagentResolveIn) -> dict:
    if body.action == "attribute" and not body.conversation:
        raise ApiError(400, "missing_field", _("Missing field: %(field)s.") % {"field": "conversation"})
    if body.action == "clear" and body.conversation is not None:  # never silently dropped
        raise ApiError(400, "unknown_field", _("A clear names no conversation: leave out %(field)s.")
                       % {"field": "conversation"})
    get_engine().resolve_subagent(agent_id, action=body.action,
                                  conversation_id=body.conversation if body.action == "attribute" else None,
                                  actor=request.user)
    return {"agent_id": agent_id, "action": body.action,
            "conversation": body.conversation if body.action == "attribute" else None}
