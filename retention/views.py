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


def _tool_form(policy: ToolPayloadPolicy) -> ToolPayloadPolicyForm:
    return ToolPayloadPolicyForm(
        initial={
            "enabled": policy.enabled,
            "age_value": policy.age_value,
            "age_unit": policy.age_unit,
            "revision": policy.revision,
        }
    )


def _facts_form(policy: RetainedFactsPolicy) -> RetainedFactsForm:
    return RetainedFactsForm(
        initial={
            "audit_days": policy.audit_days,
            "usage_days": policy.usage_days,
            "billing_days": policy.billing_days,
            "revision": policy.revision,
        }
    )


def _context(request: HttpRequest, **overrides) -> dict:
    tool_policy = ToolPayloadPolicy.load()
    facts_policy = RetainedFactsPolicy.load()
    context = {
        "db": database_size(),
        "snapshot": StorageSnapshot.load(),
        "tool_policy": tool_policy,
        "tool_form": _tool_form(tool_policy),
        "facts_policy": facts_policy,
        "facts_form": _facts_form(facts_policy),
        "can_edit": is_admin(request.user),
    }
    context.update(overrides)
    return context


@login_required
@require_GET
def data_storage(request: HttpRequest) -> HttpResponse:
    return render(request, PAGE, _context(request))


def _refused(request: HttpRequest, region: str) -> HttpResponse:
    context = _context(request, notice=_("Only admins can change these settings."))
    return render(request, f"{PAGE}#{region}" if request.htmx else PAGE, context, status=403)


def _card_response(request: HttpRequest, region: str, status: int, **overrides) -> HttpResponse:
    context = _context(request, **overrides)
    return render(request, f"{PAGE}#{region}" if request.htmx else PAGE, context, status=status)


def _save_card(request: HttpRequest, region: str, form_name: str, form, save) -> HttpResponse:
    """One contributor's save: 403 for members, 422 invalid, 409 refused, else saved."""
    if not is_admin(request.user):
        return _refused(request, region)
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
