"""/metrics for signed-in admins (a session: API tokens are read on the API paths only); the
metrics token is answered earlier, by OpsMiddleware. Health probes live in ops.health."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from console.auth import is_admin
from ops.metrics import exposition


def metrics_response() -> HttpResponse:
    response = HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        response = HttpResponse(_("Sign in as an admin, or send the metrics token."), status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="lethe-metrics"'
        return response
    if not is_admin(request.user):
        return HttpResponse(_("Only admins can read the metrics."), status=403, content_type="text/plain; charset=utf-8")
    return metrics_response()
