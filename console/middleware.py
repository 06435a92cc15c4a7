"""Response headers that depend on who is asking."""

from __future__ import annotations

from django.utils.cache import add_never_cache_headers

API_PREFIXES = ("/v1/", "/api/")


class NoStoreMiddleware:
    """`Cache-Control: no-store` on every page a signed-in person sees and every API answer.

    Neither a shared proxy nor the browser's history may keep a copy of conversation
    content or of an answer meant for one user. Static files never get here (whitenoise
    answers them first, with their own long-lived caching).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if request.path.startswith(API_PREFIXES) or (user is not None and user.is_authenticated):
            add_never_cache_headers(response)
        return response
