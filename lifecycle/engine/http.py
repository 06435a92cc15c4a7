"""The remote engine: the same `EngineClient` interface, over HTTP to another Lethe serving `/v1/`.

`ENGINE_URL` names the engine and `ENGINE_TOKEN` is a token made by the engine's
`manage.py create_api_token` (sent as `Authorization: Bearer`). Every call has a connect and a read
timeout (`ENGINE_CONNECT_TIMEOUT`, `ENGINE_READ_TIMEOUT`), and the whole call, its quick
retries included, ends within the connect timeout plus twice the read timeout: a web request
that asks the engine is never held longer by it. The connect timeout bounds resolving the
engine's name as well as connecting (`resolve`): a resolver that does not answer makes the
engine unreachable, not a request that waits as long as the resolver likes. A 2xx answer that
is not JSON (or nested too deeply to read), is over 4 MB, or (for an operation) lacks its id,
target or state is `EngineBadAnswer`, handled as the engine being unreachable: nothing is
taken from it, and it is tried again later. So is a 2xx answer with text that no page can
show or one of the databases cannot store (a NUL character or a lone surrogate, anywhere in
it, checked as the console's own API checks bodies), and an operation id that is not one this
console can keep and link to (`OPERATION_ID`). Calls that are safe to repeat (reads,
archive/close with an absolute value, a delete with its operation key) are retried a few
times with backoff (`ENGINE_RETRIES`) when the engine cannot be reached; others are tried
once.

What can go wrong is one of these outcomes, as exceptions the callers already handle:

- `EngineUnreachable` (503 `engine_unreachable`): no connection, a timeout (resolving the
  name included), a dropped answer, a 408, 429 or any 5xx but 501. The request may or may
  not have been applied; repeat it with the same operation key.
- `EngineBadAnswer` (502 `engine_bad_answer`, handled as unreachable): an answer that is not
  the engine's word: a redirect (a proxy or a sign-in page in front of it), or a refusal
  that is not a JSON object (an HTML error page).
- `EngineCredentialsRefused` (502): a 401 or 403, whatever its code: the engine refused this
  console's token (never passed on as this console's own 401 or 403).
- `ActionRefused` with the engine's own code and status: the engine answered and declined
  (unknown id, a delete not admitted, a key reused for another conversation).
- `EngineUnsupported` (409 `engine_unsupported`): the engine answered, but it does not offer
  the call (405, 501, or a 404 without a code: no such route).
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import ipaddress
import json
import math
import re
import socket
import threading
import time
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from console.api import check_tree
from lifecycle.engine import OperationPage, OperationView
from lifecycle.errors import ActionRefused

# 408 and 429 (the engine, or a proxy before it, timed out or is throttling this address) and
# every 5xx but 501: like an outage, they pass: retry with back-off.
TRANSIENT_STATUSES = (408, 429)
UNSUPPORTED_STATUSES = (405, 501)
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# An engine's refusal text is shown on this console's pages: one line of at most this many characters.
MESSAGE_CHARS = 300
CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
# An engine's operation id as this console keeps it (BoundDelete.engine_operation) and puts it
# in its own addresses (/operations/<id>/): a "/" would make no link at all.
OPERATION_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Nesting an answer may have: the engine's answers (its API document included) are far shallower.
MAX_ANSWER_DEPTH = 64
# Name resolutions of one engine host under way at once in this process. A resolver that does
# not answer holds one thread per lookup until it gives up by itself (often 20-40 s); past this
# many, a call to that host is answered unreachable at once instead of starting another thread.
# Counted per host name: a name that never resolves leaves the other engines' names (the
# delivery engines of ENGINE_TOKENS) their own places. The names are the configured engines'.
MAX_RESOLVING = 8
_resolving: dict[str, threading.BoundedSemaphore] = {}
_resolving_guard = threading.Lock()


def _places(host: str) -> threading.BoundedSemaphore:
    with _resolving_guard:
        return _resolving.setdefault(host.lower(), threading.BoundedSemaphore(MAX_RESOLVING))


class EngineUnreachable(ActionRefused):
    """The engine did not answer (or its answer was lost): try again later, same key."""

    def __init__(self, detail: str = "", retry_after: float | None = None) -> None:
        super().__init__("engine_unreachable", _("The engine cannot be reached right now."), status=503)
        self.detail = detail
        # The seconds the engine asked to be left alone for (its Retry-After), when it said.
        self.retry_after = retry_after


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds, or an HTTP date); None when absent
    or not one of those; never negative."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit() and len(value) <= 9:
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max((when.timestamp() - (now if now is not None else time.time())), 0.0)


class EngineBadAnswer(EngineUnreachable):
    """The engine answered, but not with what the call expects (not JSON, too large, missing or
    wrong fields, or about another conversation): nothing is taken from it; like an outage,
    the call is tried again later."""

    def __init__(self, detail: str = "") -> None:
        ActionRefused.__init__(self, "engine_bad_answer", _("The engine's answer could not be used."), status=502)
        self.detail = detail
        self.retry_after = None  # (r40: the retry loop read it, unset: AttributeError, a 500 on every page)


def _not_a_number(name: str) -> Any:
    """NaN and Infinity: Python's reader takes them, JSON has none, and a database's JSON column
    refuses them (r40: a receipt holding NaN failed every store, the delete Pending for ever)."""
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A number too large for a float (1e999) reads as infinity: refused as NaN is (r43)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is too large")
    return value


class EngineUnsupported(ActionRefused):
    def __init__(self, detail: str = "") -> None:
        super().__init__("engine_unsupported", _("The engine does not support this action."), status=409)
        self.detail = detail


class EngineCredentialsRefused(ActionRefused):
    def __init__(self) -> None:
        super().__init__("engine_credentials_refused",
                         _("The engine refused this console's token. Check ENGINE_TOKEN."), status=502)


def engine_text(value: Any) -> str:
    """An engine's refusal text as this console shows it: one line of printable characters
    (control characters, and lone surrogates that no page could encode, become spaces), at most
    MESSAGE_CHARS long."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in str(value)).split())
    if not text:
        return _("The engine refused the request and gave no reason.")
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1].rstrip() + "…"


class HttpEngine:
    def __init__(self, url: str | None = None, token: str | None = None, *, connect_timeout: float | None = None,
                 read_timeout: float | None = None, retries: int | None = None) -> None:
        self.url = (url if url is not None else settings.ENGINE_URL).rstrip("/")
        self.token = token if token is not None else settings.ENGINE_TOKEN
        self.connect_timeout = connect_timeout if connect_timeout is not None else settings.ENGINE_CONNECT_TIMEOUT
        self.read_timeout = read_timeout if read_timeout is not None else settings.ENGINE_READ_TIMEOUT
        self.retries = retries if retries is not None else settings.ENGINE_RETRIES
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"ENGINE_URL must be an http(s) URL, not {self.url!r}")
        self._parts = parts

    # ---- transport ------------------------------------------------------------------------

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(self._parts.hostname, self._parts.port, timeout=self.connect_timeout)
        # http.client's hook for opening the socket (an instance attribute for that purpose): the
        # name is resolved and connected to here, within the connect timeout and the deadline;
        # HTTPS still checks the certificate against the host name (SNI and hostname check).
        connection._create_connection = lambda address, _timeout, _source=None: self._open(address, deadline)
        return connection

    def _open(self, address: tuple[str, int], deadline: float) -> socket.socket:
        """A socket connected to the engine, as socket.create_connection makes it (each address
        of the name tried in turn), but with the name resolved within the connect timeout, and
        nothing waited on past the call's deadline."""
        host, port = address
        if _ip_literal(host):  # no resolver to ask
            return socket.create_connection(address, self._connect_wait(deadline))
        error: OSError | None = None
        for family, kind, proto, _canonical, sockaddr in resolve(host, port, self._connect_wait(deadline)):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._connect_wait(deadline))
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError("the name has no address")

    def _connect_wait(self, deadline: float) -> float:
        """Seconds a connection step may wait: the connect timeout, never past the deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        return min(self.connect_timeout, left)

    def _once(self, method: str, path: str, body: dict | None, headers: dict[str, str],
              deadline: float, rows: str | None = None) -> tuple[int, Any, float | None]:
        connection = self._connection(deadline)
        # The read timeout bounds each wait for bytes; the deadline bounds the whole call, so an
        # engine that sends a byte now and then cannot hold a request or a job for as long as it likes.
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.01), _cut, args=(connection,))
        watchdog.daemon = True
        try:
            watchdog.start()
            connection.connect()  # name resolution and connection, each under the connect timeout
            connection.sock.settimeout(self.read_timeout)
            data = json.dumps(body).encode() if body is not None else None
            # The engine answers refusals in the language of the person (or job) asking.
            language = translation.get_language() or settings.LANGUAGE_CODE
            all_headers = {"Accept": "application/json", "Accept-Language": language,
                           "Authorization": f"Bearer {self.token}", **headers}
            if data is not None:
                all_headers["Content-Type"] = "application/json"
            connection.request(method, self._parts.path.rstrip("/") + path, body=data, headers=all_headers)
            response = connection.getresponse()
            raw = response.read(MAX_ANSWER_BYTES + 1)
            status = response.status
            wait = retry_after(response.getheader("Retry-After"))
        except (OSError, http.client.HTTPException, AttributeError) as exc:  # refused, reset, timeout, cut
            raise EngineUnreachable(type(exc).__name__) from None
        finally:
            watchdog.cancel()
            connection.close()
        if len(raw) > MAX_ANSWER_BYTES:
            if 200 <= status < 300:
                raise EngineBadAnswer("too large")
            raw = b""
        try:
            answer = json.loads(raw, parse_constant=_not_a_number, parse_float=_finite) if raw else None
        except (ValueError, RecursionError):  # not JSON (NaN too), or nested deeper than this process reads
            if 200 <= status < 300:
                raise EngineBadAnswer("not JSON") from None
            answer = None
        if 200 <= status < 300:
            try:
                # A lone surrogate fails every page that shows it; NUL fails PostgreSQL's writes
                # (SQLite keeps it): refused here, both databases behave alike.
                check_tree(_without_rows(answer, rows), max_depth=MAX_ANSWER_DEPTH)
            except ValueError:
                raise EngineBadAnswer("text with NUL or a lone surrogate, or nested too deeply") from None
        return status, answer, wait

    def call(self, method: str, path: str, *, body: dict | None = None, headers: dict[str, str] | None = None,
             idempotent: bool = True, rows: str | None = None) -> tuple[int, Any]:
        """(status, JSON) of a 2xx answer; otherwise one of the outcomes above, raised. A
        refusal raised for a request sent more than once carries `resent = True`: an earlier
        send whose answer was lost may have been applied (the caller of a delete must not
        then take "not offered" for "nothing was done", r60). `rows`: the key of the answer's
        list whose items the caller checks one by one (text with NUL or a lone surrogate,
        nesting), so that one item's text refuses that item, not the whole answer."""
        sends: list[int] = []
        try:
            return self._call(method, path, body, headers, idempotent, sends, rows)
        except ActionRefused as exc:
            exc.resent = len(sends) > 1
            raise

    def _call(self, method: str, path: str, body: dict | None, headers: dict[str, str] | None,
              idempotent: bool, sends: list[int], rows: str | None = None) -> tuple[int, Any]:
        attempts = 1 + (self.retries if idempotent else 0)
        deadline = time.monotonic() + self.connect_timeout + 2 * self.read_timeout
        for attempt in range(attempts):
            sends.append(attempt)
            try:
                status, answer, wait = self._once(method, path, body, headers or {}, deadline, rows)
                if status in TRANSIENT_STATUSES or (status >= 500 and status not in UNSUPPORTED_STATUSES):
                    raise EngineUnreachable(f"HTTP {status}", retry_after=wait)
                break
            except EngineUnreachable as exc:
                pause = min(0.25 * 2 ** attempt, 2.0)
                # no retry that could not finish in time: the call's whole time stays bounded;
                # none sooner than the engine asked (Retry-After): its caller waits that long
                if (attempt == attempts - 1 or time.monotonic() + pause + 0.5 >= deadline
                        or (exc.retry_after or 0) > pause):
                    raise
                time.sleep(pause)
        if 200 <= status < 300:
            return status, answer
        if status < 400:
            # A redirect (a proxy or a sign-in page in front of the engine): not the engine's word.
            raise EngineBadAnswer(f"HTTP {status}")
        if status in (401, 403):  # whatever the code: the engine refused this console's token
            raise EngineCredentialsRefused()
        code = answer.get("code") if isinstance(answer, dict) else None
        if not (isinstance(code, str) and CODE.fullmatch(code)):
            code = None  # a code this console can match and show: else the engine's refusal, unnamed
        if status in UNSUPPORTED_STATUSES or (status == 404 and not code):
            raise EngineUnsupported(f"HTTP {status}")
        if not isinstance(answer, dict):  # an error page, not the engine declining in its own words
            raise EngineBadAnswer(f"HTTP {status} without a JSON answer")
        exc = ActionRefused(code or "engine_refused", engine_text(answer.get("message", "")), status=status)
        exc.answer = answer
        raise exc

    @staticmethod
    def _view(answer: Any) -> OperationView:
        """An operation answer, read only if it has the fields every use of it needs, and an
        id this console can keep and link to."""
        try:
            view = OperationView.from_json(answer)
        except (TypeError, KeyError, ValueError, AttributeError):
            raise EngineBadAnswer("not an operation") from None
        if not all(isinstance(value, str) and value for value in (view.id, view.target, view.state)):
            raise EngineBadAnswer("not an operation")
        if not OPERATION_ID.fullmatch(view.id):
            raise EngineBadAnswer("not an operation id")
        return view

    # ---- the interface --------------------------------------------------------------------

    @staticmethod
    def _thread_path(public_id: str) -> str:
        return "/v1/threads/" + quote(public_id, safe="")

    def supports_delete(self) -> bool:
        """Whether the engine's API document declares `DELETE /v1/threads/{id}`."""
        _status, document = self.call("GET", "/v1/openapi.json")
        paths = document.get("paths") if isinstance(document, dict) else None
        if not isinstance(paths, dict):
            return False
        return any(path.startswith("/v1/threads/{") and path.count("/") == 3 and "delete" in ops
                   for path, ops in paths.items() if isinstance(ops, dict))

    def thread(self, public_id: str) -> dict[str, Any]:
        return self.call("GET", self._thread_path(public_id))[1]

    def threads(self, **query: Any) -> dict[str, Any]:
        """A page of the engine's conversations. Its rows (`results`) are left to the caller to
        check one by one (remote.sync): one conversation's title with a NUL in it (an engine on
        SQLite keeps one) refuses that conversation, not the list."""
        return self.call("GET", "/v1/threads?" + urlencode({k: v for k, v in query.items() if v is not None}),
                         rows="results")[1]

    def set_archived(self, public_id: str, archived: bool, *, actor) -> dict[str, Any]:
        return self._changed(public_id, "archived", archived)

    def set_closed(self, public_id: str, closed: bool, *, actor) -> dict[str, Any]:
        return self._changed(public_id, "closed", closed)

    def _changed(self, public_id: str, name: str, value: bool) -> dict[str, Any]:
        """PATCH one of the conversation's switches; its answer only if it is this conversation
        with the switch as asked (what the page then says happened), else EngineBadAnswer; with
        `changed`, whether the switch was otherwise just before (read first: the engine's answer
        is the same either way; another change between the two calls is within one request),
        None when that read failed (the change itself is still asked for and its answer used)."""
        try:
            before = self.thread(public_id)
        except ActionRefused:
            before = None
        answer = self.call("PATCH", self._thread_path(public_id), body={name: value})[1]
        if not (isinstance(answer, dict) and answer.get("id") == public_id and answer.get(name) is value
                and isinstance(answer.get("archived"), bool) and isinstance(answer.get("closed"), bool)):
            raise EngineBadAnswer("not this conversation as asked")
        was = before.get(name) if isinstance(before, dict) else None
        return {**answer, "changed": None if not isinstance(was, bool) else was is not value}

    def preview_delete(self, public_id: str) -> dict[str, Any]:
        return self.call("GET", self._thread_path(public_id) + "/deletion-preview")[1]

    def request_delete(self, public_id: str, *, key: str | None, actor, seen: str | None = None) -> OperationView:
        from lifecycle.actions.request_deletion import CHANGED_CODE, CHANGED_SINCE_SHOWN, check_key
        from lifecycle.deletion.preview import preview_digest
        from lifecycle.deletion.reasons import admission_reasons, folder_only

        if key is not None:
            check_key(key)  # as the embedded engine checks it: a line break would not even make a header
        joined = None
        if seen is not None:
            # The engine's API takes no digest, so the comparison is made here, before the
            # request: unlike the embedded engine, which compares under the delete's locks, an
            # item the engine takes in between is not caught. "Joined" is read here too (a
            # confirmation sent again after its own delete reads so as well: it did nothing more).
            # Only the engine folder in the way is no change of the conversation: its answer says it.
            now = self.preview_delete(public_id)
            state = now.get("state") if isinstance(now, dict) else None
            if state == "live" and not folder_only(admission_reasons(now)) and seen != preview_digest(now):
                raise ActionRefused(CHANGED_CODE, str(CHANGED_SINCE_SHOWN), status=409)
            joined = state in ("pending_delete", "deleted")
        headers = {"Idempotency-Key": key} if key else {}
        try:
            _status, answer = self.call("DELETE", self._thread_path(public_id), headers=headers, idempotent=bool(key))
        except ActionRefused as exc:
            answer = getattr(exc, "answer", {})
            if exc.status == 409 and answer.get("outcome") in ("refused", "unavailable") and answer.get("operation"):
                if not (isinstance(answer["operation"], str) and OPERATION_ID.fullmatch(answer["operation"])):
                    raise EngineBadAnswer("not an operation id") from None
                return self.operation(answer["operation"])  # not admitted: the recorded answer
            raise
        return replace(self._view(answer), joined=joined)

    def operation(self, operation_id: str) -> OperationView:
        return self._view(self.call("GET", "/v1/operations/" + quote(operation_id, safe=""))[1])

    def operations_named(self, operation_ids: list[str]) -> list[OperationView]:
        """One call per id (the engine API reads operations one at a time or by page)."""
        views = []
        for operation_id in operation_ids:
            try:
                views.append(self.operation(operation_id))
            except ActionRefused as refused:
                if refused.status != 404:  # not an operation (a made-up id): nothing to show for it
                    raise
        return views

    def operations(self, *, state: str | None = None, limit: int = 50, position: str | None = None) -> OperationPage:
        # The position travels as `offset`, which every engine version takes: an older one
        # hands out whole numbers there, a newer one keys (and takes either).
        pairs = (("state", state), ("limit", limit), ("offset", position or None))
        answer = self.call("GET", "/v1/operations?" + urlencode({k: v for k, v in pairs if v is not None}))[1]
        rows = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise EngineBadAnswer("not a list of operations")
        return OperationPage(
            rows=[self._view(row) for row in rows],
            next=_position(answer.get("next")),
            previous=_position(answer.get("previous")),
        )

    def retry_operation(self, operation_id: str, *, actor) -> OperationView:
        answer = self.call("POST", "/v1/operations/" + quote(operation_id, safe="") + "/retry", body={})[1]
        return self._view(answer)

    def resolve_subagent(self, agent_id: str, *, action: str, conversation_id: str | None, actor) -> None:
        body: dict[str, Any] = {"action": action}
        if conversation_id:
            body["conversation"] = conversation_id
        self.call("POST", "/v1/subagents/" + quote(agent_id, safe="") + "/resolve", body=body, idempotent=False)

    def wait(self, operation_id: str, *, progress=None, timeout: float | None = None) -> OperationView:
        """Polls the engine until the operation is no longer pending (the engine's own job
        cluster does the erasure), reporting its steps."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            op = self.operation(operation_id)
            if progress and op.steps:
                done = sum(1 for s in op.steps if s.get("state") == "done")
                progress(done, len(op.steps), op.step or "")
            if not op.is_pending or (deadline is not None and time.monotonic() >= deadline):
                return op
            time.sleep(0.5)


def resolve(host: str, port: int, wait: float) -> list[tuple]:
    """The addresses of `host`, as socket.create_connection asks for them, waited on for at most
    `wait` seconds. getaddrinfo takes no timeout and no socket timeout bounds it (a resolver
    that does not answer is tried per server and per attempt), so it runs in a daemon thread
    that is given up on: EngineUnreachable, as when MAX_RESOLVING lookups of `host` are already
    under way.
    Nothing is kept: every call asks again, so a changed name is seen at once."""
    places = _places(host)
    if not places.acquire(blocking=False):
        raise EngineUnreachable("name resolution: too many lookups under way")
    done = threading.Event()
    found: list[tuple] = []
    failed: list[Exception] = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except Exception as exc:  # no such name, say: raised to the caller as before
            failed.append(exc)
        finally:
            places.release()
            done.set()

    try:
        threading.Thread(target=lookup, name="engine-resolve", daemon=True).start()
    except RuntimeError:  # no thread to be had
        places.release()
        raise EngineUnreachable("name resolution: no thread") from None
    if not done.wait(wait):
        raise EngineUnreachable("name resolution timed out")
    if failed:
        raise failed[0]
    return found


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _without_rows(answer: Any, rows: str | None) -> Any:
    """The answer without its list of rows under `rows`, which its caller checks row by row."""
    if rows and isinstance(answer, dict) and isinstance(answer.get(rows), list):
        return {key: value for key, value in answer.items() if key != rows}
    return answer


def _cut(connection: http.client.HTTPConnection) -> None:
    """The whole-answer deadline passed: shut the socket, so the read under way fails."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _position(value: Any) -> str | None:
    """A page position from the engine's answer: absent, a row count (older engines) or a key."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1_000_000:
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= 200 and value.isascii() and value.isprintable():
        return value
    raise EngineBadAnswer("not a page position")
