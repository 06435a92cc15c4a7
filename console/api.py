"""Small helpers shared by every JSON endpoint: auth, strict bodies, uniform errors.

Errors are always `{"code": ..., "message": ...}` with a localized, sanitized message.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt

from console.auth import is_admin


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def is_number(raw: str) -> bool:
    """A plain ASCII whole number of sane length (str.isdigit also accepts "²" and other digits)."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 18


def error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"code": code, "message": message}, status=status)


def api_view(methods: tuple[str, ...], *, write: tuple[str, ...] = ()) -> Callable:
    """Wrap a JSON view: 401 anonymous, 405 wrong method, 403 members on write methods.

    Browsers keep CSRF protection (the session cookie is ambient authority); token clients
    are exempted by the bearer middleware.
    """

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            if not request.user.is_authenticated:
                return error(401, "not_authenticated", _("Sign in or send an API token."))
            if request.method not in methods:
                response = error(405, "method_not_allowed", _("This method is not allowed here."))
                response["Allow"] = ", ".join(methods)
                return response
            if request.method in write and not is_admin(request.user):
                return error(403, "forbidden", _("Only admins can change this."))
            if request.method not in ("GET", "HEAD", "OPTIONS") and not getattr(request, "token_auth", False):
                from django.middleware.csrf import CsrfViewMiddleware

                reason = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
                if reason is not None:
                    return error(403, "csrf_failed", _("The form expired; reload the page and try again."))
            try:
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.code, exc.message)
            except Http404:
                return error(404, "not_found", _("Nothing with that id exists here."))

        return csrf_exempt(wrapper)

    return decorate


@dataclass(frozen=True)
class Field:
    types: tuple[type, ...]
    required: bool = False
    max_length: int | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False


def parse_body(request: HttpRequest, fields: dict[str, Field]) -> dict[str, Any]:
    """A strict JSON object: known fields only, right types, within limits."""
    if not request.content_type or request.content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", _("Send the body as application/json."))
    length = request.headers.get("Content-Length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise ApiError(400, "invalid_body", _("The request body length is not valid.")) from None
        if declared > settings.API_MAX_BODY_BYTES:
            raise ApiError(413, "body_too_large", _("The request body is too large."))
    raw = request.read(settings.API_MAX_BODY_BYTES + 1)
    if len(raw) > settings.API_MAX_BODY_BYTES:
        raise ApiError(413, "body_too_large", _("The request body is too large."))
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "malformed_json", _("The request body is not valid JSON.")) from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", _("The request body must be a JSON object."))
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ApiError(
            400, "unknown_field", _("Unknown field: %(field)s.") % {"field": unknown[0][:60]}
        )
    for name, spec in fields.items():
        if name not in body:
            if spec.required:
                raise ApiError(400, "missing_field", _("Missing field: %(field)s.") % {"field": name})
            continue
        value = body[name]
        if value is None and spec.nullable:
            continue
        # bool is an int in Python; a JSON true is never a number here.
        if not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types):
            raise ApiError(400, "invalid_type", _("Field %(field)s has the wrong type.") % {"field": name})
        if spec.max_length is not None and isinstance(value, str) and len(value) > spec.max_length:
            raise ApiError(400, "too_long", _("Field %(field)s is too long.") % {"field": name})
        if spec.choices is not None and value not in spec.choices:
            raise ApiError(400, "invalid_choice", _("Field %(field)s has an unknown value.") % {"field": name})
    return body
