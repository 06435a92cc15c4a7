"""Per-request context the pages need: the viewer's time zone, and signed-out htmx requests.

Time zone: every date and time is shown in the viewer's zone. The zone comes from the
`lethe_timezone` cookie (a zone the person chose) or else `lethe_browser_timezone` (what the
browser reports, set by lethe.js); each is used only when it names a zone in
`zoneinfo.available_timezones()`. Without either, times are in `settings.TIME_ZONE`.

Signed-out htmx requests: a request made in place (the list's search, tabs and pages; the
save bar's saves) whose session has ended would follow the login redirect and put the login
page inside the page. Instead it gets 401 with an `HX-Redirect` to the login page, which
returns to the page the person was on (or, for the list, the search they just made): htmx navigates
there, and the save bar keeps its draft and says the session ended.

Signed-out forms: a form sent the plain way (Archive, Close, Retry...) after the session ended
would sign in and then come back to the action's own address, which only takes a POST: the
browser showed an empty 405 and the action was silently lost. Instead the login page says
nothing was done and returns to the page the form was on (its `next` field, else the page
that sent it). And a GET of an action's address (typed, or an old link) gets a page that says
the action is taken with its button and nothing was done, not an empty 405; any other method a
page does not take (PUT, DELETE...) gets a page that says nothing was done.
"""

from __future__ import annotations

import zoneinfo
from functools import cache
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

from console.api import is_api_path

CHOSEN_COOKIE = "lethe_timezone"
BROWSER_COOKIE = "lethe_browser_timezone"
# Names the tz database lists that are not places: the host's own zone and a placeholder.
_NOT_ZONES = {"localtime", "Factory"}
_REGIONS = ("Africa/", "America/", "Antarctica/", "Arctic/", "Asia/", "Atlantic/", "Australia/",
            "Europe/", "Indian/", "Pacific/")


def back_to(request: HttpRequest, default: str, *, under: str = "/") -> str:
    """Where a form sends the browser back to (its `next` field): a path on this site under
    `under`, in printable characters (a NUL or a control character would make the address
    itself answer 400 after the form's action ran); anything else gives `default`."""
    target = request.POST.get("next", "")
    if (target.startswith(under) and target.isprintable()
            and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure())):
        return target
    return default


@cache
def known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() - _NOT_ZONES)


@cache
def zone_choices() -> tuple[str, ...]:
    """The zones offered in the picker: UTC and the region/city names, without the aliases."""
    return ("UTC", *sorted(z for z in known_zones() if z.startswith(_REGIONS)))


def valid_zone(name: str | None) -> str | None:
    return name if name and len(name) <= 64 and name in known_zones() else None


def viewer_zone(cookies) -> tuple[str, bool]:
    """(zone name, chosen by the person) for these cookies."""
    chosen = valid_zone(cookies.get(CHOSEN_COOKIE))
    if chosen:
        return chosen, True
    return valid_zone(cookies.get(BROWSER_COOKIE)) or settings.TIME_ZONE, False


class ViewerTimezoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        name, chosen = viewer_zone(request.COOKIES)
        request.timezone_name, request.timezone_chosen = name, chosen
        timezone.activate(zoneinfo.ZoneInfo(name))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def action_only(request: HttpRequest, refused: HttpResponse) -> HttpResponse:
    """A screen address asked with a method it does not take: a page saying nothing was done
    (still 405, with its Allow). GET at an action's address: the action is taken with its
    button; any other method (r106: a PUT to a page was an empty 405): the page does not take
    that kind of request."""
    response = render(request, "405.html", {"get": request.method == "GET"}, status=405)
    if refused.has_header("Allow"):
        response["Allow"] = refused["Allow"]
    return response


def _is_login_redirect(request: HttpRequest, response: HttpResponse) -> bool:
    """Whether the response is a signed-in-only view turning a signed-out visitor away: the
    login page with this very request as where to return (what `login_required` answers). A
    view open to signed-out visitors that sends them to the login page (sign-out, the sign-in
    page's language switch) is answered as it is."""
    if response.status_code not in (301, 302, 303, 307, 308):
        return False
    location = urlsplit(response.get("Location", ""))
    if location.path != resolve_url(settings.LOGIN_URL):
        return False
    return parse_qs(location.query).get(REDIRECT_FIELD_NAME) == [request.get_full_path()]


class SignedOutMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code == 405 and request.method != "HEAD" and not is_api_path(request.path_info):
            return action_only(request, response)
        if request.user.is_authenticated or not _is_login_redirect(request, response):
            return response
        if request.headers.get("HX-Request") == "true":
            # A history restore replaces the whole page; the login page is the right answer.
            if request.headers.get("HX-History-Restore-Request") != "true":
                return self.signed_out(request)
            return response
        if request.method == "POST":
            return self.signed_out_form(request)
        return response

    @staticmethod
    def signed_out_form(request: HttpRequest) -> HttpResponse:
        """The login page, saying the form's action was not taken, then back to the page the
        form was on: its `next` field, else the same-site page that sent it, else the list."""
        referer = request.headers.get("Referer", "")
        page = "/"
        if referer and url_has_allowed_host_and_scheme(referer, {request.get_host()}, require_https=request.is_secure()):
            parts = urlsplit(referer)
            if parts.path.startswith("/") and parts.path != resolve_url(settings.LOGIN_URL):
                page = parts.path + (f"?{parts.query}" if parts.query else "")
        messages.warning(request, _("Your session ended, so nothing was done. Sign in, then do it again."))
        return redirect_to_login(back_to(request, page if page.isprintable() else "/"))

    @staticmethod
    def signed_out(request: HttpRequest) -> HttpResponse:
        """401 with the way back: a GET in place is itself a page to return to (the list with
        its search); after a POST (a save), the page it was made from."""
        back = request.get_full_path()
        current = request.headers.get("HX-Current-URL", "")
        if request.method != "GET" and current and url_has_allowed_host_and_scheme(
            current, {request.get_host()}, require_https=request.is_secure()
        ):
            parts = urlsplit(current)
            back = parts.path + (f"?{parts.query}" if parts.query else "")
        response = HttpResponse(_("Your session ended. Sign in again."), status=401, content_type="text/plain")
        response["HX-Redirect"] = redirect_to_login(back)["Location"]
        return response
