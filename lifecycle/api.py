"""The engine API under /v1/: read threads and items; the runtime's item write path."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from django.db.models import Q
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from console.api import ApiError, Field, api_view, is_number, parse_body
from lifecycle.actions.append_item import append_item
from lifecycle.actions.update_item import update_item
from lifecycle.errors import ActionRefused
from lifecycle.models import Conversation, Item, ItemStatus, Role, ToolKind
from lifecycle.serializers import item_json, thread_json

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
THREAD_FILTERS = {"view", "owner_kind", "owner_id", "q", "archived", "closed", "active", "limit", "cursor"}


def _limit(request: HttpRequest) -> int:
    raw = request.GET.get("limit", str(DEFAULT_LIMIT))
    if not is_number(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, "invalid_limit", _("limit must be a whole number from 1 to %(max)s.") % {"max": MAX_LIMIT})
    return int(raw)


def _bool(request: HttpRequest, name: str) -> bool | None:
    raw = request.GET.get(name)
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise ApiError(400, "invalid_filter", _("%(name)s must be true or false.") % {"name": name})
    return raw == "true"


def _encode_cursor(c: Conversation) -> str:
    return base64.urlsafe_b64encode(f"{c.last_activity_at.isoformat()}|{c.pk}".encode()).decode()


def _decode_cursor(raw: str) -> tuple[datetime, int]:
    try:
        moment, pk = base64.urlsafe_b64decode(raw.encode()).decode().split("|")
        parsed = parse_datetime(moment)
        if parsed is None:
            raise ValueError
        return parsed, int(pk)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ApiError(400, "invalid_cursor", _("The cursor is not valid.")) from None


def filtered_threads(request: HttpRequest):
    unknown = sorted(set(request.GET) - THREAD_FILTERS)
    if unknown:
        raise ApiError(400, "unknown_filter", _("Unknown filter: %(name)s.") % {"name": unknown[0][:60]})
    qs = Conversation.objects.with_activity()
    view = request.GET.get("view")
    if view is not None:
        if view not in ("recent", "archived", "closed", "all"):
            raise ApiError(400, "invalid_filter", _("view must be recent, archived, closed or all."))
        qs = {"recent": qs.recent, "archived": qs.archived, "closed": qs.closed, "all": qs.all}[view]()
    owner_kind = request.GET.get("owner_kind")
    if owner_kind is not None:
        owner_id = request.GET.get("owner_id", "")
        if owner_kind not in ("account", "computer") or not is_number(owner_id):
            raise ApiError(400, "invalid_filter", _("owner_kind must be account or computer, with a numeric owner_id."))
        qs = qs.owned_by(owner_kind, int(owner_id))
    if request.GET.get("q"):
        qs = qs.search(request.GET["q"][:200])
    for name, lookup in (("archived", "archived_at__isnull"), ("closed", "closed_at__isnull")):
        flag = _bool(request, name)
        if flag is not None:
            qs = qs.filter(**{lookup: not flag})
    active = _bool(request, "active")
    if active is not None:
        qs = qs.filter(is_active=active)
    return qs


@api_view(("GET",))
def thread_list(request: HttpRequest) -> JsonResponse:
    qs = filtered_threads(request).select_related("account", "computer")
    limit = _limit(request)
    if request.GET.get("cursor"):
        moment, pk = _decode_cursor(request.GET["cursor"])
        qs = qs.filter(Q(last_activity_at__lt=moment) | Q(last_activity_at=moment, pk__lt=pk))
    rows = list(qs.order_by("-last_activity_at", "-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return JsonResponse(
        {"results": [thread_json(c) for c in rows], "next": _encode_cursor(rows[-1]) if more else None}
    )


def _thread(public_id: str) -> Conversation:
    return get_object_or_404(Conversation.objects.with_activity(), public_id=public_id)


@api_view(("GET",))
def thread_detail(request: HttpRequest, public_id: str) -> JsonResponse:
    return JsonResponse(thread_json(_thread(public_id)))


ITEM_FIELDS = {
    "role": Field((str,), required=True, choices=tuple(Role.values)),
    "content": Field((str,), max_length=200_000),
    "tool_kind": Field((str,), choices=("", *ToolKind.values)),
    "tool_call_id": Field((str,), max_length=80),
    "status": Field((str,), choices=("", *ItemStatus.values)),
    "title": Field((str,), max_length=300),
    "payload": Field((dict, list, str, int, float), nullable=True),
}
ITEM_PATCH_FIELDS = {
    "status": Field((str,), choices=("", *ItemStatus.values)),
    "title": Field((str,), max_length=300),
    "payload": Field((dict, list, str, int, float), nullable=True),
    "revision": Field((int,)),
}


@api_view(("GET", "POST"), write=("POST",))
def thread_items(request: HttpRequest, public_id: str) -> JsonResponse:
    conversation = _thread(public_id)
    if request.method == "POST":
        body = parse_body(request, ITEM_FIELDS)
        if body["role"] == Role.TOOL and not body.get("tool_kind"):
            raise ApiError(400, "missing_field", _("Missing field: %(field)s.") % {"field": "tool_kind"})
        try:
            item = append_item(conversation, **body)
        except ActionRefused as exc:
            raise ApiError(exc.status, exc.code, exc.message) from None
        return JsonResponse(item_json(item), status=201)
    limit = _limit(request)
    after = request.GET.get("after", "0")
    if not is_number(after):
        raise ApiError(400, "invalid_cursor", _("The cursor is not valid."))
    rows = list(Item.objects.filter(conversation=conversation, seq__gt=int(after)).order_by("seq")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return JsonResponse({"results": [item_json(i) for i in rows], "next": str(rows[-1].seq) if more else None})


@api_view(("GET", "PATCH"), write=("PATCH",))
def thread_item(request: HttpRequest, public_id: str, item_id: int) -> JsonResponse:
    conversation = _thread(public_id)
    item = get_object_or_404(Item, conversation=conversation, pk=item_id)
    if request.method == "PATCH":
        body = parse_body(request, ITEM_PATCH_FIELDS)
        if "revision" in body and body["revision"] < 1:
            raise ApiError(400, "invalid_type", _("Field %(field)s has the wrong type.") % {"field": "revision"})
        try:
            item = update_item(item, **body)
        except ActionRefused as exc:
            raise ApiError(exc.status, exc.code, exc.message) from None
    return JsonResponse(item_json(item))
