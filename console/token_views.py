"""Settings > API tokens: list (everyone), create and revoke (admins). A new token is
shown once, in the answer to the POST that made it, and never again.

Each create form carries a one-time number kept in the session: sending the same form again
(a reload of the answer, Back and Forward) creates nothing and says so, and the token itself
is never stored anywhere to be shown again."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from console.auth import is_admin
from console.models import ApiToken
from console.tokens import TokenForm, create_token, revoke_token

PAGE = "console/api_tokens.html"


FORMS_KEPT = 20  # one-time numbers kept per session: open forms, and the forms already sent


def _form_number(request: HttpRequest) -> str:
    """A new one-time number for a create form, kept in the session until the form is sent."""
    number = secrets.token_urlsafe(16)
    if is_admin(request.user):
        request.session["token_forms"] = [*request.session.get("token_forms", []), number][-FORMS_KEPT:]
    return number


def _take_form_number(request: HttpRequest) -> str:
    """"open" when the number is one of this session's unsent forms (it is now spent), "sent"
    when that form was sent before, "unknown" otherwise (expired, or another session's)."""
    number = request.POST.get("form_number", "")
    open_forms = request.session.get("token_forms", [])
    if number and number in open_forms:
        request.session["token_forms"] = [n for n in open_forms if n != number]
        request.session["token_forms_sent"] = [*request.session.get("token_forms_sent", []), number][-FORMS_KEPT:]
        return "open"
    return "sent" if number and number in request.session.get("token_forms_sent", []) else "unknown"


def _page(request: HttpRequest, form: TokenForm, *, status: int = 200, **extra) -> HttpResponse:
    context = {
        "tokens": ApiToken.objects.select_related("user"),
        "form": form,
        "form_number": _form_number(request),
        "can_edit": is_admin(request.user),
        **extra,
    }
    return render(request, PAGE, context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        revoked = ApiToken.objects.filter(pk=request.GET.get("revoked", "")).first() \
            if request.GET.get("revoked", "").isdigit() else None
        return _page(request, TokenForm(initial={"days": settings.API_TOKEN_DAYS}), revoked=revoked)
    if not is_admin(request.user):
        raise PermissionDenied
    form = TokenForm(request.POST)
    if not form.is_valid():  # nothing spent; the page answering carries a new number
        return _page(request, form, status=422)
    taken = _take_form_number(request)
    if taken != "open":
        fresh = TokenForm(initial={"days": settings.API_TOKEN_DAYS})
        message = (_("This form was already sent: its token was created then and shown once. Nothing was created now.")
                   if taken == "sent" else _("This form has expired. Nothing was created; send it again."))
        return _page(request, fresh, status=409, resent=message)
    token, raw = create_token(request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"],
                              acting_user=request.user)
    return _page(request, TokenForm(initial={"days": settings.API_TOKEN_DAYS}), status=201,
                 created=token, raw_token=raw)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not is_admin(request.user):
        raise PermissionDenied
    token = get_object_or_404(ApiToken.objects.select_related("user"), pk=token_id)
    if request.method == "POST":
        revoke_token(token, acting_user=request.user)
        return redirect(reverse("api-tokens") + f"?revoked={token.pk}")
    return render(request, "console/api_token_revoke.html", {"token": token})
