"""The production server `manage.py serve` runs (gunicorn, threaded workers): workers from the
environment, request figures added up across workers, a request in flight finished when it
is told to stop, and the load benchmark at a small size."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_serve import ROOT, Tree, children_of, free_port, start, wait_until

METRICS_TOKEN = "t" * 40
SETUP = """
from console.models import ApiToken
from tests import factories
admin = factories.make_user("server-admin", admin=True)
conversation = factories.make_conversation(title="Served")
factories.add_message(conversation, content="first")
_token, raw = ApiToken.issue(admin, name="server test")
print(conversation.public_id, raw)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A migrated database with a conversation and an admin token, and serve's environment."""
    var = tmp_path_factory.mktemp("app-server")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(LETHE_VAR_DIR=str(var), ENGINE_HOME=str(var / "engine"), DJANGO_SETTINGS_MODULE="console.settings_test",
               Q_WORKERS="1", METRICS_TOKEN=METRICS_TOKEN, LOG_FORMAT="json", STATIC_ROOT=str(var / "static"))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", SETUP], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    public_id, token = out.split()[-2:]
    database = next(var.glob("*.sqlite3"))
    return {"env": env, "var": var, "public_id": public_id, "token": token, "database": database}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A migrated database with nothing in it yet (a new install) and serve's environment."""
    var = tmp_path_factory.mktemp("app-server-fresh")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(LETHE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="console.settings_test", Q_WORKERS="1",
               LOG_FORMAT="json", STATIC_ROOT=str(var / "static"), ENGINE_HOME=str(var / "engine"))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    return {"env": env, "var": var, "database": next(var.glob("*.sqlite3"))}


@pytest.fixture
def tree():
    found = Tree()
    yield found
    found.cleanup()


def get(port: int, path: str, **headers: str) -> tuple[int, bytes, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (http on loopback)
        return response.status, response.read(), dict(response.headers)


def login_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "lethe_http_requests_total" and sample.labels == {
                    "method": "GET", "view": "login", "status": "200"}:
                return sample.value
    return 0.0


def test_it_runs_the_workers_the_environment_asks_for_and_adds_up_their_figures(served, tree):
    # Each worker is replaced after 5 requests, so many processes answer (the kernel may hand
    # every connection to one worker otherwise), and the replaced ones' figures must still count.
    env = {**served["env"], "WEB_CONCURRENCY": "3", "WEB_THREADS": "2", "WEB_MAX_REQUESTS": "5"}
    port = free_port()
    proc = start(env, port)
    kids = tree.watch(proc.pid, port)
    master = next(k for k in kids if b"gunicorn" in Path(f"/proc/{k}/cmdline").read_bytes())
    assert wait_until(lambda: len(children_of(master)) == 3, 30)

    status, _body, headers = get(port, "/static/css/lethe.css")
    assert status == 200 and headers["Server"] == "gunicorn"
    before = login_count(get(port, "/metrics", Authorization=f"Bearer {METRICS_TOKEN}")[1].decode())
    assert before >= 1  # watch()'s own visits
    for _ in range(30):  # a new connection each time, so the workers share them
        assert get(port, "/accounts/login/")[0] == 200
    files = list((Path(served["var"]) / "prometheus").glob("counter_*.db"))
    assert len({re.sub(r"\D", "", f.name) for f in files}) >= 6  # 30 requests, 5 per worker
    assert len(children_of(master)) == 3  # replaced, never fewer
    for _ in range(4):  # whichever worker answers, it reports every worker's requests
        status, body, _headers = get(port, "/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
        assert status == 200 and login_count(body.decode()) == before + 30

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert wait_until(tree.everything_stopped, 10)


def test_it_finishes_a_request_in_flight_when_told_to_stop(served, tree):
    port = free_port()
    proc = start(served["env"], port)
    tree.watch(proc.pid, port)
    body = json.dumps({"role": "assistant", "content": "written while stopping"}).encode()
    head = (f"POST /v1/threads/{served['public_id']}/items HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {served['token']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(head + body[:10])
        time.sleep(0.5)  # the worker is now reading the body
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        client.sendall(body[10:])
        answer = b""
        with contextlib.suppress(TimeoutError):
            while chunk := client.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
    assert proc.wait(30) == 0
    assert wait_until(tree.everything_stopped, 10)
    with sqlite3.connect(served["database"]) as db:
        stored = db.execute("SELECT COUNT(*) FROM lifecycle_item WHERE content = 'written while stopping'").fetchone()
    assert stored == (1,)
    # A new connection after the stop is refused: nothing is left listening.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.parametrize("server", ["prod", "dev"])
def test_it_measures_the_same_api_load_on_either_server(served, server):
    env = {**served["env"], "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    out = subprocess.run(
        [sys.executable, "manage.py", "bench_http", "--clients", "3", "--seconds", "1", "--server", server,
         "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    match = re.fullmatch(rf"http benchmark \({server} server, 3 clients, 1 s\): ([\d,]+) requests, (\d+) errors, "
                         r"[\d,]+ req/s, p50 [\d.]+ ms, p99 [\d.]+ ms", line)
    assert match, line
    assert int(match[1].replace(",", "")) > 0 and match[2] == "0"
    with sqlite3.connect(served["database"]) as db:  # the throwaway admin and its token are gone
        assert db.execute("SELECT COUNT(*) FROM auth_user WHERE username LIKE 'bench-http-%'").fetchone() == (0,)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize(("only", "program", "stopped"), [("web", b"gunicorn", "Stopped the web server."),
                                                          ("jobs", b"qcluster", "Stopped the job cluster.")])
def test_it_runs_only_the_web_server_or_only_the_job_cluster(fresh, tree, only, program, stopped):
    port = free_port()
    # An engine folder not made yet, for a database that has recorded none and holds no
    # conversation (a new install): serve makes it, or /readyz would never pass.
    engine = Path(fresh["var"]) / f"engine-fresh-{only}"
    with contextlib.closing(sqlite3.connect(fresh["database"])) as db, db:
        db.execute("DELETE FROM lifecycle_enginefoldermark")  # the other case's folder, recorded
    # Started from another folder, as a supervisor may do.
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "serve", f"127.0.0.1:{port}", "--only", only],
                            cwd="/", env={**fresh["env"], "ENGINE_HOME": str(engine)}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    tree.pids.add(proc.pid)
    tree.groups.add(proc.pid)
    assert wait_until(lambda: len(children_of(proc.pid)) == 1, 30)
    (kid,) = children_of(proc.pid)
    tree.pids.add(kid)
    tree.groups.add(os.getpgid(kid))
    # Its command line is the program's once it has exec'd (until then, on a busy machine, it
    # can read empty); a child that died instead never gets there.
    assert wait_until(lambda: program in _cmdline(kid), 30), _cmdline(kid)
    assert engine.is_dir()
    if only == "web":
        assert wait_until(lambda: _answers(port), 60)
    proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and stopped in out
    assert wait_until(tree.everything_stopped, 10)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError):
        return get(port, "/healthz")[0] == 200
    return False


def _raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send `request` as is; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(request)
        answer = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := client.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_requests_the_server_refuses_before_lethe_sees_them_get_the_json_error(served, tree, tmp_path):
    """A request line or header over the server's limits, or one that is not HTTP, is answered
    by the server itself: with the same `{code, message}` document as every API error, not HTML.
    Its log line names the kind of refusal, never the request's text (a token in a query)."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"], cwd=ROOT,
                                env=served["env"], stdout=out, stderr=out, start_new_session=True)
    tree.watch(proc.pid, port)
    auth = f"Authorization: Bearer {served['token']}\r\n"
    cases = [
        (f"GET /v1/threads?q={'a' * 5000} HTTP/1.1\r\nHost: x\r\n{auth}\r\n", 414, "request_line_too_long"),
        (f"DELETE /v1/threads/{served['public_id']} HTTP/1.1\r\nHost: x\r\n{auth}Idempotency-Key: {'k' * 9000}\r\n\r\n",
         431, "headers_too_large"),
        ("GET /v1/threads HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{n}: 1\r\n" for n in range(200)) + "\r\n",
         431, "headers_too_large"),
        ("GET /v1/threads?token=lethe_SECRETMARK HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed_request"),
        ("GET /v1/threads HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "malformed_request"),
        # A body larger than Lethe accepts is refused before a byte of it is read.
        (f"POST /v1/threads/{served['public_id']}/items HTTP/1.1\r\nHost: x\r\n{auth}"
         f"Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n", 413, "body_too_large"),
    ]
    for request, status, code in cases:
        answered, headers, body = _raw(port, request.encode())
        assert (answered, headers["Content-Type"]) == (status, "application/json"), (request[:60], body[:200])
        document = json.loads(body)
        assert document["code"] == code and document["message"], document
    # A request inside the limits still reaches Lethe: an over-long query is its own 400.
    answered, headers, body = _raw(port, f"GET /v1/threads?q={'a' * 300} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
                                         f"Connection: close\r\n\r\n".encode())
    assert answered == 400 and json.loads(body)["code"] == "invalid_filter", body[:200]
    # Nothing was deleted by the refused DELETE.
    with sqlite3.connect(served["database"]) as db:
        assert db.execute("SELECT COUNT(*) FROM lifecycle_deleteoperation").fetchone() == (0,)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    logged = log.read_text(errors="replace")
    assert "Invalid request from ip=127.0.0.1: InvalidHTTPVersion" in logged
    assert "SECRETMARK" not in logged and "aaaaaaaaaa" not in logged and "kkkkkkkkkk" not in logged


def _read_all(client: socket.socket) -> bytes:
    answer = b""
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def test_slow_clients_hold_no_thread_and_are_cut_after_the_read_timeout(served, tree):
    """More slow clients than threads (a body, a head or a chunked body sent a byte at a time)
    do not keep anyone else waiting: requests on other connections, a keep-alive one with a
    body included, are answered meanwhile. A client that has not delivered its request within
    WEB_READ_TIMEOUT gets a 408 and is closed; a chunked body Lethe does not read is not waited
    for: the answer comes and the connection closes."""
    read_timeout = 4
    env = {**served["env"], "WEB_CONCURRENCY": "1", "WEB_THREADS": "2", "WEB_READ_TIMEOUT": str(read_timeout)}
    port = free_port()
    proc = start(env, port)
    tree.watch(proc.pid, port)
    heads = {
        "body": b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n",
        "head": b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "chunked": b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"186a0\r\n",
    }
    slow = []
    for kind in ("body", "body", "body", "head", "head", "chunked", "chunked"):
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(heads[kind])
        slow.append((kind, client))
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.5):
            for kind, client in slow:
                with contextlib.suppress(OSError):
                    client.sendall(b"X-a: b\r\n" if kind == "head" else b"a")

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        # Each answered within the read timeout, that is before any slow client is cut.
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=read_timeout) as answer:  # noqa: S310
                assert answer.status == 200
        body = json.dumps({"role": "assistant", "content": "written past slow clients"})
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=read_timeout)
        kept.request("POST", f"/v1/threads/{served['public_id']}/items", body=body,
                     headers={"Authorization": f"Bearer {served['token']}", "Content-Type": "application/json"})
        with kept.getresponse() as answer:
            assert answer.status == 201, answer.read()[:200]
            answer.read()
        kept.request("GET", "/accounts/login/")  # the same connection, kept alive
        with kept.getresponse() as answer:
            assert answer.status == 200
        kept.close()
        answers = [(kind, _read_all(client)) for kind, client in slow]
    finally:
        stop.set()
        trickler.join(5)
        for _kind, client in slow:
            client.close()
    for kind, answer in answers:
        if kind == "chunked":  # refused without reading it (no CSRF cookie), then closed
            assert answer.startswith(b"HTTP/1.1 403 "), answer[:100]
            continue
        head, _, document = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"Content-Type: application/json" in head, (kind, answer[:200])
        assert json.loads(document)["code"] == "request_timeout"
    with sqlite3.connect(served["database"]) as db:
        stored = db.execute("SELECT COUNT(*) FROM lifecycle_item WHERE content = 'written past slow clients'").fetchone()
    assert stored == (1,)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def _answer(client: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes (or `timeout` passes with nothing new)."""
    client.settimeout(timeout)
    return _read_all(client)


def _document(answer: bytes) -> tuple[str, dict, dict]:
    """The status line, headers and JSON document of a refusal."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return lines[0], dict(line.split(": ", 1) for line in lines[1:]), json.loads(body)


def test_a_head_over_the_limits_is_refused_at_once_and_holds_no_thread(served, tree):
    """A head that grows past what the parser accepts, with no blank line yet, is refused as
    soon as it does (431; a request line over its limit 414) and never reaches a thread: as
    many such connections as threads, left quiet, keep no other request waiting. (A thread's
    parser waited for more in recv(), with no deadline, before it looked at the size.)"""
    env = {**served["env"], "WEB_CONCURRENCY": "1", "WEB_THREADS": "2", "WEB_READ_TIMEOUT": "60"}
    port = free_port()
    proc = start(env, port)
    tree.watch(proc.pid, port)
    max_head = 4094 + 4 + 100 * (8190 + 2) + 4  # gunicorn's defaults (serve sets none)
    head = b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    held = []
    over = head + b"X-Pad: " + b"a" * (max_head - len(head) - 6)  # one byte over, no end of line
    for request in (over, over, b"GET /" + b"a" * 5000):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(request)
        held.append(client)
    try:
        other = socket.create_connection(("127.0.0.1", port), timeout=10)
        other.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert _answer(other).startswith(b"HTTP/1.1 200 "), "a request on another connection was not answered"
        answers = [_answer(client) for client in held]
    finally:
        for client in held:
            client.close()
    for answer, (status, code) in zip(answers, [(431, "headers_too_large")] * 2 + [(414, "request_line_too_long")],
                                  strict=True):
        line, headers, document = _document(answer)
        assert line.startswith(f"HTTP/1.1 {status} ") and headers["Content-Type"] == "application/json", answer[:100]
        assert document["code"] == code
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def _item_request(served, content: str, size: int, extra: str = "") -> tuple[bytes, bytes]:
    """The head and body of an item written to the served conversation, its JSON padded with
    white space to `size` bytes."""
    body = json.dumps({"role": "user", "content": content}).encode()
    body += b" " * (size - len(body))
    head = (f"POST /v1/threads/{served['public_id']}/items HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {served['token']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n").encode()
    return head, body


def test_the_requests_being_read_hold_at_most_the_read_buffer(served, tree):
    """The bytes a worker holds for requests it is still reading are bounded by
    WEB_READ_BUFFER_BYTES (an announced body counts in full): a request that would pass it
    while others hold bytes is answered 503 `server_busy` with Retry-After, before its body is
    asked for, and closed. The others are read to the end; once they are, the budget is free
    again, and a request larger than the whole budget still gets through on its own. (Each of
    a worker's 1,000 connections could hold a whole body: 400 of them took a worker to 1.1 GB.)"""
    env = {**served["env"], "WEB_CONCURRENCY": "1", "WEB_THREADS": "2", "WEB_READ_BUFFER_BYTES": str(1024 * 1024)}
    port = free_port()
    proc = start(env, port)
    tree.watch(proc.pid, port)
    head, body = _item_request(served, "within the read buffer", 600_000)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
        first.sendall(head + body[:1000])
        time.sleep(1)  # the worker holds the first request now: 600 KB counted
        busy_head, _busy_body = _item_request(served, "past the read buffer", 600_000, "Expect: 100-continue\r\n")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as second:
            second.sendall(busy_head)
            refused = _answer(second)
        first.sendall(body[1000:])
        written = _answer(first)
    assert refused.startswith(b"HTTP/1.1 503 ") and b"100 Continue" not in refused, refused[:200]
    _line, headers, document = _document(refused)
    assert headers["Retry-After"] == "5" and headers["Content-Type"] == "application/json"
    assert document["code"] == "server_busy"
    assert written.startswith(b"HTTP/1.1 201 "), written[:200]
    for size in (600_000, 1_500_000):  # the same again, then one larger than the whole budget
        head, body = _item_request(served, "within the read buffer", size)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(head + body)
            answer = _answer(client)
        assert answer.startswith(b"HTTP/1.1 201 "), answer[:200]
    with sqlite3.connect(served["database"]) as db:
        stored = db.execute("SELECT content, COUNT(*) FROM lifecycle_item WHERE content LIKE '%the read buffer' "
                            "GROUP BY content").fetchall()
    assert stored == [("within the read buffer", 3)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.fixture(scope="module")
def reading(served):
    """One server for the requests the main loop reads oddly, with a read timeout longer than
    any client here waits: an answer that comes is the one decided at once."""
    found = Tree()
    port = free_port()
    proc = start({**served["env"], "WEB_CONCURRENCY": "1", "WEB_THREADS": "2", "WEB_READ_TIMEOUT": "60"}, port)
    try:
        found.watch(proc.pid, port)
        yield port
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        found.cleanup()


def test_a_content_length_of_thousands_of_digits_is_too_large(served, reading):
    """More digits than any accepted length has is a 413 (int() refused a string of over 4,300
    digits, and the connection closed unanswered)."""
    head, _body = _item_request(served, "uncountable", 0)
    head = head.replace(b"Content-Length: ", b"Content-Length: " + b"1" * 5000)
    with socket.create_connection(("127.0.0.1", reading), timeout=10) as client:
        client.sendall(head)
        line, _headers, document = _document(_answer(client))
    assert line.startswith("HTTP/1.1 413 ") and document["code"] == "body_too_large"


def test_a_head_whose_lines_end_with_a_bare_lf_is_refused_at_once(reading):
    """A bare LF never ends a head's line (RFC 9112 section 2.2): the parser refuses it from
    what it holds (400). The main loop looked for CRLF CRLF only, and waited the read timeout."""
    for request in (b"GET /accounts/login/ HTTP/1.1\nHost: 127.0.0.1\n\n",
                    b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\nX-Next: 1"):
        with socket.create_connection(("127.0.0.1", reading), timeout=10) as client:
            client.sendall(request)
            answer = _answer(client)
        assert answer.startswith(b"HTTP/1.1 400 "), (request, answer[:100])
        assert _document(answer)[2]["code"] == "malformed_request"


@pytest.mark.parametrize(("version", "continues"), [("1.1", 1), ("1.0", 0)])
def test_100_continue_is_sent_once_and_only_to_http_1_1(served, reading, version, continues):
    """The main loop asks for the body once; gunicorn asked again when the request reached a
    thread, and an HTTP/1.0 client was asked too (RFC 9110 section 10.1.1: its expectation is
    ignored)."""
    head, body = _item_request(served, f"continued over HTTP/{version}", 200, "Expect: 100-continue\r\n")
    head = head.replace(b" HTTP/1.1\r\n", f" HTTP/{version}\r\n".encode(), 1)
    with socket.create_connection(("127.0.0.1", reading), timeout=10) as client:
        client.sendall(head)
        time.sleep(1)  # the head is read, the body awaited
        client.sendall(body)
        answer = _answer(client)
    assert answer.count(b"100 Continue") == continues and b" 201 Created" in answer, answer[:200]
    with sqlite3.connect(served["database"]) as db:
        stored = db.execute("SELECT COUNT(*) FROM lifecycle_item WHERE content = ?",
                            (f"continued over HTTP/{version}",)).fetchone()
    assert stored == (1,)
