"""gunicorn's worker for `manage.py serve`: the threaded worker (gthread), except that a
request gunicorn refuses itself, before Lethe sees it (a request line or a header over its
limits, a malformed request line or header), is answered with Lethe's JSON error document
(`{"code", "message"}`, as everything under /v1/ and /api/v1/ answers) instead of gunicorn's
HTML page; a browser loading a page (`Sec-Fetch-Dest: document`) gets a page of its own with
the same words and a link back instead (`page_error`). Such a request's path may not be known
(it was not read), so the answer is the same for every path. Its message is in the language Django would choose for the request (the
language cookie, then Accept-Language, then LANGUAGE_CODE; Django's own reading of them), from
the complete Cookie and Accept-Language lines among the bytes received: those of the whole head
once it is in (a body too large, a timeout or a busy worker while the body comes, a refusal
the parser raises), those that came before the refusal of a head unfinished or unparseable (too
long, a bare LF, a timeout); with none, LANGUAGE_CODE. Content-Language names it, as in Django's
answers. Bounded, since the bytes are the client's: at most limit_request_fields such lines,
the first 16 KiB of each header. Errors that are the application's or the configuration's own
are left to gunicorn (a 500).

Slow clients do not hold a thread. gunicorn's threaded worker hands a connection to a thread
as soon as its first byte arrives, and the thread then waits on the socket for the rest of the
request; a few clients sending a byte a second held every thread. Here the main loop reads each
request's head and body (up to the largest body Lethe accepts) without blocking, and a thread
gets the request only once it is all in memory, or once nothing more is needed to answer it: a
head that cannot be accepted, a body Lethe does not read. The thread's parser reads only those
bytes, never the socket, so it cannot wait on a client. A connection that has not delivered its
request within WEB_READ_TIMEOUT seconds (default 30) is answered 408 `request_timeout` and
closed. Refused in the main loop: a request line that grows past its limit (414
`request_line_too_long`; the rest of the line is dropped as it comes, and the answer waits for
the header lines after it, up to the head's blank line or 2 s, since a browser's page load and
languages are read from them), and at once a head past the largest the parser accepts (431
`headers_too_large`) before its blank line comes; a line ended by a bare LF (the parser's 400);
a body announced larger than anything Lethe accepts (the larger of API_MAX_BODY_BYTES and
Django's DATA_UPLOAD_MAX_MEMORY_SIZE for forms, or a Content-Length of more than 18 digits),
413 `body_too_large` before it is read. The requests a worker is reading hold at most
WEB_READ_BUFFER_BYTES (default 64 MiB; a request counts with its whole announced body): one
that would pass it while others hold bytes is answered 503 `server_busy` with Retry-After and
closed (alone, a request of any accepted size is read). `Expect: 100-continue` is answered by
the main loop when it waits for the body, once, and to HTTP/1.1 requests only (RFC 9110
section 10.1.1). A body the application did not read (a chunked one, which Lethe never reads)
is not drained: the connection closes after the answer. Closing lingers in the main loop too
(for the client's last bytes, up to 2 s), not in a thread. TLS or HTTP/2 connections served by
gunicorn itself (serve configures neither: a reverse proxy terminates TLS) keep gunicorn's own
reading.

Slow readers do not hold a thread for ever either: a thread writing an answer gives up once
the client has taken none of it for WEB_WRITE_TIMEOUT seconds (default 30; a client taking a
large answer slowly but steadily gets all of it), logs it and closes the connection. Without it a client that asked for a large answer
(a page of items with big payloads) and did not read it kept that thread until the connection
died.

The reading overrides parts of gunicorn's threaded worker that are not its public interface
(`enqueue_req`, `finish_request`, `_keepalive_after`, `murder_pending`, the parser's unreader
and its limits, the request's `_expected_100_continue`): written against gunicorn 27.0.1, the
locked version; recheck them when the lock moves it (tests/test_app_server.py drives them with
real slow clients).

Loaded by the gunicorn master before Django: it imports gunicorn and the standard library only
(Django's settings and translations are read in the worker, once a request needs them; the
messages are marked with a gettext_noop of this module's own, which makemessages finds, and
translated when answered).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import selectors
import socket
import threading
import time
from functools import partial

from gunicorn import util
from gunicorn.http import errors
from gunicorn.http.body import LengthReader
from gunicorn.http.message import MAX_HEADERS, MAX_REQUEST_LINE
from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import _DEFER, STOP_KEEPALIVE_LINGER, ThreadWorker


def gettext_noop(message: str) -> str:
    """Marks a message for makemessages, as Django's own (which would import Django in the
    master); it is translated when a request is answered with it (`localized`)."""
    return message

# (exception, status, reason phrase, code, message), the first that matches; any other
# parse error is a 400. Written for Lethe; gunicorn's own table answers the rest.
_REFUSALS = (
    (errors.LimitRequestLine, 414, "URI Too Long", "request_line_too_long",
     gettext_noop("The request line (method, path and query) is longer than this server accepts.")),
    (errors.LimitRequestHeaders, 431, "Request Header Fields Too Large", "headers_too_large",
     gettext_noop("The request's headers are larger or more numerous than this server accepts.")),
    (errors.UnsupportedTransferCoding, 501, "Not Implemented", "unsupported_transfer_coding",
     gettext_noop("The request's Transfer-Encoding is not supported.")),
    (errors.ExpectationFailed, 417, "Expectation Failed", "expectation_failed",
     gettext_noop("The request's Expect header cannot be met.")),
    (errors.ForbiddenProxyRequest, 403, "Forbidden", "forbidden",
     gettext_noop("Requests through this proxy are not accepted.")),
)
# Not the client's fault: gunicorn answers these itself (500).
_LEFT_TO_GUNICORN = (errors.InvalidResponseHeader, errors.InvalidResponseHeaderName, errors.ConfigurationProblem)
_MALFORMED = gettext_noop("The request could not be read: it is not valid HTTP.")


def refusal(exc: BaseException) -> tuple[int, str, str, str] | None:
    """(status, reason, code, message) for a request gunicorn could not take, or None."""
    if not isinstance(exc, errors.ParseException) or isinstance(exc, _LEFT_TO_GUNICORN):
        return None
    for kind, status, reason, code, message in _REFUSALS:
        if isinstance(exc, kind):
            return status, reason, code, message
    return 400, "Bad Request", "malformed_request", _MALFORMED


def refusal_of(kind: type[errors.ParseException]) -> tuple[int, str, str, str]:
    """(status, reason, code, message) of the table's row for one kind of parse error."""
    return next(row[1:] for row in _REFUSALS if row[0] is kind)


# What every answer of the console carries (Django's security middleware and Lethe's request
# middleware), this server's own refusals too (r153: they had none of it, nor the request id).
_SAFETY_HEADERS = ("X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: same-origin\r\n"
                   "Cross-Origin-Opener-Policy: same-origin\r\n")
# The caller's request id, in a complete header line of the request read so far
# (One greedy run and no lazy one: r154, a line of spaces ending in a bare CR took the lazy form
# quadratic time, 1.3 s a line, in the worker's main loop; the blanks are stripped after.)
_REQUEST_ID_LINE = re.compile(rb"\nx-request-id:([^\r\n]*)\r?(?=\n)", re.IGNORECASE)


def request_id_of(data=b"", end: int = -1) -> str:
    """The request's X-Request-ID when its head so far holds a sane one, else a new id (as the
    request middleware answers: ops.context.sane_request_id)."""
    from ops.context import sane_request_id

    found = _REQUEST_ID_LINE.search(data, 0, _head_stop(data, end))
    return sane_request_id(found[1].strip(b" \t")[:200].decode("latin-1") if found else None)


def json_error(status: int, reason: str, code: str, message: str, retry_after: int | None = None,
               language: str | None = None, request_id: str | None = None) -> bytes:
    """The whole answer: `message` as given (`localized` translates it), in `language` if named.
    Its text as it is, in UTF-8, as every JSON answer of the API (r153: escaped as \\uXXXX)."""
    from ops.context import sane_request_id

    body = json.dumps({"code": code, "message": message}, ensure_ascii=False).encode()
    retry = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    content_language = f"Content-Language: {language}\r\n" if language else ""
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n{content_language}{retry}"
            f"Content-Security-Policy: default-src 'none'; frame-ancestors 'none'\r\n{_SAFETY_HEADERS}"
            f"X-Request-ID: {request_id or sane_request_id(None)}\r\n\r\n")
    return head.encode("latin-1") + body


# A complete header line (one a line end follows) naming the cookies or the accepted languages.
# Anchored on the line end before it, so the request line never counts.
_LANGUAGE_LINE = re.compile(rb"\n(cookie|accept-language):([^\r\n]*)\r?(?=\n)", re.IGNORECASE)
# The most of each header's value read for the language: Django reads only the first 500
# characters of Accept-Language, and a browser's cookies fit in one line of gunicorn's 8,190
# bytes; more would only make a refusal slow to answer.
_LANGUAGE_HEADER_BYTES = 16384


def _head_stop(data, end: int) -> int:
    """Where the head of a request whose bytes so far are `data` stops for reading its header
    lines: after the blank line at `end` when it has come (the last line's CRLF included), and
    never past the first empty line, whichever line end it has (a bare LF's head ends there, and
    what follows is the next pipelined request's, not this one's)."""
    stop = end + 2 if end >= 0 else len(data)
    for blank in (b"\n\n", b"\n\r\n"):
        if (at := data.find(blank, 0, stop)) >= 0:
            stop = min(stop, at + 1)
    return stop


# Browsers say a request loads a page with this header (and only browsers send it).
_PAGE_LOAD = re.compile(rb"\nsec-fetch-dest:[ \t]*document[ \t]*\r?\n", re.IGNORECASE)


def loads_a_page(data, end: int = -1) -> bool:
    """Whether the request is a browser loading a page (a form sent, a link followed, an address
    typed) from its complete header lines: it is answered with a page, not the JSON document a
    program reads (r82: a search too long for the request line showed the raw JSON, its Spanish
    letters escaped)."""
    return _PAGE_LOAD.search(data, 0, _head_stop(data, end)) is not None


def language_headers(data, end: int = -1, fields: int = 100) -> tuple[bytes, bytes]:
    """(Cookie, Accept-Language) of a request whose bytes so far are `data`, from its complete
    header lines (up to the head's blank line at `end`, when it has come), empty when absent.
    Repeated lines are joined with a comma, as gunicorn hands them to Django. Bounded, since the
    bytes are the client's: at most `fields` such lines are read, and each header's first 16 KiB
    (the cookies cut after the last whole one)."""
    found: dict[bytes, list[bytes]] = {b"cookie": [], b"accept-language": []}
    for lines, match in enumerate(_LANGUAGE_LINE.finditer(data, 0, _head_stop(data, end))):
        if lines >= fields:
            break
        found[match[1].lower()].append(match[2].strip(b" \t"))
    cookie, accept = (b",".join(found[name]) for name in (b"cookie", b"accept-language"))
    if len(cookie) > _LANGUAGE_HEADER_BYTES:
        cookie = cookie[:max(0, cookie.rfind(b";", 0, _LANGUAGE_HEADER_BYTES))]
    return cookie, accept[:_LANGUAGE_HEADER_BYTES]


def request_language(cookie: bytes, accept: bytes) -> str:
    """The language Django's LocaleMiddleware would choose for a request with these headers:
    the language cookie, then Accept-Language, then LANGUAGE_CODE (Django's own reading; the
    worker has loaded Django by the time a request is answered)."""
    from django.http import HttpRequest
    from django.http.cookie import parse_cookie
    from django.utils import translation

    request = HttpRequest()
    # Decoded as Django decodes them from gunicorn's environ: cookies as UTF-8 with
    # replacements, other headers as latin-1.
    request.COOKIES = parse_cookie(cookie.decode("utf-8", "replace"))
    request.META["HTTP_ACCEPT_LANGUAGE"] = accept.decode("latin-1")
    return translation.get_language_from_request(request)


def localized(row: tuple[int, str, str, str], data=b"", end: int = -1, fields: int = 100,
              retry_after: int | None = None) -> bytes:
    """The answer of one refusal (status, reason, code, message) to the request whose bytes so
    far are `data`, its message in that request's language (`language_headers`)."""
    from django.utils import translation

    status, reason, code, message = row
    language = request_language(*language_headers(data, end, fields))
    with translation.override(language):
        request_id = request_id_of(data, end)
        if loads_a_page(data, end):
            return page_error(status, reason, translation.gettext(_PAGE_TITLE), translation.gettext(message),
                              translation.gettext(_PAGE_BACK), retry_after, language, request_id)
        return json_error(status, reason, code, translation.gettext(message), retry_after, language, request_id)


# The page's own look, allowed by its hash alone (no other style, no script, nothing loaded):
# readable on a phone, its link a 44 px target.
_PAGE_STYLE = ("body{font:16px/1.5 system-ui,sans-serif;margin:0 auto;padding:24px 16px;max-width:40rem;"
               "color:#1b1f24;background:#fff}h1{font-size:1.375rem;line-height:1.3}"
               "a{display:inline-flex;align-items:center;min-height:44px;padding:0 16px;border:1px solid #8a8f98;"
               "border-radius:8px;color:inherit;text-decoration:none}a:focus-visible{outline:3px solid #2563eb}")
_PAGE_STYLE_HASH = base64.b64encode(hashlib.sha256(_PAGE_STYLE.encode()).digest()).decode()
_PAGE_TITLE = gettext_noop("Lethe could not take this request")
_PAGE_BACK = gettext_noop("Back to Lethe")


def page_error(status: int, reason: str, title: str, message: str, back: str, retry_after: int | None = None,
               language: str = "en", request_id: str | None = None) -> bytes:
    """The whole answer as a page for a browser: the refusal's words and a way back, nothing else
    (no script, nothing loaded: the policy allows only its own style, by its hash)."""
    from html import escape

    from ops.context import sane_request_id

    body = (f'<!DOCTYPE html>\n<html lang="{escape(language)}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title>'
            f'<style>{_PAGE_STYLE}</style></head>'
            # its words in the page's main landmark (r105: axe found them loose in the body)
            f'<body><main><h1>{escape(title)}</h1><p>{escape(message)}</p><p><a href="/">{escape(back)}</a></p>'
            '</main></body></html>\n'
            ).encode()
    retry = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: text/html; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nContent-Language: {language}\r\n"
            f"Content-Security-Policy: default-src 'none'; style-src 'sha256-{_PAGE_STYLE_HASH}'; "
            f"frame-ancestors 'none'\r\n{_SAFETY_HEADERS}X-Request-ID: {request_id or sane_request_id(None)}\r\n"
            f"{retry}\r\n")
    return head.encode("latin-1") + body


_TIMED_OUT = (408, "Request Timeout", "request_timeout",
              gettext_noop("The request did not arrive in full within the time this server allows."))
_TOO_LARGE = (413, "Content Too Large", "body_too_large", gettext_noop("The request body is too large."))
_BUSY = (503, "Service Unavailable", "server_busy",
         gettext_noop("The server is holding as many incoming requests as it can; try again shortly."))
_BUSY_RETRY_AFTER = 5  # seconds, as a database_busy answer (console/busy.py)
# How long a request line refused as too long waits for the header lines after it (the answer,
# a page or the JSON document and its language, is chosen from them)
_HEADERS_AFTER_REFUSAL_SECONDS = 2.0
# A Content-Length of more digits than 18 is larger than anything Lethe accepts (and than int()
# takes from a string of over 4,300 digits): this stands for it.
_UNCOUNTABLE = 10**18
# How long a closed connection is read for the client's last bytes (so closing does not reset
# the answer away), and how much of them at most: gunicorn's own figures.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 65536


def read_timeout() -> float:
    """WEB_READ_TIMEOUT: the seconds a connection has to deliver a request's head and body
    (serve hands it over as the settings checked it; unset, 30)."""
    raw = os.environ.get("WEB_READ_TIMEOUT", "").strip()
    return float(int(raw)) if raw else 30.0


def write_timeout() -> float:
    """WEB_WRITE_TIMEOUT: the seconds a client has to take an answer, whole (serve hands it over
    as the settings checked it; unset, 30)."""
    raw = os.environ.get("WEB_WRITE_TIMEOUT", "").strip()
    return float(int(raw)) if raw else 30.0


def read_buffer_bytes() -> int:
    """WEB_READ_BUFFER_BYTES: the bytes a worker holds at most for the requests it is still
    reading (serve hands it over as the settings checked it; unset, 64 MiB)."""
    raw = os.environ.get("WEB_READ_BUFFER_BYTES", "").strip()
    return int(raw) if raw else 64 * 1024 * 1024


def framing(head: bytes) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked or another transfer coding, Expect: 100-continue to be answered)
    from a request head, as far as the main loop needs them to know when the request is complete.
    A length that is not one plain number (or is given twice) is None: the parser refuses the
    request. A length of more than 18 digits (leading zeros aside) is _UNCOUNTABLE, larger than
    any body Lethe accepts. An expectation counts only in an HTTP/1.1 request: RFC 9110 section
    10.1.1 has a server ignore it from HTTP/1.0."""
    length: int | None = None
    lengths = 0
    coded = expect = False
    lines = head.split(b"\r\n")
    if not lines[0]:  # the one empty line RFC 9112 section 2.2 lets come before the request line
        del lines[0]
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            lengths += 1
            if not value.isdigit():
                length = None
            elif len(digits := value.lstrip(b"0")) > 18:
                length = _UNCOUNTABLE
            else:
                length = int(digits or b"0")
        elif name == b"transfer-encoding":
            coded = True
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    expect = expect and bool(lines) and lines[0].endswith(b" HTTP/1.1")
    return (length if lengths == 1 else None), coded, expect


def bare_lf(data, start: int = 0) -> bool:
    """Whether a line of `data` from `start` on ends with a bare LF (without its CR)."""
    at = data.find(b"\n", start)
    while at >= 0:
        if at == 0 or data[at - 1] != 0x0D:
            return True
        at = data.find(b"\n", at + 1)
    return False


def _ip(conn) -> str:
    return conn.client[0] if isinstance(conn.client, tuple) and conn.client else ""


class _Reading:
    """A request the main loop is reading: its bytes so far, its deadline, how far its head has
    been searched, what its head says once complete, and the bytes it counts against the
    worker's budget."""

    __slots__ = ("charge", "continued", "data", "deadline", "end", "framing", "refused", "scanned", "skipping")

    def __init__(self, data: bytes, deadline: float) -> None:
        self.data = bytearray(data)
        self.deadline = deadline
        self.continued = False
        self.scanned = 0  # the head's end and bare LFs are looked for from here on
        self.end = -1  # where the head's blank line starts, once found
        self.framing: tuple[int | None, bool, bool] = (None, False, False)
        self.charge = 0
        # A request line refused as too long, answered once its header lines are in: the
        # refusal, and whether the rest of the line (not kept) is still coming
        self.refused: tuple[int, str, str, str] | None = None
        self.skipping = False


class _ProgressSocket(socket.socket):
    """A connection whose `sendall` gives up only when the client has taken nothing for the
    socket's timeout. Python's own `sendall` counts the timeout for the whole answer, so a
    client reading a large one steadily over a slow link was cut off part-way. Each `send`
    here waits at most the timeout for room, then sends what fits; the layout is the plain
    socket's (no new fields), so a connection's class can be switched to it."""

    __slots__ = ()

    def sendall(self, data, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            sent = self.send(view, flags)
            view = view[sent:]


def _no_more_bytes(_size_hint=None) -> bytes:
    """A thread's parser reads only what the main loop handed it: past that, the end."""
    return b""


class JsonErrorThreadWorker(ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout()
        self.write_timeout = write_timeout()
        self.read_budget = read_buffer_bytes()
        self.held = 0  # the bytes counted against read_budget: the sum of the readings' charges
        self.reading: dict = {}  # connection -> _Reading
        self.lingering: dict = {}  # socket -> [deadline, bytes read]
        self._body_limit: int | None = None
        self._stopping_since: float | None = None
        # The longest request line and head the parser may accept (gunicorn's reading of its
        # settings); past them it refuses what it holds.
        cfg = self.cfg
        line = cfg.limit_request_line
        self.line_limit = MAX_REQUEST_LINE if line < 0 or line >= MAX_REQUEST_LINE else line  # 0: none
        self.max_head = cfg.limit_request_line + 4 + cfg.limit_request_fields * (cfg.limit_request_field_size + 2) + 4
        fields = cfg.limit_request_fields
        self.max_fields = fields if 0 < fields <= MAX_HEADERS else MAX_HEADERS  # the parser's reading
        # The head of the request a thread is handling, for the language of a refusal its parser raises
        self.handling = threading.local()

    def body_limit(self) -> int:
        if self._body_limit is None:
            from django.conf import settings  # the application is loaded by now

            self._body_limit = max(settings.API_MAX_BODY_BYTES, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
        return self._body_limit

    def _own_reading(self, conn) -> bool:
        return not (self.cfg.is_ssl or conn.is_http2 or negotiation.prior_knowledge_allowed(self.cfg, conn.client)
                    or negotiation.upgrade_allowed(self.cfg, conn.client))

    def refusal_answer(self, row: tuple[int, str, str, str], data=b"", end: int = -1,
                       retry_after: int | None = None) -> bytes:
        """`localized`, or the message as written if that fails: a refusal is always answered. To
        a HEAD request, without its body (RFC 9110 section 9.3.2: r75)."""
        try:
            answer = localized(row, data, end, self.max_fields, retry_after)
        except Exception:
            self.log.exception("Could not localize the answer %s", row[2])
            answer = json_error(*row, retry_after=retry_after)
        if bytes(data[:64]).lstrip(b"\r\n")[:5] == b"HEAD ":  # (empty lines before a request line are skipped)
            answer = answer[:answer.index(b"\r\n\r\n") + 4]
        return answer

    # ---- reading in the main loop

    def enqueue_req(self, conn):
        """A new connection, a kept-alive one that became readable, or one holding its next
        request: read the request here; a thread gets it once it is complete."""
        if not self._own_reading(conn):
            return super().enqueue_req(conn)
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        state = _Reading(held, time.monotonic() + self.read_timeout)
        self.reading[conn] = state
        if not self._advance(conn, state, registered=False):
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_request_bytes, conn))
        return None

    def _on_request_bytes(self, conn, _sock):
        state = self.reading.get(conn)
        if state is None:
            return
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._drop_reading(conn)
            return
        state.data += data
        try:
            self._advance(conn, state, registered=True)
        except Exception:  # the main loop must go on: this connection alone is lost
            self.log.exception("Error reading a request")
            if conn in self.reading:
                self._drop_reading(conn)

    def _advance(self, conn, state: _Reading, registered: bool) -> bool:
        """Hand the request to a thread, or refuse it, once that can be decided; True then."""
        if state.refused is not None:
            return self._advance_refused(conn, state, registered)
        data = state.data
        if state.end < 0:
            state.end = data.find(b"\r\n\r\n", max(0, state.scanned - 3))
            if state.end < 0:
                return self._advance_head(conn, state, registered)
            state.framing = framing(bytes(data[:state.end]))
        length, coded, expect = state.framing
        if coded or length is None:
            # No body to wait for: none announced, or one Lethe never reads (chunked, or of
            # unknown length): the parser refuses what is malformed, the application answers the
            # rest, and the connection closes after an unread body.
            self._hand_over(conn, state, registered)
            return True
        if length > self.body_limit():
            self.log.warning("Request from ip=%s refused: its body is larger than accepted", _ip(conn))
            self._drop_reading(conn, self.refusal_answer(_TOO_LARGE, data, state.end), registered)
            return True
        whole = state.end + 4 + length
        if len(data) >= whole:
            self._hand_over(conn, state, registered)
            return True
        if not self._charge(conn, state, whole, registered):
            return True
        if expect and not state.continued:
            state.continued = True
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        return False

    def _advance_head(self, conn, state: _Reading, registered: bool) -> bool:
        """A head still without its blank line: refused at once if it cannot become a request
        the parser accepts, or counted against the budget while it grows."""
        data = state.data
        if bare_lf(data, state.scanned):
            # A line ended with a bare LF: the parser refuses it (400) from the bytes it holds.
            self._hand_over(conn, state, registered)
            return True
        state.scanned = len(data)
        start = 2 if data[:2] == b"\r\n" else 0  # the one empty line allowed before it
        line_end = data.find(b"\r\n", start)
        line = (line_end if line_end >= 0 else len(data) - 2) - start
        if self.line_limit and line > self.line_limit:
            self.log.warning("Invalid request from ip=%s: %s", _ip(conn), errors.LimitRequestLine.__name__)
            # Refused, but answered once the header lines after it are in (or shortly): a
            # browser's Sec-Fetch-Dest and languages come after the line, in later packets on a
            # real network, and the answer is chosen from them (r84: raw JSON, in English, to a
            # browser whose long request line came in several packets). Only the line's first
            # bytes are kept (a HEAD is told from them); the rest of it is dropped as it comes.
            state.refused = refusal_of(errors.LimitRequestLine)
            state.data = bytearray(data[start:start + 64].split(b"\r")[0] + b"\r\n")
            state.skipping = line_end < 0
            state.data += data[line_end + 2:] if line_end >= 0 else b""
            state.scanned = 0 if line_end >= 0 else len(state.data)
            state.deadline = min(state.deadline, time.monotonic() + _HEADERS_AFTER_REFUSAL_SECONDS)
            return self._advance_refused(conn, state, registered)
        if len(data) > self.max_head:
            too_long = errors.LimitRequestHeaders
        else:
            return not self._charge(conn, state, len(data), registered)
        # As the parser would refuse it, without a thread waiting for more in recv()
        self.log.warning("Invalid request from ip=%s: %s", _ip(conn), too_long.__name__)
        self._drop_reading(conn, self.refusal_answer(refusal_of(too_long), data), registered)
        return True

    def _advance_refused(self, conn, state: _Reading, registered: bool) -> bool:
        """A request line refused as too long: drop the rest of the line as it comes, keep the
        header lines after it, and answer once the head's blank line is in or the head would
        pass its largest size (the read deadline, shortened, answers it too: murder_pending)."""
        data = state.data
        if state.skipping:
            line_end = data.find(b"\n", state.scanned)
            if line_end < 0:
                del data[state.scanned:]
                return False
            del data[state.scanned:line_end + 1]
            state.skipping = False
        state.scanned = len(data)
        # (searched whole: the head kept is at most max_head bytes, and answering ends it)
        end = data.find(b"\r\n\r\n")
        if end < 0 and data.find(b"\n\n") < 0 and len(data) <= self.max_head:
            return not self._charge(conn, state, len(data), registered)
        self._drop_reading(conn, self.refusal_answer(state.refused, data, end), registered)
        return True

    def _charge(self, conn, state: _Reading, size: int, registered: bool) -> bool:
        """Count `size` bytes for this request against the worker's budget (its whole request
        once the head has said how long it is). Past the budget it is refused (503) and False,
        unless no other request holds any: one request of any accepted size always gets read."""
        extra = size - state.charge
        if extra <= 0:
            return True
        if self.held + extra > self.read_budget and self.held > state.charge:
            self.log.warning("Request from ip=%s refused: the requests being read hold %d bytes "
                             "(WEB_READ_BUFFER_BYTES %d)", _ip(conn), self.held, self.read_budget)
            busy = self.refusal_answer(_BUSY, state.data, state.end, _BUSY_RETRY_AFTER)
            self._drop_reading(conn, busy, registered)
            return False
        self.held += extra
        state.charge = size
        return True

    def _forget(self, conn) -> None:
        self.held -= self.reading.pop(conn).charge

    def _hand_over(self, conn, state: _Reading, registered: bool) -> None:
        self._forget(conn)
        if registered:
            self.poller.unregister(conn.sock)
        conn.init()  # the HTTP/1 parser (no I/O without TLS or HTTP/2), once per connection
        conn.sock.setblocking(True)
        # The thread's parser never waits on the socket: what is not here yet never comes.
        conn.parser.unreader.chunk = _no_more_bytes
        conn.parser.unreader.unread(bytes(state.data))
        # The head alone (a refusal's language is read from it), not a body beside it
        conn.lethe_head = bytes(state.data[:state.end + 2]) if state.end >= 0 else bytes(state.data)
        conn.data_ready = True
        super().enqueue_req(conn)

    def _drop_reading(self, conn, answer: bytes | None = None, registered: bool = True) -> None:
        """Close a connection whose request is not complete, with `answer` first if given."""
        self._forget(conn)
        if registered:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)
        self.nr_conns -= 1
        if answer is None:
            util.close(conn.sock)
            return
        conn.sock.setblocking(False)
        with contextlib.suppress(OSError):
            conn.sock.send(answer)
        self._linger(conn.sock)

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        if not self.alive and self._stopping_since is None:
            self._stopping_since = now
        for conn, state in list(self.reading.items()):
            if not state.data and self._stopping_since is not None and now >= self._stopping_since + STOP_KEEPALIVE_LINGER:
                # Stopping, and no request came on this connection: as gunicorn's kept-alive ones.
                self._drop_reading(conn)
            elif state.deadline <= now and state.refused is not None:
                # A request line refused as too long whose head's end has not come: answered
                # from the header lines that did
                self._drop_reading(conn, self.refusal_answer(state.refused, state.data))
            elif state.deadline <= now:
                # A connection that never sent a byte is closed; one partway through a request
                # is told why (408, RFC 9110 section 15.5.9).
                if state.data:
                    self.log.warning("Request from ip=%s not received within %d s: closed", _ip(conn),
                                     self.read_timeout)
                self._drop_reading(conn, self.refusal_answer(_TIMED_OUT, state.data, state.end) if state.data else None)
        for sock, (deadline, _read) in list(self.lingering.items()):
            if deadline <= now:
                self._close_lingering(sock)

    # ---- after the answer

    def _keepalive_after(self, conn, keepalive):
        """A body the application left unread is not drained from the socket (a slow client
        would hold the thread): the connection closes instead. One already in memory is."""
        if keepalive and self._own_reading(conn):
            body = getattr(conn.parser.mesg, "body", None)
            reader = getattr(body, "reader", None)
            if not (isinstance(reader, LengthReader) and reader.length <= len(conn.parser.unreader.buf.getvalue())):
                return False
        return super()._keepalive_after(conn, keepalive)

    def finish_request(self, conn, fs):
        try:
            result = fs.result() if not fs.cancelled() else False
        except Exception:
            result = False
        if result is _DEFER or result or not self._own_reading(conn):
            return super().finish_request(conn, fs)
        # Closing: gunicorn lingers for the client's last bytes blocking the main loop (up to
        # 2 s a connection); here the main loop reads them as they come.
        self.nr_conns -= 1
        try:
            conn.sock.setblocking(False)
        except OSError:
            util.close(conn.sock)
            return None
        self._linger(conn.sock)
        return None

    def _linger(self, sock) -> None:
        try:
            sock.shutdown(socket.SHUT_WR)
            self.poller.register(sock, selectors.EVENT_READ, self._on_lingering_bytes)
        except (OSError, ValueError, KeyError):
            util.close(sock)
            return
        self.lingering[sock] = [time.monotonic() + _LINGER_SECONDS, 0]

    def _on_lingering_bytes(self, sock):
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        entry = self.lingering[sock]
        entry[1] += len(data)
        if not data or entry[1] >= _LINGER_BYTES:
            self._close_lingering(sock)

    def _close_lingering(self, sock) -> None:
        del self.lingering[sock]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(sock)
        util.close(sock)

    def handle(self, conn):
        self.handling.head = getattr(conn, "lethe_head", None)
        conn.lethe_head = None
        try:
            return super().handle(conn)
        finally:
            self.handling.head = None

    def handle_request(self, req, conn):
        if self._own_reading(conn):
            # The request is all here: the main loop sent 100 Continue if it waited for the body
            # (to an HTTP/1.1 client only), and gunicorn would send another.
            req._expected_100_continue = False
        # The thread's socket blocks (gunicorn sets it so); from here its writes are bounded. The
        # parser does not read it (it has the request's bytes), so only the answer is timed: by
        # progress, not in all (a slow link taking a large answer steadily gets all of it).
        if type(conn.sock) is socket.socket:
            conn.sock.__class__ = _ProgressSocket
        conn.sock.settimeout(self.write_timeout)
        try:
            return super().handle_request(req, conn)
        except TimeoutError:
            self.log.warning("Answer to ip=%s: nothing taken for %d s: closed", _ip(conn), self.write_timeout)
            util.close(conn.sock)
            raise StopIteration from None  # gunicorn's "close this connection", quietly

    def handle_error(self, req, client, addr, exc):
        answer = refusal(exc)
        if answer is None:
            return super().handle_error(req, client, addr, exc)
        ip = addr[0] if addr else ""
        # The kind of refusal only: the exception's text quotes the request line or a header,
        # which may carry a token or content (logs carry neither).
        self.log.warning("Invalid request from ip=%s: %s", ip, type(exc).__name__)
        try:
            util.write_nonblock(client, self.refusal_answer(answer, getattr(self.handling, "head", None) or b""))
        except Exception:  # the client went away; nothing to answer
            self.log.debug("Failed to send error message.")
        return None
