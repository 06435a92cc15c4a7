"""Settings > System > Data & storage.

Each editable card is an independent contributor to the shared Save/Discard bar: it has
its own form, its own POST endpoint and its own revision, so one card's invalid input or
stale revision never blocks another card's save.

The tool payload cleanup card reads everything it shows from `retention.service`'s status
document and changes things only through the service. Its live parts (analysis, backup
preparation and run, Compact database, backups, history) are page regions that one poller
refreshes out of band: every second or two while something runs, slowly while cleanup is
on and idle, not at all otherwise. A failed status read leaves the regions as they were and
says so in its own status note; action errors have their own region, which polls never touch.
"""

from __future__ import annotations

import logging
import threading
import time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext, pgettext_lazy
from django.views.decorators.http import require_POST, require_safe

from console.auth import is_admin
from lifecycle.actions.save_facts_policy import save_facts_policy
from lifecycle.errors import ActionRefused
from lifecycle.models import RetainedFactsPolicy
from ops.health import cluster_stopped
from retention import jobs, service
from retention.forms import AgeForm, CancelForm, RetainedFactsForm, RunForm, ToolPayloadPolicyForm
from retention.models import StorageSnapshot, ToolPayloadPolicy
from retention.storage import database_size

logger = logging.getLogger("lethe.retention")

PAGE = "retention/data_storage.html"
LIVE = "retention/cleanup_live.html"

RUNNING = ("queued", "running")
POLL_BUSY = 1  # seconds between status reads while an operation runs or a backup is prepared
POLL_IDLE = 30  # while cleanup is on and idle: the daily check may start a run
# The poller's database figures are measured at most this often per process (on PostgreSQL the
# reusable space is read from every table, 0.1 s and more on a large database, once a second
# per open page while a run goes on), and again at once when an operation has finished since.
POLL_MEASURE_SECONDS = 15


STATE_LABELS = {
    "queued": pgettext_lazy("operation state", "Queued"),
    "running": pgettext_lazy("operation state", "Running"),
    "succeeded": pgettext_lazy("operation state", "Completed"),
    "partial": pgettext_lazy("operation state", "Partial"),
    "failed": pgettext_lazy("operation state", "Failed"),
    "cancelled": pgettext_lazy("operation state", "Cancelled"),
}
# An analysis's states apart: in Spanish "análisis" is masculine, the other kinds feminine.
ANALYSIS_STATE_LABELS = {
    "queued": pgettext_lazy("analysis state", "Queued"),
    "running": pgettext_lazy("analysis state", "Running"),
    "succeeded": pgettext_lazy("analysis state", "Completed"),
    "partial": pgettext_lazy("analysis state", "Partial"),
    "failed": pgettext_lazy("analysis state", "Failed"),
    "cancelled": pgettext_lazy("analysis state", "Cancelled"),
}
KIND_LABELS = {
    "analysis": gettext_lazy("Analysis"),
    "backup": gettext_lazy("Backup"),
    "cleanup": gettext_lazy("Cleanup"),
    "compact": pgettext_lazy("operation kind", "Compact database"),
}
SKIP_LABELS = {
    # no longer eligible when the run came to it: activity, new work, or a delete under way
    "recent_activity": gettext_lazy("no longer eligible during the run (active again, or being deleted)"),
    "changed": gettext_lazy("changed during the run"),
    "oversize": gettext_lazy("too large to read safely"),
    "malformed": gettext_lazy("unreadable details"),
    "already_removed": gettext_lazy("details already removed"),
    "unsupported": gettext_lazy("unsupported tool"),
    "no_payload": gettext_lazy("no details"),
    "protected": gettext_lazy("protected (plans, to-dos, tasks, background work, monitors, structured tool output)"),
    "too_small": gettext_lazy("too small to save space"),
    "reserved_field": gettext_lazy("own field named “retention” (kept whole)"),
}


def _unit_label(unit: str | None, value: int | None) -> str:
    """The period's unit in words, singular or plural as its value needs."""
    count = value if isinstance(value, int) else 2
    if unit == "weeks":
        return ngettext("week", "weeks", count)
    if unit == "months":
        return ngettext("month", "months", count)
    return unit or ""


def _error_text(error) -> str:
    """An error of the document: {code, message} or a plain message."""
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or "")
    return str(error or "")


def _op(op: dict | None) -> dict | None:
    """An operation of the status document with the labels the templates show."""
    if not op:
        return op
    who = op.get("started_by")
    scheduled = op.get("started_by_kind") == "schedule"
    age = op.get("age") or {}
    return {
        **op,
        "error_text": _error_text(op.get("error")),
        "state_label": (ANALYSIS_STATE_LABELS if op.get("kind") == "analysis" else STATE_LABELS).get(
            op.get("state"), op.get("state")),
        "kind_label": KIND_LABELS.get(op.get("kind"), op.get("kind")),
        "started_by_label": _("the daily schedule") if scheduled else (who or _("unknown")),
        "skipped_list": [(SKIP_LABELS.get(reason, reason), n) for reason, n in (op.get("skipped") or {}).items() if n],
        "age_unit_label": _unit_label(age.get("unit"), age.get("value")),
    }


def _saved_form(form_class, policy):
    """An unbound form showing the saved values (the fields the policy has), but never a
    backup choice: the admin makes it each time it is asked for (AC-TPR-002.1)."""
    return form_class(initial={name: getattr(policy, name) for name in form_class.base_fields
                               if hasattr(policy, name) and name != "backup_choice"})


def _read_status() -> dict | None:
    """The service's status document, or None when it cannot be read (shown, never hidden)."""
    try:
        return service.status_document(with_database=False)
    except Exception:
        logger.exception("tool payload cleanup status could not be read")
        return None


def _restore_paragraphs(engine: str) -> list:
    """How to restore, as paragraphs of words and commands (the page shows commands as code)."""
    try:
        from retention import backups

        return backups.restore_paragraphs(engine)
    except Exception:
        logger.exception("backup restore instructions could not be read")
        return []


def _age_key(age: dict | None) -> str:
    return f"{age['value']}-{age['unit']}" if age else ""


# Why Run cleanup now waits, by the operation under way (one runs at a time).
QUEUED_BLOCKS = {
    "analysis": gettext_lazy("An analysis is waiting to start; one operation runs at a time."),
    "backup": gettext_lazy("The backup for cleanup is waiting to start; cleanup can run once it is verified."),
    "cleanup": gettext_lazy("A cleanup is waiting to start."),
    "compact": gettext_lazy("Compact database is waiting to start; one operation runs at a time."),
}
RUNNING_BLOCKS = {
    "analysis": gettext_lazy("An analysis is running; one operation runs at a time."),
    "backup": gettext_lazy("The backup for cleanup is being made; cleanup can run once it is verified."),
    "cleanup": gettext_lazy("A cleanup is running."),
    "compact": gettext_lazy("Compact database is running; one operation runs at a time."),
}


def _card(doc: dict | None, engine: str) -> dict:
    """What the card's templates need, derived from the status document in one place."""
    if doc is None:
        return {"status_ok": False, "poll": 0}
    operation = _op(doc.get("operation"))
    running = operation if operation and operation.get("state") in RUNNING else None
    policy = doc["policy"]
    preparation = doc.get("preparation") or {}
    prep_state = _preparation_state(preparation.get("state"))
    analysis = _op(doc.get("last_analysis"))
    if running and running["kind"] == "analysis":
        analysis_state = "running"
    elif not analysis:
        analysis_state = "none"
    elif analysis["state"] == "succeeded" and not analysis.get("eligible_messages"):
        analysis_state = "empty"
    else:
        analysis_state = {"succeeded": "completed"}.get(analysis["state"], analysis["state"])
    last_run = _op(doc.get("last_run"))
    busy = running is not None or prep_state == "preparing"
    state_error = _error_text(doc.get("error"))
    blocked = None
    if state_error:
        blocked = state_error
    elif not doc.get("supported", True):
        blocked = _("Cleanup is not available on this database.")
    elif not policy["enabled"]:
        blocked = _("Turn on automatic cleanup and save to run it.")
    elif running:
        # What holds the button, by name: the operation may be the admin's own (the backup a
        # run asked for, the run itself), never "another" one (r15)
        blocked = (QUEUED_BLOCKS if running.get("state") == "queued" else RUNNING_BLOCKS).get(
            running.get("kind"), _("An operation is under way; one runs at a time."))
        blocked = str(blocked)
    elif prep_state in ("failed", "cancelled"):
        blocked = _("The backup is not ready: retry it or cancel it first.")
    return {
        "status_ok": True,
        "state_error": state_error,
        "prep_error": _error_text(preparation.get("error")),
        "policy": policy,
        "supported": doc.get("supported", True),
        "running": running,
        "analysis": analysis,
        "analysis_state": analysis_state,
        "analysis_age_key": _age_key(analysis.get("age") if analysis else None),
        # What the period field shows when no draft is given: the saved policy's (the page's
        # note on an estimate for other settings compares with it; the script, with the field)
        "saved_age_key": _age_key(policy.get("age")),
        "skipped_total": sum((analysis or {}).get("skipped", {}).values()) if analysis else 0,
        "preparation": preparation,
        "prep_state": prep_state,
        "prep_operation_id": _preparation_operation(doc),
        "last_run": last_run,
        # What the last run left of its work, while the policy it ran under is still the saved
        # one (one turned off or changed since leaves none of that work: r26)
        "run_remaining": _remaining(last_run) if last_run and last_run.get("policy_revision") == policy.get(
            "revision") else None,
        "next_check_at": doc.get("next_check_at"),
        # Past its time by more than a minute: the job cluster has not run it (stopped, or busy)
        "next_check_due": jobs.check_is_due(doc.get("next_check_at")),
        "can_run": blocked is None,
        "run_blocked": blocked,
        "last_compact": _op(doc.get("last_compact")),
        "backups": doc.get("backups") or [],
        "older_backups": doc.get("older_backups") or 0,
        "backup_folder": _backup_folder() if doc.get("older_backups") else "",
        "history": [_op(entry) for entry in (doc.get("history") or [])[:50]],
        # A backup was made and is no longer in the folder (removed by an operator)
        "backups_removed": any((entry.get("backup") or {}).get("present") is False
                               for entry in doc.get("history") or []),
        "restore": _restore_paragraphs(engine) if doc.get("backups") else [],
        "poll": POLL_BUSY if busy else (POLL_IDLE if policy["enabled"] else 0),
        # What waits for the job cluster (queued work, a backup, the daily check) while none runs
        "cluster_stopped": cluster_stopped() if busy or policy["enabled"] else None,
    }


def _preparation_state(state: str | None) -> str:
    """The backup preparation's state as the card shows it."""
    if state in ("preparing", "running", "queued"):
        return "preparing"
    if state in ("failed", "interrupted"):
        return "failed"
    if state == "cancelled":
        return "cancelled"
    if state in ("ready", "succeeded", "verified"):
        return "ready"
    return "none"


def _preparation_operation(doc: dict) -> int | None:
    """The id of the newest backup operation: what Cancel preparation cancels."""
    operation = doc.get("operation")
    if operation and operation.get("kind") == "backup":
        return operation["id"]
    for entry in doc.get("history") or []:
        if entry.get("kind") == "backup":
            return entry["id"]
    return (doc.get("preparation") or {}).get("operation_id")


def _remaining(run: dict | None) -> int | None:
    if not run:
        return None
    progress = run.get("progress") or {}
    if progress.get("total") and progress.get("done") is not None:
        return max(progress["total"] - progress["done"], 0)
    if run.get("eligible_messages") is not None and run.get("removed_messages") is not None:
        return max(run["eligible_messages"] - run["removed_messages"] - sum((run.get("skipped") or {}).values()), 0)
    return None


def _backup_folder() -> str:
    from retention.backups import configured_backup_dir

    return str(configured_backup_dir())


# Without the script, Analyze savings posts the whole cleanup form and the page is loaded
# afresh: the settings it was pressed with come back once, in the session, so the form shows
# them as an unsaved draft (saving stays the Save button's).
DRAFT_KEY = "lethe.tool_draft"


def _posted_draft(request: HttpRequest, data: dict) -> dict | None:
    """The cleanup form's settings a plain post of Analyze savings carried (None from the
    script, or from a post that is not the whole form)."""
    if request.htmx or "revision" not in request.POST:
        return None
    return {"age_value": data["age_value"], "age_unit": data["age_unit"],
            "enabled": request.POST.get("enabled") == "on"}


def _unsaved(draft: dict | None, policy: ToolPayloadPolicy) -> dict | None:
    """The draft if it differs from the saved policy."""
    saved = {"age_value": policy.age_value, "age_unit": policy.age_unit, "enabled": policy.enabled}
    return draft if draft and draft != saved else None


def _draft(request: HttpRequest, policy: ToolPayloadPolicy) -> dict | None:
    """The draft kept by an analysis without the script, once, if it is one the form can show
    and differs from the saved policy."""
    draft = request.session.pop(DRAFT_KEY, None)
    if not isinstance(draft, dict):
        return None
    form = AgeForm({"age_value": str(draft.get("age_value")), "age_unit": draft.get("age_unit")})
    if not form.is_valid():
        return None
    return _unsaved({**form.cleaned_data, "enabled": draft.get("enabled") is True}, policy)


def _context(request: HttpRequest, *, draft: dict | None = None, **overrides) -> dict:
    tool_policy = ToolPayloadPolicy.load()
    db = database_size()
    tool_form = _saved_form(ToolPayloadPolicyForm, tool_policy)
    if draft:
        tool_form.initial.update(draft)
    context = {
        "db": db,
        "snapshot": StorageSnapshot.load(),
        "tool_policy": tool_policy,
        "tool_form": tool_form,
        "draft": draft,
        "saved_unit_label": _unit_label(tool_policy.age_unit, tool_policy.age_value),
        # The period the field shows, when it is not the saved one
        "field_age_key": _age_key({"value": draft["age_value"], "unit": draft["age_unit"]}) if draft else "",
        "facts_form": _saved_form(RetainedFactsForm, RetainedFactsPolicy.load()),
        "can_edit": is_admin(request.user),
    }
    context.update(overrides)
    if "card" not in context:
        context["card"] = _card(_read_status(), db.engine)
    return context


@login_required
@require_safe
def data_storage(request: HttpRequest) -> HttpResponse:
    return render(request, PAGE, _context(request, draft=_draft(request, ToolPayloadPolicy.load())))


class _PolledSize:
    """The last database figures a poll measured, by the database and the newest finished
    operation (a compaction that ends is measured at the next poll)."""

    lock = threading.Lock()
    key: tuple | None = None
    at = 0.0
    size = None

    @classmethod
    def read(cls, doc: dict):
        from django.db import connection

        newest = next((op for op in doc.get("history") or () if op["state"] not in RUNNING), None)
        key = (connection.alias, str(connection.settings_dict["NAME"]),
               (newest["id"], newest["state"]) if newest else None)
        with cls.lock:
            if cls.key == key and time.monotonic() - cls.at < POLL_MEASURE_SECONDS:
                return cls.size
        size = database_size()
        with cls.lock:
            cls.key, cls.at, cls.size = key, time.monotonic(), size
        return size


@login_required
@require_safe
def cleanup_status(request: HttpRequest) -> HttpResponse:
    """The poller's read: every live region out of band, or only the "unavailable" note. The
    database figures in it are at most POLL_MEASURE_SECONDS old (the page and the answers to
    actions measure them afresh). Asked for as a page (where the login page returns to after
    a poll whose session ended, or an address typed), the page it belongs to."""
    if not request.htmx:
        return redirect("retention:data-storage")
    doc = _read_status()
    if doc is None:
        response = render(request, LIVE, {"status_failed": True})
    else:
        db = _PolledSize.read(doc)
        context = {"card": _card(doc, db.engine), "db": db, "can_edit": is_admin(request.user)}
        response = render(request, LIVE, context)
    response["HX-Reswap"] = "none"
    return response


def _card_response(request: HttpRequest, region: str, status: int, **overrides) -> HttpResponse:
    context = _context(request, **overrides)
    return render(request, f"{PAGE}#{region}" if request.htmx else PAGE, context, status=status)


def _save_card(request: HttpRequest, region: str, form_name: str, form, save, saved_text: str) -> HttpResponse:
    """One contributor's save: 403 for members, 422 invalid, 409 refused, else saved."""
    if not is_admin(request.user):
        response = _card_response(request, region, 403, notice=_("Only admins can change these settings."))
        # Said apart from a 403 of the CSRF check (a session that ended): signing in again
        # would not help here (lethe.js, the save bar).
        response["X-Lethe-Refused"] = "not-admin"
        return response
    if not form.is_valid():
        return _card_response(request, region, 422, **{form_name: form})
    try:
        save(form.cleaned_data)
    except ActionRefused as exc:
        form.add_error(None, exc.message)
        return _card_response(request, region, 409, **{form_name: form})
    except service.CleanupError as exc:
        form.add_error("backup_choice" if exc.code == "backup_choice_required" else None, exc.message)
        return _card_response(request, region, exc.status, **{form_name: form})
    if request.htmx:
        return _card_response(request, region, 200, **{f"{form_name}_saved": True})
    # Without the script the page is loaded afresh: the confirmation travels with it.
    messages.success(request, saved_text)
    return redirect("retention:data-storage")


@login_required
@require_POST
def tool_policy_save(request: HttpRequest) -> HttpResponse:
    def save(data):
        return service.save_policy(
            user=request.user, enabled=data["enabled"], age_value=data["age_value"], age_unit=data["age_unit"],
            revision=data["revision"], backup_choice=data["backup_choice"] or None,
        )

    return _save_card(
        request, "tool-card", "tool_form", ToolPayloadPolicyForm(request.POST), save, _("Cleanup policy saved.")
    )


@login_required
@require_POST
def facts_policy_save(request: HttpRequest) -> HttpResponse:
    return _save_card(
        request, "facts-card", "facts_form", RetainedFactsForm(request.POST),
        lambda data: save_facts_policy(values=data, revision=data["revision"], acting_user=request.user),
        _("Retention periods saved."),
    )


# ---- Cleanup actions: each calls one service function -----------------------------


def _action(request: HttpRequest, form_class, call, *, error_key: str = "action_error",
            policy_saved: dict | None = None, done_text: str = "", keeps_draft: bool = False) -> HttpResponse:
    """Members 403, bad input 400, a refusal with the service's own status and message (in
    error_key's region, beside the button pressed); success answers htmx with the fresh live
    regions and plain forms with a redirect. An action that saved the policy sends the card
    too (its form shows the saved policy), with policy_saved in its context. An action that
    keeps_draft (Analyze savings) shows the settings it was sent with in the page's form,
    after a plain post: kept in the session for the page it redirects to, or at once with
    its refusal."""
    if not is_admin(request.user):
        return _action_error(request, _("Only admins can analyze, run or compact."), 403, error_key)
    form = form_class(request.POST) if form_class else None
    if form is not None and not form.is_valid():
        errors = [str(m) for field_errors in form.errors.values() for m in field_errors]
        return _action_error(request, " ".join(errors), 400, error_key)
    draft = _posted_draft(request, form.cleaned_data) if keeps_draft and form is not None else None
    try:
        call(form.cleaned_data if form is not None else {})
    except service.CleanupError as exc:
        return _action_error(request, exc.message, exc.status, error_key,
                             draft=_unsaved(draft, ToolPayloadPolicy.load()),
                             refresh=exc.code in ("busy", "preparation_changed"))
    if draft is not None:
        request.session[DRAFT_KEY] = draft
    if not request.htmx:
        if done_text:
            messages.success(request, done_text)
        return redirect("retention:data-storage")
    response = _live_regions(request, status=202, action_ok=True)
    if policy_saved is not None:  # the card's form shows the saved policy (and its revision)
        card = render(request, f"{PAGE}#tool-card", _context(request, oob=True, **policy_saved))
        response.content += card.content
    response["HX-Reswap"] = "none"
    return response


def _live_regions(request: HttpRequest, *, status: int, **extra) -> HttpResponse:
    """The live regions as the status is now (an admin's page: its actions offered)."""
    doc = _read_status()
    context = {"status_failed": doc is None, "can_edit": True, **extra}
    if doc is not None:
        context["db"] = database_size()
        context["card"] = _card(doc, context["db"].engine)
    return render(request, LIVE, context, status=status)


def _action_error(request: HttpRequest, message: str, status: int, key: str = "action_error",
                  draft: dict | None = None, refresh: bool = False) -> HttpResponse:
    """The refusal beside the button pressed. `refresh`: refused because an operation this page
    did not show is under way (another admin's, a script's): the page's status too, polled
    from then on (r100: a page opened while nothing ran never polled, so it never showed it)."""
    if request.htmx:
        response = render(request, LIVE, {key: message, "only_error": True}, status=status)
        if refresh:
            response.content += _live_regions(request, status=status).content
        response["HX-Reswap"] = "none"
        return response
    return render(request, PAGE, _context(request, draft=draft, **{key: message}), status=status)


@login_required
@require_POST
def cleanup_analyze(request: HttpRequest) -> HttpResponse:
    return _action(request, AgeForm, lambda data: service.start_analysis(
        user=request.user, age_value=data["age_value"], age_unit=data["age_unit"]), keeps_draft=True,
        done_text=_("Analysis requested: it runs in the background. Reload this page to follow it."))


@login_required
@require_POST
def cleanup_run(request: HttpRequest) -> HttpResponse:
    return _action(request, RunForm, lambda data: service.start_run(user=request.user, revision=data["revision"]),
                   done_text=_("Cleanup requested: it runs in the background. Reload this page to follow it."))


@login_required
@require_POST
def cleanup_cancel(request: HttpRequest) -> HttpResponse:
    return _action(request, CancelForm, lambda data: service.cancel(
        user=request.user, operation_id=data["operation_id"]),
        done_text=_("Cancel requested: the operation stops at its next check. Reload this page to see it stopped."))


@login_required
@require_POST
def cleanup_retry(request: HttpRequest) -> HttpResponse:
    return _action(request, RunForm, lambda data: service.retry_preparation(user=request.user,
                                                                          revision=data["revision"]),
                   done_text=_("Backup requested again: it runs in the background. Reload this page to follow it."))


@login_required
@require_POST
def cleanup_cancel_preparation(request: HttpRequest) -> HttpResponse:
    """Cancel after a failed or cancelled backup: cleanup is turned off, nothing was removed
    (service.cancel_preparation: refused once the backup was started again)."""
    return _action(request, RunForm,
                   lambda data: service.cancel_preparation(user=request.user, revision=data["revision"]),
                   policy_saved={"preparation_cancelled": True},
                   done_text=_("Backup preparation cancelled: automatic cleanup is off and nothing was removed."))


@login_required
@require_POST
def database_compact(request: HttpRequest) -> HttpResponse:
    return _action(request, None, lambda data: service.start_compact(user=request.user), error_key="compact_error",
                   done_text=_("Compact database requested: it runs in the background. Reload this page to follow "
                               "it."))
