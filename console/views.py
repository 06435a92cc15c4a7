from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import translation
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.middleware import CHOSEN_COOKIE, valid_zone


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """Switch the interface language; remembered in a cookie, works without JavaScript."""
    code = request.POST.get("language", "")
    target = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        target = "/"
    response = HttpResponseRedirect(target)
    if code in dict(settings.LANGUAGES):
        translation.activate(code)
        response.set_cookie(
            settings.LANGUAGE_COOKIE_NAME, code, max_age=365 * 24 * 3600, samesite="Lax"
        )
    return response


@require_POST
def set_timezone(request: HttpRequest) -> HttpResponse:
    """Show times in a chosen zone, or (empty) in the zone the browser reports; a cookie,
    works without JavaScript. An unknown zone changes nothing."""
    name = request.POST.get("timezone", "")
    target = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        target = "/"
    response = HttpResponseRedirect(target)
    if name == "":
        response.delete_cookie(CHOSEN_COOKIE, samesite="Lax")
    elif valid_zone(name):
        response.set_cookie(CHOSEN_COOKIE, name, max_age=365 * 24 * 3600, samesite="Lax")
    return response


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    return render(request, "403_csrf.html", status=403)
