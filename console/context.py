from __future__ import annotations

from console.auth import is_admin


def console(request) -> dict:
    return {"is_admin": is_admin(getattr(request, "user", None))}
