"""Settings > API tokens: list (everyone), create and revoke (admins). A new token is
shown once, in the answer to the POST that made it, and never again."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.auth import is_admin
from console.models import ApiToken
from console.tokens import TokenForm, create_token, revoke_token

PAGE = "console/api_tokens.html"


def _page(request: HttpRequest, form: TokenForm, *, status: int = 200, **extra) -> HttpResponse:
    context = {
        "tokens": ApiToken.objects.select_related("user"),
        "form": form,
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
    if not form.is_valid():
        return _page(request, form, status=422)
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
