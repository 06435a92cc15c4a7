"""Requests that no view should ever see, and response headers that depend on who asks."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _

from console.api import error, is_api_path


def _has_nul(request: HttpRequest) -> bool:
    if "\x00" in request.path:
        return True
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in request.GET.lists())


class RejectNulMiddleware:
    """A NUL character anywhere in the path or the query string is refused with 400.

    PostgreSQL cannot hold NUL in text, so such a value would otherwise fail deep inside a
    query; no legitimate address or search contains one.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _has_nul(request):
            if is_api_path(request.path):
                return error(400, "invalid_text", _("The address has a NUL character."))
            return render(request, "400.html", {"reason": "address"}, status=400)
        return self.get_response(request)


class NoStoreMiddleware:
    """`Cache-Control: no-store` on every page a signed-in person sees and every API answer.

    Neither a shared proxy nor the browser's history may keep a copy of conversation
    content or of an answer meant for one user. Static files never get here (whitenoise
    answers them first, with their own long-lived caching).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if is_api_path(request.path) or (user is not None and user.is_authenticated):
            add_never_cache_headers(response)
        return response


class DatabaseBusyMiddleware:
    """A page whose view found the database busy, full or unavailable (console.busy) answers 503
    with Retry-After and a page that says so, not the 500 of an unexpected error. (The API's
    dispatcher answers its own: `database_busy`, `database_full`, `database_unavailable`.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return trouble_response(request, exception)


def trouble_response(request: HttpRequest, exc: BaseException | None) -> HttpResponse | None:
    """The 503 for a database that is busy, full or unavailable (JSON under the API, else the
    plain page); None for any other error."""
    import logging

    from console.busy import database_refuses, trouble

    found = trouble(exc)
    if found is None:
        return None
    code, retry_after = found
    # A database that refuses writes is `database_unavailable` to clients, in words that say why
    # (r114): "cannot be reached" would be false, and a read-only one does nothing of the request.
    refused = database_refuses(exc)
    logging.getLogger("lethe.request").warning("%s in %s %s", f"{code} ({refused})" if refused else code,
                                               request.method, request.path)
    if is_api_path(request.path):
        response = error(503, code, trouble_message(f"database_{refused}" if refused else code))
    else:  # the plain page, as the 500 page: it renders without the database
        from console.views import plain_page

        response = plain_page(f"database_{refused}" if refused else code, status=503)
    response["Retry-After"] = str(retry_after)
    return response


def trouble_message(code: str) -> str:
    """The API's words for `code`, or for the kind of refusal behind `database_unavailable`
    (database_read_only, database_not_permitted)."""
    if code == "database_read_only":
        return _("The database is read-only now (a standby server, or one set read-only): nothing of this request "
                 "was done. Try again later; if this lasts, an operator must point Lethe at a database that takes "
                 "writes.")
    if code == "database_not_permitted":
        # Not "nothing was done": a grant taken away while Lethe runs may leave earlier steps of the
        # request stored (requests are not one transaction).
        return _("The database did not allow Lethe's database user what this request needed (permission "
                 "denied), so it could not be done. Read the current state before you try again; if this lasts, "
                 "an operator must grant that user Lethe's tables.")
    if code == "database_full":
        return _("The database's disk is full. An operator must free space on it; then try again.")
    if code == "database_unavailable":
        return _("The database cannot be reached right now. Try again later; if this lasts, an operator must "
                 "check the database.")
    return _("The database was too busy to answer in time (a compaction, a backup or another long write "
             "holds it). Try again in a moment.")
