"""The outermost middleware: request ids, request metrics, the access log, and the answers
that must not depend on anything else (health probes, metrics for the metrics token).

It runs first, so that every log line of a request carries its id, and so that probes are
answered without a session, a host check or an HTTPS redirect.
"""

from __future__ import annotations

import hmac
import logging
import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

from ops import context, health
from ops.metrics import observe_request
from ops.views import metrics_response

logger = logging.getLogger("lethe.request")

PROBES = {"/healthz": ("healthz", health.healthz), "/readyz": ("readyz", health.readyz)}
METRICS_PATH = "/metrics"
METRICS_VIEW = "ops:metrics"  # the URL name, as when it is routed (an admin's session): one label


def metrics_token_given(request: HttpRequest) -> bool:
    """`Authorization: Bearer <METRICS_TOKEN>`, compared in constant time."""
    expected = getattr(settings, "METRICS_TOKEN", "")
    scheme, _sep, given = request.headers.get("Authorization", "").strip().partition(" ")
    if not expected or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())


def view_label(request: HttpRequest) -> str:
    """A bounded label for metrics: the URL name, never the raw path."""
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match.view_name
    if request.path_info.startswith(settings.STATIC_URL):
        return "static"
    return "unmatched"


def clear_request_context(**kwargs) -> None:
    context.clear()


class OpsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.access_log = getattr(settings, "ACCESS_LOG", True)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = context.sane_request_id(request.headers.get("X-Request-ID"))
        request.request_id = request_id
        # Bound until the response is closed (request_finished clears it, see OpsConfig), so
        # what Django logs after the middleware, such as "Not Found", carries the id too.
        context.clear()
        context.set_fields(request_id=request_id)
        started = time.perf_counter()
        direct = self.direct_answer(request)
        if direct is not None:
            view, response = direct
            response._has_been_logged = True  # our access line says it; Django's would repeat it
        else:
            response = self.get_response(request)
            view = view_label(request)
        seconds = time.perf_counter() - started
        try:
            observe_request(request.method or "", view, response.status_code, seconds)
        except Exception:  # figures never cost a request its answer
            logger.exception("could not count the request")
        if self.access_log and (direct is None or response.status_code >= 400):
            logger.info(
                "%s %s %s", request.method, view, response.status_code,
                extra={"method": request.method, "path": request.path[:200], "view": view,
                       "status": response.status_code, "duration_ms": round(seconds * 1000, 1)},
            )
        response["X-Request-ID"] = request_id
        return response

    def direct_answer(self, request: HttpRequest) -> tuple[str, HttpResponse] | None:
        path = request.path_info
        if path in PROBES:
            name, view = PROBES[path]
            if request.method not in ("GET", "HEAD"):
                return name, HttpResponseNotAllowed(["GET", "HEAD"])
            return name, view(request)
        if path == METRICS_PATH and metrics_token_given(request):
            if request.method not in ("GET", "HEAD"):
                return METRICS_VIEW, HttpResponseNotAllowed(["GET", "HEAD"])
            return METRICS_VIEW, metrics_response()
        return None
