"""Settings > API tokens: list (admins see every user's tokens, members only their own),
create and revoke (admins). A new token is
shown once, in the answer to the POST that made it, and never again.

Each create form carries a one-time number, stored with the token it creates under a unique
constraint: sending the same form again (a reload of the answer, Back and Forward, a double
click whose two requests race) creates nothing and says so, and the token itself is never
stored anywhere to be shown again. That answer names the token the first sending made (name,
prefix, when) with its Revoke control: the browser may have shown only the second answer, so
its value may never have been seen. The page's script also sends the form only once
(data-submit-once)."""

from __future__ import annotations

import re
import secrets

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from console.api import is_number
from console.auth import is_admin
from console.models import ApiToken
from console.tokens import TokenForm, create_token, revoke_token

PAGE = "console/api_tokens.html"
TOKENS_PAGE = 50  # tokens a page lists, newest first (an install may hold thousands)


FORM_NUMBER = re.compile(r"[A-Za-z0-9_-]{16,32}")


def _form_number() -> str:
    """A new one-time number for a create form."""
    return secrets.token_urlsafe(16)


def visible_tokens(user):
    """The tokens `user` may see: every one for an admin; a member's own only (another user's
    token names, prefixes and last use are not a member's to read)."""
    tokens = ApiToken.objects.select_related("user")
    return tokens if is_admin(user) else tokens.filter(user=user)


def _asked_page(request: HttpRequest) -> int:
    """An asked page number: ASCII digits only, else the first page (past the last: the last)."""
    raw = request.GET.get("page", "")
    return int(raw) if is_number(raw) and int(raw) > 0 else 1


def _page(request: HttpRequest, form: TokenForm, *, status: int = 200, **extra) -> HttpResponse:
    page = Paginator(visible_tokens(request.user), TOKENS_PAGE).get_page(_asked_page(request))
    context = {
        "tokens": list(page.object_list),
        "page": page,
        "form": form,
        "form_number": _form_number(),
        "can_edit": is_admin(request.user),
        **extra,
    }
    return render(request, PAGE, context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        mark = request.GET.get("revoked", "")
        # a plain ASCII number only: str.isdigit also passes "²", which int() refuses
        revoked = visible_tokens(request.user).filter(pk=int(mark)).first() if is_number(mark) else None
        return _page(request, TokenForm(initial={"days": settings.API_TOKEN_DAYS}), revoked=revoked)
    if not is_admin(request.user):
        raise PermissionDenied
    form = TokenForm(request.POST)
    if not form.is_valid():  # nothing spent; the page answering carries a new number
        return _page(request, form, status=422)
    number = request.POST.get("form_number", "")
    if not FORM_NUMBER.fullmatch(number):  # a page from before numbers, or a made-up request: asked again
        return _page(request, form, status=409, resent=_("This form has expired. Nothing was created; send it again."))
    try:
        token, raw = create_token(request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"],
                                  acting_user=request.user, form_number=number)
    except IntegrityError:  # this form made a token already
        # Whether the answer that showed it was ever seen, the server cannot know (a double
        # click shows the second answer only): name the token, so it can be revoked if its
        # value was not copied. Its value is not kept anywhere, so it is never shown here.
        first = ApiToken.objects.select_related("user").filter(form_number=number, user=request.user).first()
        if first is None:  # gone since (its user deleted): nothing stands in the way of a new one
            return _page(request, form, status=409, resent=_(
                "This form has expired. Nothing was created; send it again."))
        return _page(request, TokenForm(initial={"days": settings.API_TOKEN_DAYS}), status=409, resent_token=first)
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
