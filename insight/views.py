from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from console.auth import is_admin
from insight.actions import request_measurement


@login_required
@require_POST
def storage_measure(request: HttpRequest) -> HttpResponse:
    if not is_admin(request.user):
        raise PermissionDenied
    request_measurement()
    return redirect(reverse("retention:data-storage") + "#storage-insight")
