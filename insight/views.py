from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from console.auth import is_admin
from insight.actions import request_measurement


@login_required
@require_POST
def storage_measure(request: HttpRequest) -> HttpResponse:
    if not is_admin(request.user):
        raise PermissionDenied
    request_measurement()
    # Said at the top of the page it comes back to, where the focus starts and which is read
    # out, as after the console's other actions (r66: the focus was lost, nothing was said). No
    # #storage-insight on the way back: the browser's move to it takes the focus off the message.
    messages.success(request, _("Measurement requested. It runs in the background: reload this page in a "
                                "minute for the new figures."))
    return redirect("retention:data-storage")
