"""The JSON API layer: declared endpoints, strict bodies, uniform errors, the published schema.

Every endpoint is declared once, with `@endpoint(method, path, body=..., query=...,
response=...)`. That one declaration validates the request, builds the URL pattern and
generates the OpenAPI 3.1 document at `GET /v1/openapi.json`, so the published schema cannot
drift from what the server accepts. Bodies and answers are pydantic models (`Schema`:
unknown fields refused, no type coercion).

Before a body reaches its model it passes the strict JSON reader: duplicate keys, `NaN`,
`Infinity`, numbers that overflow, nesting deeper than `API_MAX_JSON_DEPTH`, NUL characters
and lone surrogates are refused with a stable code, since each of them either means two
different things to two parsers or cannot be stored by one of the databases.

Errors are always `{"code": ..., "message": ...}` (plus documented keys such as `outcome`)
with a localized, sanitized message; nothing under `/v1/` or `/api/v1/` answers HTML.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import sys
import typing
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path, register_converter
from django.urls.converters import PathConverter
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import models_json_schema

from console.auth import is_admin
from lifecycle.item_payload import BAD_TEXT

logger = logging.getLogger("lethe.api")

ENGINE_PREFIX = "/v1/"
API_PREFIXES = (ENGINE_PREFIX, "/api/v1/")
API_ROOTS = tuple(prefix.rstrip("/") for prefix in API_PREFIXES)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

# A revision a body names: a whole number no larger than a stored one can be (the columns are
# 32-bit), so a number beyond that is out of range (400 invalid_value), not a stale revision.
MAX_REVISION = 2_147_483_647
Revision = Annotated[int, Field(ge=1, le=MAX_REVISION)]


# ---- Errors -------------------------------------------------------------------------------


class ApiError(Exception):
    """Answer `status` with `{"code", "message", **extra}` and change nothing."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
        self.headers: dict[str, str] = {}  # answer headers the refusal needs


class TextEncoder(DjangoJSONEncoder):
    """Answers are UTF-8 JSON with the text as it is, not \\uXXXX escapes: the sizes the API
    bounds (a page's API_MAX_PAGE_BYTES) are UTF-8 bytes, and an escape takes three times as
    many (r95). Text that cannot be UTF-8 (a lone surrogate, from a file the runtime wrote:
    the fleet's subagent rows) is written escaped, as before, not a failed answer (r97)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "ensure_ascii": False})

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.ensure_ascii = True
            return super().encode(o)
        return text


def error(status: int, code: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, **extra}, status=status, encoder=TextEncoder)


def is_api_path(path_info: str) -> bool:
    """Under the API prefixes, or one of them without its slash (`/v1`)."""
    return path_info.startswith(API_PREFIXES) or path_info in API_ROOTS


# The largest whole number a request may write (a query parameter, a Content-Length): 18
# digits, so any of them fits a 64-bit integer; published as the query parameters' `maximum`.
MAX_WHOLE_NUMBER = 10**18 - 1


def is_number(raw: str) -> bool:
    """A plain ASCII whole number of sane length (str.isdigit also accepts "²" and other digits)."""
    return raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_WHOLE_NUMBER))


# ---- Declarations -------------------------------------------------------------------------


class Schema(BaseModel):
    """A request body or an answer: unknown fields refused, types exact (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class QuerySchema(BaseModel):
    """Query parameters. Values arrive as text, so numbers are parsed (lax), but unknown
    parameters are refused. `error_codes` names the refusal code per parameter."""

    model_config = ConfigDict(extra="forbid")
    error_codes: ClassVar[dict[str, str]] = {}
    default_error_code: ClassVar[str] = "invalid_filter"


class QueryRule(ValueError):
    """A rule across query parameters, broken: its message (lazily translated) is the answer's."""


OWNER_PAIR = gettext_lazy("owner_kind and owner_id go together: send both, or neither.")


class ResponseMismatch(AssertionError):
    """An answer that does not match its declaration (checked when API_VALIDATE_RESPONSES)."""


class ErrorOut(BaseModel):
    model_config = ConfigDict(extra="allow", title="Error")

    code: str
    message: str


@dataclass(frozen=True)
class Header:
    """A request header an endpoint reads; `code` is the refusal when a required one is missing
    (or sent empty), `invalid_code` when one is sent too long, with characters that are not
    printable, or not matching `pattern` (anchored, in the syntax Python and JSON Schema share;
    published as the header's schema)."""

    name: str
    description: str = ""
    required: bool = False
    max_length: int = 200
    pattern: str | None = None
    code: str = "missing_header"
    invalid_code: str = "invalid_header"
    # The refusal's words for an invalid value (lazy); the generic ones when None.
    invalid_message: Any = None


class AnyText(str):
    """A path parameter's type for an id the caller does not choose (a runtime writes it): any
    text, a slash too (sent as %2F or as it is), and a line break (sent as %0A: Django's `path`
    took none, and such a row could not be named here while the command could: r123)."""


class AnyTextConverter(PathConverter):
    regex = r"[\s\S]+"


register_converter(AnyTextConverter, "anytext")


@dataclass
class Endpoint:
    method: str
    path: str
    view: Callable[..., Any]
    body: type[Schema] | None = None
    query: type[QuerySchema] | None = None
    responses: dict[int, type[BaseModel] | None] = field(default_factory=dict)
    admin: bool = False
    public: bool = False
    errors: tuple[int, ...] = ()
    headers: tuple[Header, ...] = ()
    summary: str = ""
    description: str = ""
    name: str = ""

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)

    def param_type(self, name: str) -> type:
        hints = typing.get_type_hints(self.view)
        return hints[name] if hints.get(name) in (int, AnyText) else str

    @property
    def default_status(self) -> int:
        return next(iter(self.responses))


ENDPOINTS: list[Endpoint] = []


def endpoint(
    method: str,
    route: str,
    *,
    body: type[Schema] | None = None,
    query: type[QuerySchema] | None = None,
    response: type[BaseModel] | dict[int, type[BaseModel] | None] | None = None,
    status: int = 200,
    admin: bool = False,
    public: bool = False,
    errors: Iterable[int] = (),
    headers: Iterable[Header] = (),
    summary: str = "",
    description: str = "",
    name: str = "",
) -> Callable:
    """Declare a JSON endpoint. The view gets `request`, the path parameters, and `body` /
    `query` when declared; it returns a dict (answered with the first declared status), a
    `(status, dict)` pair, or an HttpResponse. `admin=True` refuses members with 403;
    `public=True` needs no sign-in."""

    responses = response if isinstance(response, dict) else {status: response}

    def register(view: Callable) -> Callable:
        ENDPOINTS.append(
            Endpoint(
                method=method.upper(), path=route, view=view, body=body, query=query,
                responses=responses, admin=admin, public=public, errors=tuple(errors),
                headers=tuple(headers), summary=summary, description=description or (view.__doc__ or "").strip(),
                name=name or view.__name__,
            )
        )
        return view

    return register


# ---- Strict JSON --------------------------------------------------------------------------


class _Refused(ValueError):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _Refused("duplicate_key")
    return result


def _constant(name: str) -> Any:
    raise _Refused("invalid_number")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused("invalid_number")
    return value


# The largest whole number a double holds: one beyond it overflows to Infinity wherever JSON
# numbers are read as doubles (a browser, SQLite's json_extract), as 1e400 does (r75: only the
# written-out form of such a number was taken).
_LARGEST = int(sys.float_info.max)


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts
        raise _Refused("invalid_number") from None
    if abs(value) > _LARGEST:
        raise _Refused("invalid_number")
    return value




def check_tree(value: Any, *, max_depth: int) -> None:
    """Refuse nesting deeper than `max_depth`, NUL characters and lone surrogates anywhere."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if BAD_TEXT.search(node):
                raise _Refused("invalid_text")
        elif isinstance(node, dict | list):
            if depth > max_depth:
                raise _Refused("too_deep")
            if isinstance(node, dict):
                for key, child in node.items():
                    if BAD_TEXT.search(key):
                        raise _Refused("invalid_text")
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in node)


def loads_strict(raw: bytes, *, max_depth: int) -> Any:
    """Parse JSON the strict way; raises ApiError(400) with a stable code."""
    messages = {
        "malformed_json": _("The request body is not valid JSON."),
        "duplicate_key": _("The request body has a key more than once."),
        "invalid_number": _("The request body has a number that is not finite or too large."),
        "too_deep": _("The request body is nested too deeply."),
        "invalid_text": _("The request body has text with a NUL character or an invalid character."),
    }
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float, parse_int=_int
        )
        check_tree(value, max_depth=max_depth)
    except _Refused as exc:
        raise ApiError(400, exc.code, messages[exc.code]) from None
    except RecursionError:
        raise ApiError(400, "too_deep", messages["too_deep"]) from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "malformed_json", messages["malformed_json"]) from None
    return value


def read_json_body(request: HttpRequest) -> Any:
    if request.content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", _("Send the body as application/json."))
    if request.content_params.get("charset", "utf-8").strip().lower() not in ("utf-8", "utf8"):
        # JSON is UTF-8 (RFC 8259); a body said to be in another encoding is not read as JSON
        raise ApiError(415, "unsupported_media_type", _("Send the body as application/json in UTF-8."))
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in ("", "identity"):
        # A compressed body is not read (RFC 7694: 415 with the codings taken, none here); it was
        # read as JSON and refused as malformed (r153).
        refused = ApiError(415, "unsupported_content_encoding", _(
            "The request body is encoded (Content-Encoding: %(coding)s); send it as plain application/json.")
            % {"coding": shown_name(coding, 40)})
        refused.headers = {"Accept-Encoding": "identity"}
        raise refused
    limit = settings.API_MAX_BODY_BYTES
    length = request.headers.get("Content-Length")
    if "Transfer-Encoding" in request.headers:
        # The server reads a body by its Content-Length: a chunked one would arrive empty (and
        # a request with both headers is one to refuse, not to guess about).
        raise ApiError(411, "length_required", _("Send the request body with a Content-Length header."))
    if length is not None:
        if not is_number(length.strip()):
            raise ApiError(400, "invalid_body", _("The request body length is not valid."))
        if int(length) > limit:
            raise ApiError(413, "body_too_large", _("The request body is too large."))
    raw = request.read(limit + 1)
    if len(raw) > limit:
        raise ApiError(413, "body_too_large", _("The request body is too large."))
    return loads_strict(raw, max_depth=settings.API_MAX_JSON_DEPTH)


# ---- Validation ---------------------------------------------------------------------------


# The names pydantic gives the members of a union in an error's location ("str", "int",
# "dict[str,json-or-python[...]]"): types, not fields, so the name stops before them.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none", "list", "dict", "tuple", "set"})


def shown_name(text: str, limit: int = 80) -> str:
    """A name from the request as an error message can show it: control, format (bidi) and
    separator characters written as escapes, at most `limit` characters."""
    out = []
    for char in text[:limit]:
        category = unicodedata.category(char)
        out.append(f"\\u{ord(char):04x}" if category[0] == "C" or category in ("Zl", "Zp") else char)
    return "".join(out)


def _field_name(loc: tuple, *, client_key: bool = False) -> str:
    """The dotted name of the field an error is about; `client_key`: the last part is a key the
    client wrote (an unknown field), shown whatever it looks like."""
    parts = [str(part) for part in loc if not isinstance(part, int)]
    last = [parts.pop()] if client_key and parts else []
    names = []
    for part in parts:
        if "[" in part or part in _TYPE_TAGS:
            break
        names.append(part)
    return shown_name(".".join(names + last)) or "body"


_OUT_OF_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "string_too_short",
                 "too_short", "string_pattern_mismatch"}


def _body_error(exc: ValidationError) -> ApiError:
    first = exc.errors(include_url=False)[0]  # the input is looked at, never shown
    kind = first["type"]
    name = _field_name(first["loc"], client_key=kind == "extra_forbidden")
    if kind in ("literal_error", "enum") and not isinstance(first.get("input"), str):
        kind = "wrong_type"  # a number where a word is expected: a type, not an unknown word
    if kind == "extra_forbidden":
        return ApiError(400, "unknown_field", _("Unknown field: %(field)s.") % {"field": name})
    if kind == "missing":
        return ApiError(400, "missing_field", _("Missing field: %(field)s.") % {"field": name})
    if kind in ("string_too_long", "too_long"):
        return ApiError(400, "too_long", _("Field %(field)s is too long.") % {"field": name})
    if kind in ("literal_error", "enum"):
        return ApiError(400, "invalid_choice", _("Field %(field)s has an unknown value.") % {"field": name})
    if kind in _OUT_OF_RANGE:
        return ApiError(400, "invalid_value", _("Field %(field)s is out of range.") % {"field": name})
    return ApiError(400, "invalid_type", _("Field %(field)s has the wrong type.") % {"field": name})


def _query_error(exc: ValidationError, model: type[QuerySchema]) -> ApiError:
    first = exc.errors(include_url=False, include_input=False)[0]
    if not first["loc"]:  # a rule across parameters: its own words when it has them
        rule = first.get("ctx", {}).get("error")
        message = str(rule) if isinstance(rule, QueryRule) else _("These filters do not go together.")
        return ApiError(400, model.default_error_code, message)
    # A query parameter's name is the client's own, whatever it looks like (`limit[]`, `int`)
    name = _field_name(first["loc"][:1], client_key=True)
    if first["type"] == "extra_forbidden":
        return ApiError(400, "unknown_filter", _("Unknown filter: %(name)s.") % {"name": name})
    code = model.error_codes.get(name, model.default_error_code)
    if first["type"] == "string_too_long":  # (r95: "not valid" did not say why)
        return ApiError(400, code, _("The value of %(name)s is too long: at most %(count)s characters.")
                        % {"name": name, "count": first.get("ctx", {}).get("max_length")})
    expected = _expected(model, name)
    if expected:
        return ApiError(400, code, _("The value of %(name)s is not valid; expected %(expected)s.")
                        % {"name": name, "expected": expected})
    return ApiError(400, code, _("The value of %(name)s is not valid.") % {"name": name})


def _expected(model: type[QuerySchema], name: str) -> str:
    """What a query parameter accepts, in words, from its declaration."""
    schema = model.model_json_schema().get("properties", {}).get(name, {})
    options = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    if not options:
        return ""
    option = options[0]
    if "enum" in option or "const" in option:
        return ", ".join(str(v) for v in option.get("enum", [option.get("const")]))
    if option.get("type") == "integer":
        # `minimum`/`maximum`, or `ge`/`le` where a validator wraps the number (lifecycle.api.Limit)
        low, high = option.get("minimum", option.get("ge")), option.get("maximum", option.get("le"))
        if low is not None and high is not None:
            return _("a whole number from %(low)s to %(high)s") % {"low": low, "high": high}
        return _("a whole number")
    return ""


def parse_body(request: HttpRequest, model: type[Schema]) -> Schema:
    value = read_json_body(request)
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_body", _("The request body must be a JSON object."))
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise _body_error(exc) from None


def parse_query(request: HttpRequest, model: type[QuerySchema]) -> QuerySchema:
    values: dict[str, str] = {}
    for key in request.GET:
        raw = request.GET.getlist(key)
        if len(raw) > 1:
            raise ApiError(400, model.error_codes.get(key, model.default_error_code),
                           _("%(name)s is given more than once.") % {"name": shown_name(key, 60)})
        values[key] = raw[0]
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise _query_error(exc, model) from None


# ---- Dispatch -----------------------------------------------------------------------------


def _csrf_refused(request: HttpRequest) -> bool:
    from django.middleware.csrf import CsrfViewMiddleware

    return CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {}) is not None


def _not_authenticated(request: HttpRequest) -> JsonResponse:
    """401. A token that was sent and is not valid (unknown, expired, revoked, its user
    deactivated) is said to be the cause, in the words and in `WWW-Authenticate` (RFC 6750
    section 3: error="invalid_token"), so a script tells it from a request that sent none (r153)."""
    if getattr(request, "token_auth", False):
        response = error(401, "not_authenticated", _(
            "The API token sent is not valid: it is unknown, expired or revoked, or its user was deactivated. "
            "Send a valid token."))
        response["WWW-Authenticate"] = 'Bearer realm="lethe", error="invalid_token"'
        return response
    response = error(401, "not_authenticated", _("Sign in or send an API token."))
    response["WWW-Authenticate"] = 'Bearer realm="lethe"'
    return response


def _answer(ep: Endpoint, result: Any) -> HttpResponse:
    if isinstance(result, HttpResponse):
        return result
    status, payload = result if isinstance(result, tuple) else (ep.default_status, result)
    if getattr(settings, "API_VALIDATE_RESPONSES", False):
        # Tests hold every answer to its declaration; a mismatch fails the test, never a 200.
        if status not in ep.responses:
            raise ResponseMismatch(f"{ep.method} {ep.path} answered undeclared status {status}")
        model = ep.responses[status]
        if model is not None:
            try:
                model.model_validate(payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload)
            except ValidationError as exc:
                raise ResponseMismatch(f"{ep.method} {ep.path} answered outside its schema: {exc}") from None
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    if payload is None:
        response = HttpResponse(status=status)
        del response["Content-Type"]  # no body, so no type (never text/html under the API)
        return response
    return JsonResponse(payload, status=status, safe=False, encoder=TextEncoder)


def _run(ep: Endpoint, request: HttpRequest, kwargs: dict[str, Any]) -> HttpResponse:
    if not ep.public and not request.user.is_authenticated:
        return _not_authenticated(request)
    if settings.ENGINE_URL and not ep.public and ep.path.startswith(ENGINE_PREFIX):
        # A console of a remote engine is no engine: its own tables hold no conversations, and a
        # delete sent past its bindings would bypass the bound delete that keeps the binding
        # until the engine's receipt. Every engine route says so, the same way.
        return error(421, "engine_remote", _(
            "This console's conversations are on its engine, not here: use the engine's own /v1/ API, "
            "or this console's /api/v1/bindings."))
    if ep.admin and not is_admin(request.user):
        return error(403, "forbidden", _("Only admins can change this."))
    if request.method not in SAFE_METHODS and not getattr(request, "token_auth", False) and _csrf_refused(request):
        return error(403, "csrf_failed", _("The form expired; reload the page and try again."))
    for header in ep.headers:
        value = request.headers.get(header.name)
        if not value and header.required:
            raise ApiError(400, header.code, _("The %(name)s header is required.") % {"name": header.name})
        if value is not None and (len(value) > header.max_length or not value.isprintable()
                                  or (header.pattern and not re.fullmatch(header.pattern, value))):
            raise ApiError(400, header.invalid_code, str(header.invalid_message) if header.invalid_message
                           else _("The %(name)s header is not valid.") % {"name": header.name})
    if ep.query is not None:
        kwargs["query"] = parse_query(request, ep.query)
    elif request.GET:
        name = shown_name(next(iter(request.GET)), 60)
        raise ApiError(400, "unknown_filter", _("Unknown filter: %(name)s.") % {"name": name})
    if ep.body is not None:
        kwargs["body"] = parse_body(request, ep.body)
    elif _has_body(request):
        parse_body(request, NoBody)  # strict like any body: `{}` passes, anything else is refused
    return _answer(ep, ep.view(request, **kwargs))


class NoBody(Schema):
    """The body of an endpoint that takes none, when a client sends one anyway."""


def _has_body(request: HttpRequest) -> bool:
    length = request.headers.get("Content-Length", "").strip()
    return "Transfer-Encoding" in request.headers or (length not in ("", "0"))


def _dispatcher(by_method: dict[str, Endpoint]) -> Callable:
    allowed = ", ".join(sorted({*by_method, *(["HEAD"] if "GET" in by_method else []), "OPTIONS"}))

    @csrf_exempt  # checked in _run for session requests; token requests carry no cookie
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        from lifecycle.errors import ActionRefused

        method = "GET" if request.method == "HEAD" else request.method
        ep = by_method.get(method)
        try:
            if ep is None:
                if not all(e.public for e in by_method.values()) and not request.user.is_authenticated:
                    return _not_authenticated(request)
                if request.method == "OPTIONS":  # what the path takes, and nothing else
                    response = HttpResponse(status=204)
                    del response["Content-Type"]
                else:
                    response = error(405, "method_not_allowed", _("This method is not allowed here."))
                response["Allow"] = allowed
                return response
            response = _run(ep, request, dict(kwargs))
        except ApiError as exc:
            response = error(exc.status, exc.code, exc.message, **exc.extra)
            for name, value in exc.headers.items():
                response[name] = value
        except ActionRefused as exc:
            response = error(exc.status, exc.code, exc.message, **getattr(exc, "extra", {}))
        except Http404:
            response = error(404, "not_found", _("Nothing with that id exists here."))
        except ResponseMismatch:
            raise
        except Exception as exc:
            from console.middleware import trouble_response

            response = trouble_response(request, exc)  # the database busy or full: 503
            if response is None:
                logger.exception("Unexpected error in %s %s", request.method, request.path)
                response = internal_error()
        if request.method == "HEAD":
            # No body, and the length the GET's body has (RFC 9110 8.6): emptying the content
            # alone made the length 0.
            length = len(response.content)
            response.content = b""
            response["Content-Length"] = str(length)
        return response

    return view


def internal_error() -> JsonResponse:
    # Not "nothing was changed": requests are not one transaction, and an error can come after
    # part of the request was stored (a close saved, then its answer failing to build).
    return error(500, "internal_error", _(
        "Something went wrong on our side. Part of the request may have been done: read the current "
        "state before you try again."))


@csrf_exempt  # an answer, not an action: a POST to no endpoint is 404 in JSON, not a CSRF page
def not_found(request: HttpRequest, unmatched: str = "") -> JsonResponse:
    """Any path under the API prefixes that names no endpoint."""
    return error(404, "not_found", _("There is nothing at this address."))


def urlpatterns() -> list[URLPattern]:
    grouped: dict[str, dict[str, Endpoint]] = {}
    for ep in ENDPOINTS:
        methods = grouped.setdefault(ep.path, {})
        if ep.method in methods:
            raise ValueError(f"{ep.method} {ep.path} is declared twice")
        methods[ep.method] = ep
    patterns = []
    for route, by_method in grouped.items():
        first = next(iter(by_method.values()))
        django_route = route.lstrip("/")
        for name in first.path_params:
            converter = {int: "int", AnyText: "anytext"}.get(first.param_type(name), "str")
            django_route = django_route.replace(f"{{{name}}}", f"<{converter}:{name}>")
        patterns.append(path(django_route, _dispatcher(by_method), name=first.name))
    return patterns


# ---- The OpenAPI document -----------------------------------------------------------------


def _schema_of(model: type[BaseModel], refs: dict) -> dict[str, Any]:
    return refs[(model, "validation")]


# Bounds pydantic leaves under its own names when a constraint sits beside a validator of ours
# (WholeNumber): JSON Schema's names, so tools read the limits the server enforces.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _json_schema_bounds(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {_BOUNDS.get(k, k) if isinstance(v, (int, float)) else k: _json_schema_bounds(v)
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_json_schema_bounds(v) for v in schema]
    return schema


def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [ErrorOut]
    for ep in ENDPOINTS:
        models += [m for m in (ep.body, *ep.responses.values()) if m is not None]
    unique = list(dict.fromkeys(models))
    refs, definitions = models_json_schema(
        [(m, "validation") for m in unique], ref_template="#/components/schemas/{model}"
    )
    definitions = _json_schema_bounds(definitions)
    error_ref = _schema_of(ErrorOut, refs)
    paths: dict[str, dict[str, Any]] = {}
    for ep in ENDPOINTS:
        parameters: list[dict[str, Any]] = [
            {"name": p, "in": "path", "required": True,
             "schema": {"type": "integer", "minimum": 0} if ep.param_type(p) is int else {"type": "string"}}
            for p in ep.path_params
        ]
        if ep.query is not None:
            query_schema = _json_schema_bounds(ep.query.model_json_schema())
            for pname, pschema in query_schema.get("properties", {}).items():
                parameters.append({
                    "name": pname, "in": "query", "required": pname in query_schema.get("required", []),
                    "schema": {k: v for k, v in pschema.items() if k != "title"},
                    **({"description": pschema["description"]} if "description" in pschema else {}),
                })
        for header in ep.headers:
            parameters.append({"name": header.name, "in": "header", "required": header.required,
                               "description": header.description,
                               "schema": {"type": "string", "minLength": 1, "maxLength": header.max_length,
                                          **({"pattern": header.pattern} if header.pattern else {})}})
        responses: dict[str, Any] = {}
        for status, model in ep.responses.items():
            entry: dict[str, Any] = {"description": "OK" if status < 300 else str(status),
                                     "headers": _answer_headers(status)}
            if model is not None:
                entry["content"] = {"application/json": {"schema": _schema_of(model, refs)}}
            responses[str(status)] = entry
        # What any request can be answered, whatever the operation: 400 (a query parameter it
        # does not take, a NUL in the address, a body it cannot read), 411/413/415 (a body, on
        # a GET too), 429 (too many unknown bearer tokens from one address, a public operation's
        # too when one is sent), the web worker's own 408, 414 and 431 (ops/gunicorn_worker.py),
        # and 503 when the database is too busy to answer in time or full (console/busy.py).
        statuses = set(ep.errors) | ALWAYS_POSSIBLE
        if ep.path_params:
            statuses.add(404)
        if not ep.public:
            statuses.add(401)
            if ep.path.startswith(ENGINE_PREFIX):
                statuses.add(421)
        if ep.admin or ep.method not in SAFE_METHODS:
            statuses.add(403)
        for status in sorted(statuses):
            responses[str(status)] = {
                "description": _ERROR_DESCRIPTIONS.get(status, "Refused"),
                "headers": _answer_headers(status),
                "content": {"application/json": {"schema": error_ref}},
            }
        operation: dict[str, Any] = {
            "operationId": ep.name,
            "summary": ep.summary or ep.name.replace("_", " ").capitalize(),
            "responses": responses,
        }
        if ep.description:
            operation["description"] = ep.description
        if parameters:
            operation["parameters"] = parameters
        if ep.body is not None:
            operation["requestBody"] = {
                "required": True, "content": {"application/json": {"schema": _schema_of(ep.body, refs)}},
            }
        if ep.public:
            operation["security"] = []
        paths.setdefault(ep.path, {})[ep.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Lethe API",
            "version": "1",
            "description": "Engine API (/v1/) and console API (/api/v1/). Errors are {code, message}. Types are "
                           "exact: a field of type integer takes a number written without a fraction or an "
                           "exponent (1, not 1.0 or 1e0: 400 invalid_type), a string never a number.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "headers": _HEADERS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "A token from `manage.py create_api_token <user>`."},
                "session": {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME,
                            "description": "A signed-in browser session; unsafe methods need the CSRF token."},
            },
        },
        "security": [{"bearer": []}, {"session": []}],
    }


ALWAYS_POSSIBLE = frozenset({400, 408, 411, 413, 414, 415, 429, 431, 503})

# The answer headers a client reads, declared (r153: none was, so a generated client could not
# read Retry-After, and a schema check could not hold the answers to them).
_HEADERS = {
    "RequestId": {"description": "The request's id: the caller's X-Request-ID when it is sane (1 to 128 letters, "
                                 "digits and ._:/+=-, starting with a letter or digit), else a new one; in the logs.",
                  "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 128}},
    "RetryAfter": {"description": "Seconds to wait before trying again.",
                   "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "WWWAuthenticate": {"description": 'Bearer realm="lethe"; with error="invalid_token" when the token sent is '
                                       "unknown, expired or revoked, or its user deactivated.",
                        "required": True, "schema": {"type": "string"}},
}


def _answer_headers(status: int) -> dict[str, Any]:
    headers: dict[str, Any] = {"X-Request-ID": {"$ref": "#/components/headers/RequestId"}}
    if status == 401:
        headers["WWW-Authenticate"] = {"$ref": "#/components/headers/WWWAuthenticate"}
    if status == 429:  # always given
        headers["Retry-After"] = {**_HEADERS["RetryAfter"], "required": True}
    elif status == 503:  # where the wait is known
        headers["Retry-After"] = {"$ref": "#/components/headers/RetryAfter"}
    return headers

_ERROR_DESCRIPTIONS = {
    400: "The request is not valid; nothing changed.",
    401: "Not signed in and no valid API token.",
    403: "Not allowed (members are read-only), or the CSRF check failed.",
    404: "Nothing with that id exists here.",
    408: "The request did not arrive in full within the time the web server allows (WEB_READ_TIMEOUT).",
    409: "Refused in the current state (stale revision, busy, being deleted...).",
    410: "Gone for good: the details the tool payload cleanup removed (tool_details_removed), or the content of "
         "a conversation being deleted or deleted (conversation_deletion_pending).",
    411: "A body was sent without a Content-Length (chunked); send its length.",
    413: "The request body is too large.",
    414: "The request line (method, path and query) is longer than the web server accepts.",
    415: "The body must be application/json in UTF-8 (unsupported_media_type), not compressed "
         "(unsupported_content_encoding).",
    421: "This is a console of a remote engine (ENGINE_URL): the engine API is the engine's.",
    422: "The request conflicts with an earlier one (e.g. an operation key reused).",
    429: "Too many requests with an unknown API token from this address; see Retry-After.",
    431: "The request's headers are larger or more numerous than the web server accepts.",
    503: "Not available right now: the database was too busy to answer in time (database_busy), its "
         "disk is full (database_full) or it cannot be reached or takes no writes (database_unavailable), the web server was reading as many requests as it holds "
         "(server_busy), or the engine could not be reached; see Retry-After where given.",
}


@functools.cache
def cached_openapi_document() -> str:
    return json.dumps(openapi_document(), separators=(",", ":"), sort_keys=False)
