"""Bearer-token authentication for API clients, and the admin/member split.

Admins are staff users: they may act. Every other signed-in user is a member and sees
everything read-only.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AnonymousUser
from django.db import DatabaseError
from django.utils import timezone
from django.utils.translation import gettext as _

from console import throttle
from console.busy import trouble, waiting_at_most
from console.models import ApiToken, hash_token

LAST_USE_PRECISION = timedelta(minutes=1)  # at most one write per token per minute


def is_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def _token_user(raw: str, address: str):
    """The token's user; anonymous (so 401) for an unknown, expired or revoked token.

    Only unknown tokens count as failures for the address: a guesser cannot present an
    expired or revoked one, and a forgotten script using one must not lock others out.
    """
    now = timezone.now()
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(raw)).first() if raw else None
    if token is None:
        throttle.record_failure(throttle.token_keys(address), kind="api_token", address=address,
                                reason="unknown")
        return AnonymousUser()
    if token.state(now) != "active" or not token.user.is_active:
        return AnonymousUser()
    try:  # bookkeeping: a busy or full database does not hold the request up
        with waiting_at_most(0.05):
            ApiToken.objects.filter(pk=token.pk).exclude(last_used_at__gt=now - LAST_USE_PRECISION).update(
                last_used_at=now)
    except DatabaseError as exc:
        # busy or full: recorded on a later request; unavailable or refusing writes (a read-only
        # database, a role without the grant: r114, a 500 even for a GET): not recorded
        if trouble(exc) is None:
            raise
    return token.user


class BearerTokenMiddleware:
    """A request to the API (`/v1/`, `/api/v1/`) with `Authorization: Bearer` is
    authenticated by token alone.

    Such requests carry no session cookie, so CSRF does not apply to them. An address that
    sent too many unknown tokens gets 429 until its wait is over, before any lookup. The
    screens never take a token (DESIGN 8: browsers use the session and CSRF): a token sent
    to them is ignored, so a token cannot reach the screens' actions, such as making another
    token that would outlive its own revocation.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        scheme, _sep, raw = request.headers.get("Authorization", "").strip().partition(" ")
        raw = raw.strip()
        from console.api import is_api_path  # console.api imports this module

        # the scheme is case-insensitive (RFC 9110)
        if scheme.lower() != "bearer" or not raw or not is_api_path(request.path_info):
            request.token_auth = False
            return self.get_response(request)
        address = throttle.client_address(request)
        wait = throttle.wait_seconds(throttle.token_keys(address))
        if wait:
            from console.api import error  # console.api imports this module

            response = error(429, "too_many_attempts", _(
                "Too many requests with an unknown API token. Wait %(wait)s, then try again."
            ) % {"wait": throttle.describe_wait(wait)})
            response["Retry-After"] = str(wait)
            return response
        request.user = _token_user(raw, address)
        request.token_auth = True
        request._dont_enforce_csrf_checks = True
        return self.get_response(request)
