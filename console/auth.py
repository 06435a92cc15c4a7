"""Bearer-token authentication for API clients, and the admin/member split.

Admins are staff users: they may act. Every other signed-in user is a member and sees
everything read-only.
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from console.models import ApiToken, hash_token


def is_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def _token_user(raw: str):
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(raw)).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


class BearerTokenMiddleware:
    """A request with `Authorization: Bearer` is authenticated by token alone.

    Such requests carry no session cookie, so CSRF does not apply to them.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        scheme, _sep, raw = request.headers.get("Authorization", "").strip().partition(" ")
        raw = raw.strip()
        if scheme.lower() == "bearer" and raw:  # the scheme is case-insensitive (RFC 9110)
            request.user = SimpleLazyObject(lambda: _token_user(raw))
            request.token_auth = True
            request._dont_enforce_csrf_checks = True
        else:
            request.token_auth = False
        return self.get_response(request)
