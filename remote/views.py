"""Screens for conversations on a remote engine: one owner's list, delete, the delete's status.

Plain forms that work without JavaScript; htmx only refreshes a pending delete's status.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Min
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from console.api import is_number
from console.auth import is_admin
from console.viewer import back_to
from lifecycle.action_views import already_requested, rows_with_times
from lifecycle.actions.request_deletion import CHANGED_SINCE_SHOWN, form_message
from lifecycle.deletion.executor import changed_totals
from lifecycle.deletion.presentation import (
    holder_text,
    moment,
    preview_backups,
    preview_groups,
    receipt_rows,
)
from lifecycle.deletion.preview import preview_digest
from lifecycle.deletion.reasons import admission_reasons, folder_only
from lifecycle.errors import ActionRefused
from remote.api import bound_delete_json
from remote.delivery import (
    error_text,
    recorded_for_key,
    released_delete,
    request_bound_delete,
    request_released_delete,
)
from remote.models import BoundDelete, BoundDeleteKey, BoundDeleteState, EngineBinding
from remote.preview import admission_of, engine_preview
from remote.sync import configured_engines, configured_reads

POLL_SECONDS = 2
OWNER_CHOICES = 100  # owners the Owner list offers at once; past it, "Find an owner" narrows it
PAGE_SIZE = 100  # an owner's conversations per page
DELETES_PAGE_SIZE = 50  # the owner's deletes per page, the most recent first


def _owners() -> list[dict]:
    """Every owner with conversations on an engine: accounts first, then computers."""
    # .order_by(): the models' default orderings would put their columns in the DISTINCT (one
    # row per binding, every binding read on every page load: r78)
    pairs = EngineBinding.objects.order_by().values_list("owner_kind", "owner_id").distinct()
    pairs = sorted(set(pairs) | set(BoundDelete.objects.order_by().values_list("owner_kind", "owner_id").distinct()))
    owners = []
    for kind, pk in pairs:
        # The engine's owner ids: this console's own accounts and computers are other records.
        label = (_("Account %(id)s") if kind == "account" else _("Computer %(id)s")) % {"id": pk}
        owners.append({"key": f"{kind}:{pk}", "kind": kind, "id": pk, "label": label})
    return owners


def _owner_finder(owners: list[dict], find: str, chosen: dict | None) -> dict:
    """The Owner list's options: every owner while there are at most OWNER_CHOICES; past that
    (r78: 1,500 owners made a 170 KB page), the first OWNER_CHOICES of those whose number holds
    `find` (of all, without it), the chosen owner always among them."""
    matching = [o for o in owners if find in str(o["id"])] if find and len(owners) > OWNER_CHOICES else owners
    offered = matching[:OWNER_CHOICES]
    if chosen is not None and chosen not in offered:
        offered.insert(0, chosen)
    return {"owners": offered, "owners_total": len(owners), "owners_matched": len(matching),
            "owners_finder": len(owners) > OWNER_CHOICES, "owner_find": find, "owner_choices_max": OWNER_CHOICES}


@login_required
@require_safe
def binding_list(request: HttpRequest) -> HttpResponse:
    if request.htmx and request.GET.get("live"):
        return _bindings_live(request)
    owners = _owners()
    chosen = request.GET.get("owner") or (owners[0]["key"] if owners else "")
    owner = next((o for o in owners if o["key"] == chosen), None)
    unknown_owner = owner is None and bool(owners)  # an old or edited link: the first owner, said so
    if unknown_owner:
        owner = owners[0]
    finder = _owner_finder(owners, request.GET.get("owner_find", "").strip()[:20], owner)
    bindings, deletes, page, deletes_page, read_at = [], [], None, None, None
    if owner is not None:
        # Every conversation of the owner is reachable: pages of PAGE_SIZE (an owner may have
        # thousands; a cut without paging left the rest unlisted and undeletable from here).
        page = Paginator(EngineBinding.objects.select_related("returned_after")
                         .filter(owner_kind=owner["kind"], owner_id=owner["id"]), PAGE_SIZE).get_page(_page(request))
        bindings = list(page.object_list)
        # The list is the engine's as last read, not as it is now (r67: a conversation deleted
        # on the engine since was listed, with its title and a Delete, and no time said).
        read_at = EngineBinding.objects.filter(owner_kind=owner["kind"], owner_id=owner["id"]).aggregate(
            at=Min("synced_at"))["at"]
        pending = {op.binding_id: op for op in BoundDelete.objects.filter(binding__in=bindings, state="pending")}
        for b in bindings:
            b.pending_delete = pending.get(b.pk)
        deletes_page = Paginator(BoundDelete.objects.filter(owner_kind=owner["kind"], owner_id=owner["id"]),
                                 DELETES_PAGE_SIZE).get_page(_page(request, "deletes"))
        deletes = list(deletes_page.object_list)
    reads = configured_reads()
    return render(request, "remote/binding_list.html", {
        **finder, "owner": owner, "unknown_owner": unknown_owner, "bindings": bindings, "page": page,
        "bindings_count": page.paginator.count if page else 0,
        "deletes": deletes, "deletes_page": deletes_page, "read_at": read_at,
        # The engines whose latest read failed: the hourly read has no one else to tell.
        "failed_reads": [read for read in reads if read.shown_code],
        # ... and those whose last whole read left rows out (the hourly read only logged them)
        "left_out_reads": [read for read in reads if read.left_out],
        "can_read": bool(configured_engines()), "is_admin": is_admin(request.user),
        "db_sqlite": connection.vendor == "sqlite",  # what still holds a cleared title (remote.physical)
        **_bindings_poller({b.pending_delete.public_id for b in bindings if b.pending_delete}
                           | {d.public_id for d in deletes if d.state == BoundDeleteState.PENDING}),
    })


LIVE_POLL_SECONDS = 3


def _bindings_poller(pending: set[str]) -> dict:
    """The page's poller: it reads the pending deletes shown again, none when there are none."""
    if not pending:
        return {"live_url": ""}
    query = urlencode([("live", "1")] + [("d", public_id) for public_id in sorted(pending)])
    return {"live_url": f"{reverse('remote:binding-list')}?{query}", "live_poll": LIVE_POLL_SECONDS}


def _bindings_live(request: HttpRequest) -> HttpResponse:
    """The page's poll: 204 while each delete it names is pending; else, for those that ended,
    their row in the deletes and their conversation's row (gone from the list once the
    engine's receipt took its binding away), and a poller for the rest."""
    asked = request.GET.getlist("d")[:PAGE_SIZE + DELETES_PAGE_SIZE]
    rows = list(BoundDelete.objects.filter(public_id__in=asked))
    ended = [d for d in rows if d.state != BoundDeleteState.PENDING]
    if not ended:
        return HttpResponse(status=204)  # nothing changed: no swap, nothing said
    refs = {d.binding_ref for d in ended}
    bindings = list(EngineBinding.objects.select_related("returned_after").filter(public_id__in=refs))
    pending = {op.binding_id: op for op in BoundDelete.objects.filter(binding__in=bindings, state="pending")}
    for b in bindings:
        b.pending_delete = pending.get(b.pk)
    said = " ".join(f"{d.thread_id}: {d.get_state_display()}." for d in ended)
    gone = sorted(refs - {b.public_id for b in bindings})
    # The page shows one owner's conversations: its count again once rows left it
    owners = {(d.owner_kind, d.owner_id) for d in ended}
    count = None
    if gone and len(owners) == 1:
        ((kind, owner_id),) = owners
        count = EngineBinding.objects.filter(owner_kind=kind, owner_id=owner_id).count()
    return render(request, "remote/_bindings_live.html", {
        "bindings": bindings, "gone_bindings": gone, "deletes": ended, "bindings_count": count,
        "engine_url": settings.ENGINE_URL, "is_admin": is_admin(request.user), "live_said": said,
        "db_sqlite": connection.vendor == "sqlite",
        **_bindings_poller({d.public_id for d in rows if d.state == BoundDeleteState.PENDING}),
    })


def _page(request: HttpRequest, name: str = "page") -> int:
    """An asked page number: ASCII digits only, else the first page (past the last: the last)."""
    raw = request.GET.get(name, "")
    return int(raw) if is_number(raw) and int(raw) > 0 else 1


@login_required
@require_POST
def bindings_sync(request: HttpRequest) -> HttpResponse:
    if not is_admin(request.user):
        raise PermissionDenied
    from remote.sync import failed_read_text, read_text, refresh, rejected_text

    engines = configured_engines()
    if not engines:
        messages.error(request, _("This console uses its embedded engine; there is nothing to read."))
    for url in engines:  # every engine the list shows (r71: an ENGINE_TOKENS engine was never read here)
        which = _("The engine at %(url)s:") % {"url": url} + " " if url else ""
        try:
            counts = refresh(url)
        except ActionRefused as exc:
            messages.error(request, which + failed_read_text(exc))
            continue
        messages.success(request, which + read_text(counts))
        if counts["rejected"]:
            messages.warning(request, which + ngettext(
                "%(count)s conversation on the engine was left out: its row is not in the form expected (the "
                "field in brackets), so this console cannot keep it: %(named)s. The others were read.",
                "%(count)s conversations on the engine were left out: their rows are not in the form expected "
                "(the field in brackets), so this console cannot keep them: %(named)s. The others were read.",
                counts["rejected"]) % {"count": counts["rejected"],
                                       "named": rejected_text(counts["rejected_conversations"], counts["rejected"])})
        if counts["returned"]:
            messages.warning(request, which + ngettext(
                "%(returned)s conversation is on the engine again after its delete was completed here, as "
                "after a restore of the engine from a backup. It is listed without its title; delete it again.",
                "%(returned)s conversations are on the engine again after their deletes were completed here, "
                "as after a restore of the engine from a backup. They are listed without their titles; delete "
                "them again.",
                counts["returned"]) % counts)
    return redirect(back_to(request, reverse("remote:binding-list"), under="/engine/"))


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def binding_delete(request: HttpRequest, binding_id: str) -> HttpResponse:
    if request.method == "POST" and (answered := _answered_by_key(request, binding_id)) is not None:
        return answered
    binding = get_object_or_404(EngineBinding, public_id=binding_id)
    pending = BoundDelete.objects.filter(binding=binding, state="pending").first()
    context = {"binding": binding, "pending": pending, "key": "ui-" + secrets.token_hex(12),
               "is_admin": is_admin(request.user), "offline_refuses": settings.LIFECYCLE_OFFLINE_DELETE == "refuse"}
    if pending is None:
        preview = engine_preview(binding)
        # Deleted (or being deleted) on the engine by other means: its figures are a tombstone's
        # and its facts' periods run from that delete, so no delete to come is previewed.
        state = preview.get("state") if preview else binding.engine_state
        context.update(groups=preview_groups(preview["stores"] if preview else []), rules_only=preview is None,
                       backups=preview_backups(preview),
                       engine_deleting=state if state in ("deleted", "pending_delete") else "",
                       not_admitted=admission_of(preview) if state == "live" else None)
    if pending is None:
        context["seen"] = preview_digest(preview or {})
    if request.method != "POST":  # GET, HEAD
        return render(request, "remote/binding_delete.html", context)
    if not is_admin(request.user):
        raise PermissionDenied
    seen = request.POST.get("seen")
    if (seen is not None and pending is None and preview is not None and not context["engine_deleting"]
            and not folder_only(admission_reasons(preview)) and seen != context["seen"]
            and not BoundDeleteKey.objects.filter(key=request.POST.get("key") or "").exists()):
        # What the engine erases changed since the page was shown (as lifecycle's delete page,
        # r100). One the engine's folder alone keeps from being admitted now is sent all the
        # same and answered with that reason (r139: it read as "this conversation changed"). An engine that cannot say now (no preview) is not a change (r101): the delete is
        # recorded and sent when it answers, as from a page shown without figures.
        context["error"] = str(CHANGED_SINCE_SHOWN)
        return render(request, "remote/binding_delete.html", context, status=409)
    try:
        op = request_bound_delete(binding, key=request.POST.get("key"), actor=request.user)
    except ActionRefused as exc:
        if exc.status == 404:
            raise Http404 from None
        context["error"] = error_text(exc.code) if exc.code.startswith("engine_") else form_message(exc)
        return render(request, "remote/binding_delete.html", context, status=exc.status)
    if op.key != request.POST.get("key"):
        # A confirmation from a page shown before someone else's delete (its key is new; one the
        # delete knows was answered above): it joined that delete and sent nothing (as lifecycle's,
        # r121). Told by the delete's own key, so also when the other's came in while this one
        # was on its way (r134: read before, that race read as this press's delete).
        already_requested(request)
    return redirect("remote:bound-delete", delete_id=op.public_id)


def _answered_by_key(request: HttpRequest, binding_id: str) -> HttpResponse | None:
    """A confirmation its key already answers leads to that delete, before anything else is
    looked at: the form sent again (a reload after the answer was lost), also once the delete
    completed and let the binding go (r122: 404, as the binding is deliberately gone then). A
    confirmation of a binding let go, from a page shown before, leads to the delete that
    completed, saying so, as the embedded delete page does. None: the binding's own page decides."""
    key = request.POST.get("key") or ""
    op, new, done = None, False, None
    if EngineBinding.objects.filter(public_id=binding_id).exists():
        op = recorded_for_key(key)
        if op is None or op.binding_ref != binding_id:
            return None
    elif (done := released_delete(binding_id)) is None:
        raise Http404
    if not is_admin(request.user):  # (before a key is recorded for the delete let go)
        raise PermissionDenied
    if done is not None:
        try:
            op, new = request_released_delete(done, key=key)
        except ActionRefused:  # no key, a broken one, or one of another conversation's: no page to show
            raise Http404 from None
    if new:
        already_requested(request)
    return redirect("remote:bound-delete", delete_id=op.public_id)


def engine_checks(receipt: dict) -> dict:
    """What the engine's receipt says of physical erasure ("erased", "pending" or "") and of
    its last check of every store ({"logical": "clean" | "found", "at": time} or None), as far
    as it says it in a form this console knows."""
    physical = receipt.get("physical") if isinstance(receipt.get("physical"), dict) else {}
    state = physical.get("state") if physical.get("state") in ("erased", "pending") else ""
    verification = receipt.get("verification") if isinstance(receipt.get("verification"), dict) else {}
    logical = verification.get("logical") if verification.get("logical") in ("clean", "found") else ""
    # What still held the erased bytes on the engine when it sent the receipt: its backups made
    # before the delete above all (r35: the page named none of them, and said of this console's
    # copy "No earlier backup or archive holds them"). Its database files go once it says erased.
    held = receipt.get("holders") if isinstance(receipt.get("holders"), list) else []
    gone = {"database_files", "wal", "statistics"} if state == "erased" else set()
    holders = [holder_text(h) for h in held if isinstance(h, dict) and h.get("kind") not in gone]
    return {"engine_physical": state, "engine_holders": holders,
            "engine_verified": {"logical": logical, "at": moment(verification.get("at"))} if logical else None}


@login_required
@require_safe
def bound_delete_detail(request: HttpRequest, delete_id: str) -> HttpResponse:
    op = get_object_or_404(BoundDelete.objects.select_related("binding"), public_id=delete_id)
    data = bound_delete_json(op)
    version = "|".join(str(data[k]) for k in ("state", "waiting_on", "attempts", "next_attempt_at", "last_error",
                                              "engine_state", "engine_step", "acknowledged_at", "waiting_message"))
    receipt = op.receipt if isinstance(op.receipt, dict) else {}
    stores = [s for s in receipt.get("stores", []) if isinstance(s, dict)]
    context = {
        # An engine that cannot be reached is said once, by the waiting line (with the next retry).
        "op": op, "data": data, "waiting": data["waiting_message"] or "",
        "error_text": "" if op.last_error in ("engine_unreachable", "engine_stalled") else error_text(op.last_error),
        "code_text": error_text(op.code), "ambiguous": rows_with_times((op.way_out or {}).get("ambiguous", [])),
        "version": version, "poll": POLL_SECONDS if op.state == "pending" else 0,
        "receipt_stores": receipt_rows(stores),
        "receipt_kept": receipt_rows(receipt.get("kept")),
        "totals": changed_totals(stores),
        **engine_checks(receipt),
        # This console's own copy of the title: physically pending, then erased (remote.physical)
        "copy": (copy := data["console_copy"]),
        "copy_holders": [holder_text(h) for h in copy["holders"]] if copy else [],
        "copy_erased_at": moment(copy["physical"]["erased_at"]) if copy else None,
    }
    template = "remote/bound_delete.html"
    if request.htmx:
        if request.GET.get("v") == version:
            return HttpResponse(status=204)
        template += "#status"
    return render(request, template, context)
