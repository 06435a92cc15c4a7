from __future__ import annotations

from django.conf import settings


def remote_engine(request) -> dict:
    """Whether this console talks to a remote engine (ENGINE_URL): its screens link to the bindings."""
    return {"remote_engine": bool(settings.ENGINE_URL)}
