"""System checks for the ops settings."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register

MIN_TOKEN_LENGTH = 32


@register()
def check_metrics_token(app_configs=None, **kwargs):
    token = getattr(settings, "METRICS_TOKEN", "")
    if token and len(token) < MIN_TOKEN_LENGTH:
        return [Warning(
            f"METRICS_TOKEN is shorter than {MIN_TOKEN_LENGTH} characters.",
            hint="Use a long random value, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            id="ops.W001",
        )]
    return []
