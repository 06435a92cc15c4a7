"""gunicorn's worker for `manage.py serve`: the threaded worker (gthread), except that a
request gunicorn refuses itself, before Lethe sees it (a request line or a header over its
limits, a malformed request line or header), is answered with Lethe's JSON error document
(`{"code", "message"}`, as everything under /v1/ and /api/v1/ answers) instead of gunicorn's
HTML page. Such a request's path and language are not known (it was not read), so the answer
is the same for every path, in English. Errors that are the application's or the
configuration's own are left to gunicorn (a 500).

Loaded by the gunicorn master before Django: it imports gunicorn and the standard library only.
"""

from __future__ import annotations

import json

from gunicorn import util
from gunicorn.http import errors
from gunicorn.workers.gthread import ThreadWorker

# (exception, status, reason phrase, code, message), the first that matches; any other
# parse error is a 400. Written for Lethe; gunicorn's own table answers the rest.
_REFUSALS = (
    (errors.LimitRequestLine, 414, "URI Too Long", "request_line_too_long",
     "The request line (method, path and query) is longer than this server accepts."),
    (errors.LimitRequestHeaders, 431, "Request Header Fields Too Large", "headers_too_large",
     "The request's headers are larger or more numerous than this server accepts."),
    (errors.UnsupportedTransferCoding, 501, "Not Implemented", "unsupported_transfer_coding",
     "The request's Transfer-Encoding is not supported."),
    (errors.ExpectationFailed, 417, "Expectation Failed", "expectation_failed",
     "The request's Expect header cannot be met."),
    (errors.ForbiddenProxyRequest, 403, "Forbidden", "forbidden",
     "Requests through this proxy are not accepted."),
)
# Not the client's fault: gunicorn answers these itself (500).
_LEFT_TO_GUNICORN = (errors.InvalidResponseHeader, errors.InvalidResponseHeaderName, errors.ConfigurationProblem)


def refusal(exc: BaseException) -> tuple[int, str, str, str] | None:
    """(status, reason, code, message) for a request gunicorn could not take, or None."""
    if not isinstance(exc, errors.ParseException) or isinstance(exc, _LEFT_TO_GUNICORN):
        return None
    for kind, status, reason, code, message in _REFUSALS:
        if isinstance(exc, kind):
            return status, reason, code, message
    return 400, "Bad Request", "malformed_request", "The request could not be read: it is not valid HTTP."


def json_error(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"code": code, "message": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n\r\n")
    return head.encode("latin-1") + body


class JsonErrorThreadWorker(ThreadWorker):
    def handle_error(self, req, client, addr, exc):
        answer = refusal(exc)
        if answer is None:
            return super().handle_error(req, client, addr, exc)
        ip = addr[0] if addr else ""
        # The kind of refusal only: the exception's text quotes the request line or a header,
        # which may carry a token or content (logs carry neither).
        self.log.warning("Invalid request from ip=%s: %s", ip, type(exc).__name__)
        try:
            util.write_nonblock(client, json_error(*answer))
        except Exception:  # the client went away; nothing to answer
            self.log.debug("Failed to send error message.")
        return None
