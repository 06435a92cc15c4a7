from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.template import loader
from django.templatetags.static import static
from django.utils import translation
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST, require_safe

from console.api import error, internal_error, is_api_path
from console.viewer import CHOSEN_COOKIE, back_to, valid_zone


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """Switch the interface language; remembered in a cookie, works without JavaScript."""
    code = request.POST.get("language", "")
    target = back_to(request, "/")
    response = HttpResponseRedirect(target)
    if code in dict(settings.LANGUAGES):
        translation.activate(code)
        response.set_cookie(
            settings.LANGUAGE_COOKIE_NAME, code, max_age=365 * 24 * 3600, samesite="Lax",
            secure=settings.LANGUAGE_COOKIE_SECURE,
        )
    return response


@require_POST
def set_timezone(request: HttpRequest) -> HttpResponse:
    """Show times in a chosen zone, or (empty) in the zone the browser reports; a cookie,
    works without JavaScript. An unknown zone changes nothing."""
    name = request.POST.get("timezone", "")
    target = back_to(request, "/")
    response = HttpResponseRedirect(target)
    if name == "":
        response.delete_cookie(CHOSEN_COOKIE, samesite="Lax")
    elif valid_zone(name):
        response.set_cookie(CHOSEN_COOKIE, name, max_age=365 * 24 * 3600, samesite="Lax",
                            secure=settings.LANGUAGE_COOKIE_SECURE)  # a preference, as the language
    return response


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, where a browser looks for the icon of a page that names none (an error page
    the web server answers itself, a file it shows): the icon every page names (r96: a 404 there
    was an error in every new browser session's console)."""
    return redirect(static("favicon.svg"))


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api_path(request.path_info):  # nothing under the API prefixes answers HTML
        return error(403, "csrf_failed", _("The form expired; reload the page and try again."))
    return render(request, "403_csrf.html", status=403)


# Error handlers: JSON under the API prefixes, the localized pages everywhere else.


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request.path):
        return error(400, "bad_request", _("The request is not valid."))
    return render(request, "400.html", status=400)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request.path):
        return error(404, "not_found", _("There is nothing at this address."))
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    import sys

    from console.middleware import trouble_response

    # A database busy or full when no view ran yet (a middleware's write): 503, not 500.
    if (response := trouble_response(request, sys.exception())) is not None:
        return response
    if is_api_path(request.path):
        return internal_error()
    return plain_page("error", status=500)


def plain_page(kind: str, *, status: int) -> HttpResponse:
    """An error page (`kind`: error, database_busy, database_full, database_unavailable, and for a
    database that refuses writes database_read_only, database_not_permitted) that renders without
    the database, the session or a signed-in user; its stylesheet is a file (the
    Content-Security-Policy allows no inline style), left out if even the static files'
    manifest cannot be read."""
    heading, message = {
        "error": (_("Something went wrong"), _(
            "Lethe could not finish this request. Reload the page to see the current state, then try again.")),
        "database_busy": (_("The database is busy"), _(
            "Lethe could not get to the database in time: something holds it, such as a compaction, a backup or "
            "another long write. Wait a moment, reload the page to see the current state, then try again.")),
        "database_full": (_("The database's disk is full"), _(
            "Lethe could not save this: the disk that holds its database is full. An operator must free space on "
            "that disk; then reload the page to see the current state and try again.")),
        "database_unavailable": (_("The database cannot be reached"), _(
            "Lethe could not get to its database: it is not where it should be, or its server is down or "
            "restarting. Reload the page later; if this lasts, an operator must check the database.")),
        # database_unavailable to the API, in words that say why (r114)
        "database_read_only": (_("The database takes no writes"), _(
            "Lethe could not save anything: its database is read-only (a standby server, or one set read-only), so "
            "nothing of this request was done. Reload the page later; if this lasts, an operator must point Lethe "
            "at a database that takes writes.")),
        "database_not_permitted": (_("The database refused access"), _(
            "The database did not allow Lethe's database user what this request needed (permission denied), so it "
            "could not be done. Reload the page to see the current state; if this lasts, an operator must grant "
            "that user Lethe's tables.")),
    }[kind]
    try:
        stylesheet, icon = static("css/error.css"), static("favicon.svg")
    except Exception:  # noqa: BLE001 (the error page must render whatever broke)
        stylesheet = icon = ""
    page = loader.get_template("plain.html").render({"stylesheet": stylesheet, "icon": icon, "heading": heading,
                                                     "message": message})
    return HttpResponse(page, status=status)
