"""Conversation screens. Every view renders the whole page, or its region for htmx."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.db.models.functions import Collate
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext, pgettext_lazy
from django.views.decorators.http import require_safe

from console.api import is_number
from lifecycle import runtime_status as runtime
from lifecycle.models import (
    Account,
    Computer,
    Conversation,
    ConversationQuerySet,
    ConversationState,
    DeleteOperation,
    Item,
)
from lifecycle.paging import Cursor, InvalidCursor, list_scope, listing, snapshot_page
from lifecycle.search import fold
from lifecycle.transcript import item_rows

VIEWS = ("recent", "archived", "closed", "pending_delete", "deleted")
PAGE_SIZE = 25
CHANGED_SAMPLE = 5
TRANSCRIPT_PAGE = 50
# Pages that show a pending delete read it again this often (seconds), only while one is shown.
LIVE_POLL_SECONDS = 3


def _owner_filter(request: HttpRequest) -> tuple[str, str, int | None, bool]:
    """`owner=account:3` or `owner=computer:7` of an owner that exists; anything else means
    every owner, and the last value says a link named an owner that is not here (an old or
    edited link: the list of every owner is shown, and says so, not "0 conversations" under
    "All owners")."""
    raw = request.GET.get("owner", "")
    kind, _sep, ident = raw.partition(":")
    if kind in ("account", "computer") and is_number(ident):
        model = Account if kind == "account" else Computer
        if model.objects.filter(pk=int(ident)).exists():
            return raw, kind, int(ident), False
    return "", "", None, bool(raw)


def list_scope_of(view: str, owner: str, query: str) -> str:
    """The console list's `list_scope`: its tab, owner and search."""
    return list_scope("console", view, owner, query)


def _cursor(request: HttpRequest, scope: str) -> Cursor | None:
    """The page's cursor; a malformed or stale one, or one of another list (another tab, owner
    or search), just starts again from the top."""
    try:
        return Cursor.decode(request.GET.get("cursor", ""), scope) if request.GET.get("cursor") else None
    except InvalidCursor:
        return None


@login_required
@require_safe
def conversation_list(request: HttpRequest) -> HttpResponse:
    view = request.GET.get("view", "recent")
    if view not in VIEWS:
        view = "recent"
    if request.htmx and request.GET.get("live"):
        return _list_live(request, view)
    owner, kind, owner_id, unknown_owner = _owner_filter(request)
    owner_find = request.GET.get("owner_find", "").strip()[:120]
    if request.htmx and request.GET.get("owner_options"):  # the Owner list narrowed as a name is typed
        return render(request, "lifecycle/_owner_options.html", {**owner_choices(owner_find, owner), "oob": True})
    query = request.GET.get("q", "").strip()[:200]
    qs, key = listing(_filtered(view, kind, owner_id, query).with_activity().with_delete_operation()
                      .select_related("account", "computer"), view)
    scope = list_scope_of(view, owner, query)
    page = snapshot_page(qs, _cursor(request, scope), PAGE_SIZE, changed_sample=CHANGED_SAMPLE, key=key, scope=scope)
    filters = urlencode({"view": view, "owner": owner, "q": query})
    context = {
        "view": view,
        "views": [
            ("recent", pgettext_lazy("conversation list tab", "Recent")),
            ("archived", pgettext_lazy("conversation list tab", "Archived")),
            ("closed", pgettext_lazy("conversation list tab", "Closed")),
            ("pending_delete", pgettext_lazy("conversation list tab", "Pending delete")),
            ("deleted", pgettext_lazy("conversation list tab", "Deleted")),
        ],
        "owner": owner,
        "unknown_owner": unknown_owner,
        "query": query,
        "page": page,
        "refresh_url": f"?{filters}",
        "next_url": f"?{filters}&cursor={page.next.encode()}" if page.next else "",
        "previous_url": f"?{filters}&cursor={page.previous.encode()}" if page.previous else "",
        **owner_choices(owner_find, owner),
        **_list_poller(view, [c.public_id for c in page.rows if c.state == ConversationState.PENDING_DELETE],
                       owner, query, total=page.total, listed=page.total),
    }
    template = "lifecycle/conversation_list.html"
    # htmx's back button, when its history cache misses, asks for the whole page again.
    if request.htmx and not request.htmx.boosted and not request.htmx.history_restore_request:
        template += "#results"
    response = render(request, template, context)
    if request.htmx and _current_path(request) == request.get_full_path():
        # The same search again (typing, then Enter): one history entry, not two.
        response["HX-Push-Url"] = "false"
    patch_vary_headers(response, ["HX-Request", "HX-History-Restore-Request"])
    return response


# The owners the Owner list offers at once. Past this many, a "Find an owner" field narrows it by
# name (r78: every account and computer was an option, 536 KB of a 625 KB page at 8,000 owners).
OWNER_CHOICES = 100


def owner_choices(find: str, chosen: str) -> dict:
    """The Owner list's options: every owner while there are at most OWNER_CHOICES; past that,
    the first OWNER_CHOICES by folded name of those whose folded name contains `find` folded
    (of all, without it), accounts first; the chosen owner (`owner=kind:id`, checked) always
    among them."""
    total = Account.objects.count() + Computer.objects.count()
    # Names compared and ordered folded (case and accents ignored, the same on both databases:
    # r95, SQLite's LIKE folded ASCII only and neither database ignored accents)
    wanted = fold(find) if total > OWNER_CHOICES else ""
    shown_accounts = _named(Account, wanted, OWNER_CHOICES)
    room = OWNER_CHOICES - len(shown_accounts)
    shown_computers = _named(Computer, wanted, room) if room else []
    matched = len(shown_accounts) + len(shown_computers)  # (r79: the chosen owner added below was counted)
    kind, _sep, ident = chosen.partition(":")
    if chosen and chosen not in {o.owner_key for o in [*shown_accounts, *shown_computers]}:
        found = (Account if kind == "account" else Computer).objects.filter(pk=int(ident)).first()
        if found is not None:
            (shown_accounts if kind == "account" else shown_computers).insert(0, found)
    return {"accounts": shown_accounts, "computers": shown_computers, "owners_total": total,
            "owners_shown": len(shown_accounts) + len(shown_computers), "owners_matched": matched,
            "owners_finder": total > OWNER_CHOICES, "owners_capped": matched >= OWNER_CHOICES,
            "owner_choices_max": OWNER_CHOICES, "owner_find": find, "owner": chosen}


def _named(model, wanted: str, limit: int) -> list:
    """The first `limit` owners of one kind whose folded name contains `wanted` (any, when it is
    empty), by folded name compared by code point on both databases (then name and id)."""
    owners = model.objects.all()
    if wanted:
        owners = owners.filter(search_name__contains=wanted)
    by_code_point = "C" if connection.vendor == "postgresql" else "BINARY"
    return list(owners.order_by(Collate("search_name", by_code_point), "name", "id")[:limit])


def _current_path(request: HttpRequest) -> str | None:
    """The page's address htmx sent (HX-Current-URL), as a path; None when it cannot be read
    (r51: "http://[" failed the list with a 500)."""
    try:
        return request.htmx.current_url_abs_path
    except ValueError:
        return None


def _filtered(view: str, kind: str, owner_id: int | None, query: str) -> ConversationQuerySet:
    """The list's conversations: its tab, its owner (`_owner_filter`) and its search, in no order."""
    qs = getattr(Conversation.objects, view)()
    if owner_id is not None:
        qs = qs.owned_by(kind, owner_id)
    return qs.search(query)


def _list_poller(view: str, pending: list[str], owner: str = "", query: str = "", *, total: int = 0,
                 listed: int = 0) -> dict:
    """The list's poller: it reads the rows shown as Pending delete again, and on the Pending
    delete tab the tab's count as long as it counts any (r124: every row shown could be done
    while deletes further down were still erased: the count stopped at a figure no longer true).
    None when there is neither. It carries the list's filters, so the count it reads counts the
    same list, the count shown (`n`) and the one the pages were listed with (`t`)."""
    if not pending and not (view == "pending_delete" and total > 0):
        return {"live_url": ""}
    filters = [("owner", owner)] * bool(owner) + [("q", query)] * bool(query)
    query_string = urlencode([("live", "1"), ("view", view), *filters, ("n", total), ("t", listed)]
                             + [("c", public_id) for public_id in pending])
    return {"live_url": f"{reverse('lifecycle:conversation-list')}?{query_string}", "live_poll": LIVE_POLL_SECONDS}


def _list_live(request: HttpRequest, view: str) -> HttpResponse:
    """The list's poll: 204 while each row it names is still Pending delete; else the rows that
    changed (replaced in place, out of band), and a poller for the rest."""
    asked = request.GET.getlist("c")[:PAGE_SIZE]
    rows = list(Conversation.objects.filter(public_id__in=asked).with_activity().with_delete_operation()
                .select_related("account", "computer"))
    changed = [c for c in rows if c.state != ConversationState.PENDING_DELETE]
    owner, kind, owner_id, _unknown = _owner_filter(request)
    query = request.GET.get("q", "").strip()[:200]
    shown, listed = (int(n) if is_number(n := request.GET.get(name, "")) and len(n) < 12 else -1 for name in "nt")
    total = _filtered(view, kind, owner_id, query).count()
    if not changed and total == shown:
        return HttpResponse(status=204)  # nothing changed: no swap, nothing said
    still = [c.public_id for c in rows if c.state == ConversationState.PENDING_DELETE]
    said = " ".join(gettext("Deleted: %(name)s.") % {"name": c.thread_id} if c.state == ConversationState.DELETED
                    else gettext("No longer pending delete: %(name)s.") % {"name": c.shown_title or c.thread_id}
                    for c in changed)
    # The list's count too: a row that left its tab (deleted, on Pending delete) is no longer counted.
    # Once it differs from the count the pages were listed with, the page says which is which.
    context = {"changed": changed, "view": view, "live_said": said, "page": {"total": total},
               "moved": listed >= 0 and total != listed,
               "refresh_url": "?" + urlencode({"view": view, "owner": owner, "q": query}),
               **_list_poller(view, still, owner, query, total=total, listed=listed)}
    return render(request, "lifecycle/_conversations_live.html", context)


@login_required
@require_safe
def conversation_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    if request.htmx and request.GET.get("live"):
        return _detail_live(request, public_id)
    conversation = get_object_or_404(
        Conversation.objects.with_activity().select_related("account", "computer"), public_id=public_id
    )
    after = request.GET.get("after", "0")
    after_seq = int(after) if is_number(after) else 0
    items = list(
        Item.objects.filter(conversation=conversation, seq__gt=after_seq).order_by("seq")[: TRANSCRIPT_PAGE + 1]
    ) if conversation.state == ConversationState.LIVE else []
    more = len(items) > TRANSCRIPT_PAGE
    items = items[:TRANSCRIPT_PAGE]
    status = runtime.runtime_status(conversation)
    context = {
        "conversation": conversation,
        "intent": DeleteOperation.objects.intents().filter(conversation=conversation).first(),
        "rows": item_rows(items),
        "next_after": items[-1].seq if more else None,
        "status": status,
        "count_cap": runtime.COUNT_CAP,
        **_detail_poller(conversation),
    }
    template = "lifecycle/conversation_detail.html"
    if request.htmx and after_seq:
        template += "#transcript-page"
    elif after_seq and items:
        # A whole page that starts later (the link followed without the script): it says what
        # it leaves out, with the way back to the start.
        context["earlier_count"], context["earlier_over"] = runtime.capped_count(
            Item.objects.filter(conversation=conversation, seq__lte=after_seq))
    return render(request, template, context)


def _detail_poller(conversation: Conversation) -> dict:
    """The page's poller while its delete is pending: it asks whether the state changed."""
    if conversation.state != ConversationState.PENDING_DELETE:
        return {"live_url": ""}
    query = urlencode({"live": "1", "v": conversation.state})
    return {"live_url": f"{reverse('lifecycle:conversation-detail', args=[conversation.public_id])}?{query}",
            "live_poll": LIVE_POLL_SECONDS}


def _detail_live(request: HttpRequest, public_id: str) -> HttpResponse:
    """The page's poll: 204 while the state is the one shown (one small read); else the parts
    that say the state (the heading, the tombstone note, the lifecycle link) out of band, with a
    link to reload the page for the rest of it."""
    conversation = get_object_or_404(Conversation.objects.select_related("account", "computer"), public_id=public_id)
    if conversation.state == request.GET.get("v"):
        return HttpResponse(status=204)
    context = {
        "conversation": conversation,
        "intent": DeleteOperation.objects.intents().filter(conversation=conversation).first(),
        "reload": True,
        "live_said": (gettext("The delete is complete: this conversation's content is erased.")
                      if conversation.state == ConversationState.DELETED else ""),
        **_detail_poller(conversation),
    }
    return render(request, "lifecycle/_conversation_live.html", context)


@login_required
@require_safe
def item_output(request: HttpRequest, public_id: str, item_id: int) -> HttpResponse:
    """The full output of one tool call, loaded on demand; as a page, the whole call (its
    summary values and text too, which the transcript shows as previews)."""
    conversation = get_object_or_404(Conversation, public_id=public_id)
    if conversation.state != ConversationState.LIVE:
        return _content_erased(request, conversation, item_id)
    # Only a tool call has an output to load: a message's address answers 404, not an empty page.
    item = get_object_or_404(Item, conversation=conversation, pk=item_id, role="tool")
    row = item_rows([item], full=True)[0]
    context = {"conversation": conversation, "row": row}
    if request.htmx and row.removed_on:
        # Removed since the transcript was shown (the cleanup ran meanwhile): the whole row
        # as it now reads (a transcript row: its previews), in place of the stale one, with
        # the 410 (lethe.js swaps it in).
        context["row"] = item_rows([item])[0]
        response = render(request, "lifecycle/_tool_row.html", context, status=410)
        response["HX-Retarget"], response["HX-Reswap"] = f"#item-{item.pk}", "outerHTML"
        return response
    template = "lifecycle/item_output.html"
    if request.htmx:
        template += "#output"
    # Gone: cleanup removed the details; the page says when and shows what was kept.
    return render(request, template, context, status=410 if row.removed_on else 200)


def _content_erased(request: HttpRequest, conversation: Conversation, item_id: int) -> HttpResponse:
    """410 for a tool output of a conversation whose delete was requested (Pending or done):
    the page says its content is being erased, or is, and shows none of it (not the item's
    title either), whatever the item and for admins and members alike. From a transcript
    still open from before, the answer takes the row's place (lethe.js swaps a 410 in)."""
    context = {"conversation": conversation, "item_id": item_id}
    if request.htmx:
        response = render(request, "lifecycle/item_output.html#erased-row", context, status=410)
        response["HX-Retarget"], response["HX-Reswap"] = f"#item-{item_id}", "outerHTML"
        return response
    return render(request, "lifecycle/item_output.html", context, status=410)
