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
"""

from __future__ import annotations

import zoneinfo
from functools import cache
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

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


def _is_login_redirect(response: HttpResponse) -> bool:
    if response.status_code not in (301, 302, 303, 307, 308):
        return False
    return urlsplit(response.get("Location", "")).path == resolve_url(settings.LOGIN_URL)


class HtmxSignedOutMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            request.headers.get("HX-Request") == "true"
            # A history restore replaces the whole page; the login page is the right answer.
            and request.headers.get("HX-History-Restore-Request") != "true"
            and _is_login_redirect(response)
            and not request.user.is_authenticated
        ):
            return self.signed_out(request)
        return response

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
