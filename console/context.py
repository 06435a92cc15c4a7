from __future__ import annotations

from console.auth import is_admin


def console(request) -> dict:
    return {
        "is_admin": is_admin(getattr(request, "user", None)),
        # Set by ViewerTimezoneMiddleware; error pages rendered outside it fall back to UTC.
        "timezone_name": getattr(request, "timezone_name", "UTC"),
        "timezone_chosen": getattr(request, "timezone_chosen", False),
    }
