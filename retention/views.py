"""Settings > System > Data & storage.

Each editable card is an independent contributor to the shared Save/Discard bar: it has
its own form, its own POST endpoint and its own revision, so one card's invalid input or
stale revision never blocks another card's save.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from console.auth import is_admin
from lifecycle.actions.save_facts_policy import save_facts_policy
from lifecycle.errors import ActionRefused
from lifecycle.models import RetainedFactsPolicy
from retention.actions.save_policy import save_tool_payload_policy
from retention.forms import RetainedFactsForm, ToolPayloadPolicyForm
from retention.models import StorageSnapshot, ToolPayloadPolicy
from retention.storage import database_size

PAGE = "retention/data_storage.html"


def _saved_form(form_class, policy):
    """An unbound form showing the saved values (every form field is a policy field)."""
    return form_class(initial={name: getattr(policy, name) for name in form_class.base_fields})


def _context(request: HttpRequest, **overrides) -> dict:
    tool_policy = ToolPayloadPolicy.load()
    context = {
        "db": database_size(),
        "snapshot": StorageSnapshot.load(),
        "tool_policy": tool_policy,
        "tool_form": _saved_form(ToolPayloadPolicyForm, tool_policy),
        "facts_form": _saved_form(RetainedFactsForm, RetainedFactsPolicy.load()),
        "can_edit": is_admin(request.user),
    }
    context.update(overrides)
    return context


@login_required
@require_GET
def data_storage(request: HttpRequest) -> HttpResponse:
    return render(request, PAGE, _context(request))


def _card_response(request: HttpRequest, region: str, status: int, **overrides) -> HttpResponse:
    context = _context(request, **overrides)
    return render(request, f"{PAGE}#{region}" if request.htmx else PAGE, context, status=status)


def _save_card(request: HttpRequest, region: str, form_name: str, form, save) -> HttpResponse:
    """One contributor's save: 403 for members, 422 invalid, 409 refused, else saved."""
    if not is_admin(request.user):
        return _card_response(request, region, 403, notice=_("Only admins can change these settings."))
    if not form.is_valid():
        return _card_response(request, region, 422, **{form_name: form})
    try:
        save(form.cleaned_data)
    except ActionRefused as exc:
        form.add_error(None, exc.message)
        return _card_response(request, region, 409, **{form_name: form})
    if request.htmx:
        return _card_response(request, region, 200, **{f"{form_name}_saved": True})
    return redirect("retention:data-storage")


@login_required
@require_POST
def tool_policy_save(request: HttpRequest) -> HttpResponse:
    return _save_card(
        request, "tool-card", "tool_form", ToolPayloadPolicyForm(request.POST),
        lambda data: save_tool_payload_policy(**data, acting_user=request.user),
    )


@login_required
@require_POST
def facts_policy_save(request: HttpRequest) -> HttpResponse:
    return _save_card(
        request, "facts-card", "facts_form", RetainedFactsForm(request.POST),
        lambda data: save_facts_policy(values=data, revision=data["revision"], acting_user=request.user),
    )
