"""Lifecycle screens: archive and close, the delete preview and confirmation, operations.

Thin views: parse, check access, ask the engine (lifecycle.engine, the same seam the API
uses), render or redirect. Every flow is a plain form POST that works without JavaScript;
htmx only refreshes the operation's status while it is pending.
"""

from __future__ import annotations

import functools
import secrets
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from console.auth import is_admin
from console.viewer import back_to
from lifecycle import fleet
from lifecycle.actions.request_deletion import CHANGED_CODE, form_message
from lifecycle.actions.resolve_subagent import unnamable_refusal
from lifecycle.deletion import reasons
from lifecycle.deletion.errors import error_message
from lifecycle.deletion.executor import changed_totals
from lifecycle.deletion.presentation import (
    holder_text,
    moment,
    preview_backups,
    preview_groups,
    receipt_rows,
    removed_backups,
    residue,
    unscanned_at,
)
from lifecycle.deletion.preview import preview_digest
from lifecycle.engine import OperationView, get_engine
from lifecycle.engine.http import EngineCredentialsRefused, EngineUnreachable, EngineUnsupported
from lifecycle.errors import ActionRefused
from lifecycle.models import (
    Conversation,
    DeleteOperation,
    DeleteState,
)

STATES = ("pending", "completed", "refused", "unavailable")
OPERATIONS_PAGE = 25
POLL_SECONDS = 2


def _admin_only(request: HttpRequest) -> None:
    if not is_admin(request.user):
        raise PermissionDenied


def _back(request: HttpRequest, default: str) -> str:
    """The page a form came from (`next`): a path on this site only. Anything else, such as a
    bare word (which `redirect` would take for a view name and fail on) or another site's
    address, gives `default`."""
    return back_to(request, default)


def _refused(request: HttpRequest, exc: ActionRefused) -> None:
    if exc.status == 404:
        raise Http404
    messages.error(request, exc.message)


# ---- Archive and close -------------------------------------------------------------------------


def _archive_message(archived: bool, *, closed: bool) -> str:
    """Where the conversation is listed now: a closed one is under Closed, not Recent, once
    unarchived (and was under Closed, not Recent, before it was archived)."""
    if archived:
        return _("Archived: listed under Archived instead of Closed.") if closed else _("Archived: hidden from Recent.")
    return _("Unarchived: back under Closed.") if closed else _("Back in Recent.")


def _switch(request: HttpRequest, name: str) -> bool:
    """The one value a form's switch sends: "1" on, "0" off. Anything else (missing, sent twice,
    another word) is a form sent incomplete or altered, refused: it once meant "off", and
    unarchived or resumed the conversation (r23)."""
    values = request.POST.getlist(name)
    if values not in (["1"], ["0"]):
        raise ActionRefused("invalid_form", _("The form arrived incomplete or altered, so nothing was changed. "
                                              "Reload the page and try again."), status=400)
    return values == ["1"]


@login_required
@require_POST
def conversation_archive(request: HttpRequest, public_id: str) -> HttpResponse:
    _admin_only(request)
    try:
        archived = _switch(request, "archived")
        answer = get_engine().set_archived(public_id, archived, actor=request.user)
        if answer.get("changed") is False:  # someone made it so first (a page left open, r100)
            messages.info(request, _("It was already archived: nothing changed.") if archived
                          else _("It was already not archived: nothing changed."))
        else:
            messages.success(request, _archive_message(archived, closed=bool(answer.get("closed"))))
    except ActionRefused as exc:
        _refused(request, exc)
    return redirect(_back(request, reverse("lifecycle:conversation-detail", args=[public_id])))


@login_required
@require_POST
def conversation_close(request: HttpRequest, public_id: str) -> HttpResponse:
    _admin_only(request)
    try:
        closed = _switch(request, "closed")
        answer = get_engine().set_closed(public_id, closed, actor=request.user)
        if answer.get("changed") is False:  # someone made it so first (a page left open, r100)
            messages.info(request, _("It was already closed: nothing changed.") if closed
                          else _("It was already open (not closed): nothing changed."))
        else:
            # Said whether or not turns were running: Close leaves none running and no process lease.
            messages.success(request, _("Closed: no turn runs in it and no process holds it until it is resumed.")
                             if closed else _("Resumed."))
    except ActionRefused as exc:
        _refused(request, exc)
    return redirect(_back(request, reverse("lifecycle:conversation-detail", args=[public_id])))


# ---- Delete: preview, confirm ------------------------------------------------------------------


def engine_answers(view):
    """The page of a view that asks the engine (ENGINE_URL) says the engine cannot be reached
    (503) when it cannot, or its answer could not be used, and Not found (404) when the engine
    does not know what was asked for, instead of a server error."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (EngineUnreachable, EngineCredentialsRefused) as exc:
            return render(request, "lifecycle/engine_unavailable.html", {"reason": exc.message}, status=503)
        except EngineUnsupported as exc:  # an older engine, or ENGINE_URL with a wrong path
            return render(request, "lifecycle/engine_unavailable.html", {"reason": exc.message}, status=502)
        except ActionRefused as exc:
            if exc.status == 404:  # the engine does not know it (a row this console kept, not the engine's)
                raise Http404 from None
            if not settings.ENGINE_URL:
                raise
            return render(request, "lifecycle/engine_unavailable.html", {"reason": exc.message}, status=502)

    return wrapped


def _intent(conversation: Conversation) -> DeleteOperation | None:
    return DeleteOperation.objects.intents().filter(conversation=conversation).first()


def _render_preview(request: HttpRequest, conversation: Conversation, *, status: int = 200,
                    error: str = "", preview: dict | None = None) -> HttpResponse:
    preview = preview or get_engine().preview_delete(conversation.public_id)
    admission = preview["admission"]
    typed = _typed_back(request, admission["ambiguous"] if admission else [])
    if admission:
        admission = {**admission, "ambiguous": rows_with_times(admission["ambiguous"], typed)}
    context = {
        "conversation": conversation,
        "preview": preview,
        "admission": admission,
        "groups": preview_groups(preview["stores"]),
        "backups": preview_backups(preview),
        "key": secrets.token_hex(16),
        "seen": preview_digest(preview),
        "intent": _intent(conversation),
        "error": error,
        "resolve_next": request.get_full_path(),
    }
    return render(request, "lifecycle/conversation_delete.html", context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
@engine_answers
def conversation_delete(request: HttpRequest, public_id: str) -> HttpResponse:
    conversation = get_object_or_404(Conversation.objects.select_related("account", "computer"), public_id=public_id)
    if request.method != "POST":  # GET, HEAD
        return _render_preview(request, conversation)
    _admin_only(request)
    try:
        # The page confirmed is what is erased: a live conversation that changed since it was
        # shown (items added, a backup made) is shown again as it is now, and nothing is done
        # (r100: the delete went ahead; only the receipt told). The engine compares under the
        # locks the delete takes (r134: compared before them, an item added in between was
        # erased unshown). Once a delete exists (this form sent twice, or someone else's) the
        # key leads to it, as before; a key already recorded leads to its operation whatever
        # the preview says now (r101: a refused delete's own record changed the preview).
        op = get_engine().request_delete(public_id, key=request.POST.get("key"), actor=request.user,
                                         seen=request.POST.get("seen"))
    except ActionRefused as exc:
        if exc.status == 404:
            raise Http404 from None
        if exc.code == CHANGED_CODE:
            return _render_preview(request, conversation, status=409, error=str(exc.message))
        return _render_preview(request, conversation, status=exc.status, error=form_message(exc))
    if op.joined:  # someone's delete of it came first (r121: the page said nothing; r134: by a race)
        already_requested(request)
    return redirect("lifecycle:operation-detail", operation_id=op.id)


def already_requested(request: HttpRequest) -> None:
    """Say that the delete a confirmation leads to was requested before it (a page shown before
    someone else's delete): it did nothing more. Also the Engine conversations' delete form's."""
    messages.info(request, _("This conversation's delete had already been requested: your confirmation did "
                             "nothing more. Its status is below."))


# ---- Operations --------------------------------------------------------------------------------


# Session key: what was typed in a row's "another conversation" field when the attribution was
# refused, and the page it was typed on: shown again there in that field, the reason under it.
_TYPED_KEY = "lethe_resolve_typed"


def _typed_back(request: HttpRequest | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What was typed on this page and refused (once), for the row it was typed in; {} when
    nothing was. When that row is no longer on the page, the reason becomes a page message."""
    typed = request.session.get(_TYPED_KEY) if request is not None else None
    if not isinstance(typed, dict) or typed.get("path") != request.path:
        return {}
    request.session.pop(_TYPED_KEY, None)
    if not any(row.get("agent_id") == typed.get("agent") for row in rows):
        messages.error(request, str(typed.get("error", "")))
        return {}
    return typed


def rows_with_times(rows: list[dict[str, Any]], typed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Fleet rows as written by the engine: their times parsed where they are times; the row
    whose "another conversation" form was just refused gets back what was typed there and why
    (see _typed_back and subagent_resolve)."""
    typed = typed or {}
    return [{**row, "started": moment(row.get("started_at") if isinstance(row.get("started_at"), str) else None),
             "finished": moment(row.get("finished_at") if isinstance(row.get("finished_at"), str) else None),
             **({"typed": typed.get("value", ""), "typed_error": typed.get("error", "")}
                if typed and typed.get("agent") == row.get("agent_id") else {})}
            for row in rows]


def _cluster_stopped(op: OperationView) -> dict[str, Any] | None:
    """For a pending delete of this console's own engine: whether the job clusters seem stopped
    (ops.health.cluster_stopped); nothing moves the delete on until one runs. (A remote
    engine's delete runs on the engine's cluster, which this console cannot see.)"""
    if not op.is_pending or settings.ENGINE_URL:
        return None
    from ops.health import cluster_stopped

    return cluster_stopped()


def _part(receipt: dict[str, Any], name: str, kind: type) -> Any:
    """A part of a receipt if it has the shape the page reads (a remote engine's is not trusted), else empty."""
    value = receipt.get(name)
    return value if isinstance(value, kind) else kind()


def _operation_context(op: OperationView, request: HttpRequest | None = None) -> dict[str, Any]:
    # (a remote engine's way out, or an older one's, may name a row no form can send back)
    ambiguous = [row for row in _part(op.way_out or {}, "ambiguous", list)
                 if isinstance(row, dict) and fleet.namable_id(row.get("agent_id"))]
    conversation = Conversation.objects.select_related("account", "computer").filter(public_id=op.target).first()
    steps = receipt_rows([{**s, "class": ""} for s in op.steps if s["store"] != "fingerprints"])
    done = sum(1 for s in op.steps if s["state"] == "done")
    current = next((s for s in receipt_rows([{"store": op.step}]) if op.step), None) if op.step else None
    receipt = op.receipt or {}
    # (a remote engine's receipt: each part read only in the shape a page reads it in)
    physical, verification = _part(receipt, "physical", dict), _part(receipt, "verification", dict)
    return {
        "op": op,
        "conversation": conversation,
        "steps": steps,
        "done": done,
        "total": len(op.steps),
        "current": current,
        "preparing": op.step == "fingerprints",
        "reasons": [{"code": c, "message": reasons.message(c)} for c in op.reasons],
        "error_text": error_message(op.error),
        "receipt_stores": receipt_rows(_part(receipt, "stores", list)),
        "totals": changed_totals(_part(receipt, "stores", list)),
        "receipt_kept": receipt_rows(_part(receipt, "kept", list)),
        "holders": [holder_text(h) for h in _part(receipt, "holders", list)],
        "removed_backups": removed_backups(_part(receipt, "removed_backups", list)),
        "ambiguous": rows_with_times(ambiguous, _typed_back(request, ambiguous)),
        "physical_at": moment(physical.get("erased_at")),
        "verified_at": moment(receipt.get("verified_at")),
        "residue": residue(verification),
        "unscanned": unscanned_at(verification),
        "verified_physical_at": moment(receipt.get("verified_physical_at")),
        "poll": POLL_SECONDS if op.is_pending else None,
        # A stalled delete does not go on when the cluster runs again (r52: the page said it would)
        "cluster_stopped": (stopped := None if op.stalled else _cluster_stopped(op)),
        "version": (f"{op.state}:{done}:{op.step or ''}:{op.error or ''}:{'stopped' if stopped else ''}:"
                    f"{'stalled' if op.stalled else ''}"),
        "stalled": op.stalled,
        "stalled_text": error_message("stalled"),
        # A request that was not admitted: the delete asked for since, if any (its own page)
        "later_intent": (_intent(conversation) if conversation and op.state in ("refused", "unavailable")
                         and conversation.state != "live" else None),
    }


@login_required
@require_safe
@engine_answers
def operation_detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    try:
        op = get_engine().operation(operation_id)
    except (EngineUnreachable, EngineCredentialsRefused, EngineUnsupported):
        raise  # the engine cannot say (engine_answers)
    except ActionRefused as exc:
        if exc.status in (400, 404) or not settings.ENGINE_URL:  # no such operation (an id it cannot be)
            raise Http404 from None
        raise
    context = _operation_context(op, None if request.htmx else request)  # a poll leaves what was typed
    template = "lifecycle/operation_detail.html"
    if request.htmx:
        if request.GET.get("v") == context["version"]:
            return HttpResponse(status=204)  # nothing changed: no swap, nothing re-announced
        template += "#status"
    return render(request, template, context)


@login_required
@require_POST
def operation_retry(request: HttpRequest, operation_id: str) -> HttpResponse:
    _admin_only(request)
    try:
        op = get_engine().operation(operation_id)
        if op.is_pending:
            get_engine().retry_operation(operation_id, actor=request.user)
            # said, and given the focus, as Archive and Close are (r147: the page came back silent)
            messages.success(request, _("Retry started: the erasure goes on from the step it stopped at."))
        else:  # a page older than the delete's end: nothing to retry, and said so (as the API's 409)
            messages.info(request, _("Nothing was retried: this delete is no longer pending (%(state)s).")
                          % {"state": dict(DeleteState.choices).get(op.state, op.state)})
    except ActionRefused as exc:
        _refused(request, exc)
    return redirect("lifecycle:operation-detail", operation_id=operation_id)


@login_required
@require_safe
def operation_list(request: HttpRequest) -> HttpResponse:
    """The engine's delete operations, and this console's own tool payload operations. When
    the engine cannot be reached the page says so where its operations would be (503) and
    still lists the console's own."""
    if request.htmx and request.GET.get("live"):
        return _operations_live(request)
    state = request.GET.get("state", "")
    if state not in STATES:
        state = ""
    position = request.GET.get("cursor") or None
    engine = get_engine()
    context = {
        "state": state,
        "states": [("", _("All"))] + [(key, DeleteState(key).label) for key in STATES],
    }
    try:
        try:
            page = engine.operations(state=state or None, limit=OPERATIONS_PAGE, position=position)
        except ActionRefused as exc:
            if exc.code != "invalid_cursor":
                raise
            position = None  # a mangled or outdated link: the first page
            page = engine.operations(state=state or None, limit=OPERATIONS_PAGE)
    except ActionRefused as exc:  # unreachable, a bad answer, an engine without the list, a refusal
        if not settings.ENGINE_URL:
            raise
        context["engine_error"] = exc.message
        return render(request, "lifecycle/operation_list.html", context, status=503)
    context.update(
        operations=(listed := _listed(page.rows)),
        page=page,
        paged=position is not None,  # not the first page: an empty one links back to it
        **_operations_poller([row["op"] for row in listed if row["op"].is_pending], _open_runs()),
    )
    return render(request, "lifecycle/operation_list.html", context)


# ---- The Operations list, while something on it is in progress ---------------------------------

LIVE_POLL_SECONDS = 3


def _open_runs() -> list[Any]:
    """The tool payload operations the list shows (its last 50) that are queued or running."""
    from retention.models import OPEN_STATES, ToolPayloadOperation

    return [run for run in ToolPayloadOperation.objects.only("pk", "state", "progress_done", "removed_messages")[:50]
            if run.state in OPEN_STATES]


def _live_version(ops: list[OperationView], runs: list[Any]) -> str:
    """What the rows polled show: a delete's state, steps done and error; a run's state and progress."""
    return ";".join([f"{op.id}:{op.state}:{sum(1 for s in op.steps if s['state'] == 'done')}:{op.error or ''}"
                     for op in ops] + [f"{run.pk}:{run.state}:{run.progress_done}:{run.removed_messages}"
                                       for run in runs])


def _operations_poller(ops: list[OperationView], runs: list[Any]) -> dict[str, Any]:
    """The list's poller: it reads the pending deletes and the open cleanup operations shown
    again (their ids and what the page shows of them in its address); none when there are none."""
    if not ops and not runs:
        return {"live_url": ""}
    query = urlencode([("live", "1"), ("v", _live_version(ops, runs))] + [("op", op.id) for op in ops]
                      + [("run", run.pk) for run in runs])
    return {"live_url": f"{reverse('lifecycle:operation-list')}?{query}", "live_poll": LIVE_POLL_SECONDS}


def _operations_live(request: HttpRequest) -> HttpResponse:
    """The list's poll: 204 when what it shows of the polled rows did not change; else those rows
    again (replaced in place, out of band), the cleanup history when a run moved, a poller for
    what is still in progress, and what finished in a few words. An engine that cannot answer
    is a 503: the page keeps what it shows and says the status is unavailable."""
    from retention.models import OPEN_STATES, ToolPayloadOperation
    from retention.views import ANALYSIS_STATE_LABELS, KIND_LABELS, STATE_LABELS

    try:
        ops = get_engine().operations_named(request.GET.getlist("op")[:OPERATIONS_PAGE])
    except ActionRefused:
        return HttpResponse(status=503)  # the engine cannot answer now
    # Whole ASCII numbers of at most 18 digits (a bigint): "²" passes isdigit() but not int()
    asked = [int(pk) for pk in request.GET.getlist("run")[:50] if pk.isascii() and pk.isdigit() and len(pk) <= 18]
    runs = list(ToolPayloadOperation.objects.filter(pk__in=asked).order_by("pk"))
    runs.sort(key=lambda run: asked.index(run.pk))
    if _live_version(ops, runs) == request.GET.get("v"):
        return HttpResponse(status=204)  # nothing changed: no swap, nothing said
    rows = _listed(ops)
    said = [f"{row['conversation'].shown_title or row['conversation'].thread_id if row['conversation'] else row['op'].target}: "
            f"{dict(DeleteState.choices).get(row['op'].state, row['op'].state)}." for row in rows if not row["op"].is_pending]
    said += [f"{KIND_LABELS.get(run.kind, run.kind)}: "
             f"{(ANALYSIS_STATE_LABELS if run.kind == 'analysis' else STATE_LABELS).get(run.state, run.state)}."
             for run in runs if run.state not in OPEN_STATES]
    context = {"operations": rows, "cleanup": bool(runs), "live_said": " ".join(said),
               **_operations_poller([op for op in ops if op.is_pending], [run for run in runs if run.state in OPEN_STATES])}
    return render(request, "lifecycle/_operations_live.html", context)


def _pending_error(op: OperationView) -> str:
    """What stopped a pending delete's last run, and that it is no longer retried by itself."""
    said = [error_message(op.error)]
    if op.stalled and op.error != "stalled":
        said.append(error_message("stalled"))
    return " ".join(text for text in said if text)


def _listed(ops: list[OperationView]) -> list[dict[str, Any]]:
    """The page's rows, with their conversations read in one query."""
    conversations = {c.public_id: c for c in Conversation.objects.filter(public_id__in={op.target for op in ops})
                     .select_related("account", "computer")
                     .only("public_id", "thread_id", "title", "state", "scope", "account__name", "computer__name")}
    return [{
        "op": op,
        "conversation": conversations.get(op.target),
        "totals": changed_totals((op.receipt or {}).get("stores", [])),
        "done": sum(1 for s in op.steps if s["state"] == "done"),
        "total": len(op.steps),
        "error_text": _pending_error(op) if op.is_pending else "",
        "reason": reasons.message(op.code) if op.code else "",
    } for op in ops]


# ---- The ambiguity way out ---------------------------------------------------------------------



def _posted_id(value: str) -> str:
    """The row's id as the page's forms send it: percent-encoded (a browser sends a line break in
    a form's value as CR LF, whatever it was: r123), so every id that can be named comes back as
    the file holds it; "" (no row's) when what came is not UTF-8."""
    try:
        return unquote(value, errors="strict")
    except UnicodeDecodeError:
        return ""


@login_required
@require_POST
def subagent_resolve(request: HttpRequest) -> HttpResponse:
    _admin_only(request)
    agent_id = _posted_id(request.POST.get("agent_id", ""))
    action = request.POST.get("action", "")
    conversation_id = request.POST.get("conversation") or None
    try:
        if not fleet.namable_id(agent_id):  # answered here, as the built-in engine does: a remote
            # engine's answer to an id no address can hold would be about the address
            raise unnamable_refusal()
        get_engine().resolve_subagent(agent_id, action=action, conversation_id=conversation_id, actor=request.user)
        messages.success(request, _("The subagent row was attributed.") if action == "attribute"
                         else _("The subagent row was cleared."))
    except ActionRefused as exc:
        back = _back(request, "")
        if request.POST.get("typed") == "1" and action == "attribute" and back:
            # shown under the field it was typed in, on the page it came from (_typed_back)
            request.session[_TYPED_KEY] = {"agent": agent_id, "value": (conversation_id or "")[:32],
                                           "error": str(exc.message), "path": urlsplit(back).path}
        elif exc.status == 404:
            messages.error(request, exc.message)
        else:
            _refused(request, exc)
    return redirect(_back(request, reverse("lifecycle:operation-list")))
