"""A real second Lethe process serving the engine API, for the remote engine tests.

`EngineProcess` gets its own SQLite database file and engine folder, is migrated and
seeded through its own `manage.py`, and runs `manage.py serve --dev` (web server and job
cluster) on a loopback port in 8150-8169, in its own process group so stopping it stops
everything it started. `ResponseDropper` sits between a console and an engine and loses
the engine's answer to a chosen request once, after the engine has handled it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.migrated import migrate

ROOT = Path(__file__).resolve().parent.parent

def _lane() -> range:
    """`make test` runs the SQLite, PostgreSQL and browser suites side by side, each starting
    and restarting engines: a stopped engine's port must never be taken by another suite's
    engine (its console would then talk to a stranger with the wrong token), so each suite
    has its own ports. `LETHE_TEST_PORTS=first-last` gives a run ports of its own (a second
    checkout's tests on the same machine)."""
    if ports := os.environ.get("LETHE_TEST_PORTS"):
        first, _, last = ports.partition("-")
        return range(int(first), int(last) + 1)
    if os.environ.get("LETHE_TEST_PORT_LANE") == "e2e":
        return range(8164, 8170)
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return range(8157, 8164)
    return range(8150, 8157)


PORTS = _lane()

SEED = """
import json
from console.management.commands.api_tokens import issue
from lifecycle.models import Account, Computer
from tests import factories
names = json.loads({names!r})
factories.make_user("engine-admin", admin=True)
token = issue("engine-admin", name="console", days=None)
account = Account.objects.create(name="Northwind")
computer = Computer.objects.create(name="laptop")
out = {{"token": token, "account": account.pk, "computer": computer.pk, "threads": {{}}}}
for name, spec in names.items():
    owner = computer if spec.get("owner") == "computer" else account
    c = factories.make_conversation(owner, thread_id=spec.get("thread_id"), title=spec.get("title", name))
    factories.add_message(c, content="hello " + name)
    factories.add_tool(c)
    if spec.get("running"):
        factories.start_turn(c)
    out["threads"][name] = c.public_id
print("SEEDED " + json.dumps(out))
"""


def free_port(exclude: set[int] | tuple = ()) -> int:
    for port in PORTS:
        if port in exclude:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")



def _session_members(sid: int) -> list[int]:
    """The processes of session `sid` (Linux /proc), this one excepted."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
                members.append(int(entry.name))
    return members

class EngineProcess:
    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "engine").mkdir(exist_ok=True)
        self.db = self.folder / "engine.sqlite3"
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.token = ""
        self.seeded: dict = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("ENGINE_URL", "ENGINE_TOKEN", "DATABASE_URL", "LETHE_TEST_KILL_AT", "LETHE_TEST_KILL_DIR")}
        env.update({
            "DATABASE_URL": f"sqlite:///{self.db}", "ENGINE_HOME": str(self.folder / "engine"),
            "LETHE_VAR_DIR": str(self.folder), "DJANGO_SETTINGS_MODULE": "console.settings_test",
            "Q_WORKERS": "1", "LOG_FORMAT": "text", "ACCESS_LOG": "false",
        })
        return env

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env(), capture_output=True,
                              text=True, timeout=180)
        if done.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr[-2000:]}")
        return done.stdout

    def prepare(self, threads: dict[str, dict]) -> dict:
        """Migrate, then an engine admin with a token, an account, a computer and the threads."""
        migrate(self.env())
        # As a new install's first serve does before any conversation exists (lifecycle.engine_folder).
        self.manage("engine_folder", "--adopt")
        out = self.manage("shell", "-c", SEED.format(names=json.dumps(threads)))
        self.seeded = json.loads(next(line for line in out.splitlines() if line.startswith("SEEDED "))[7:])
        self.token = self.seeded["token"]
        return self.seeded

    def start(self, timeout: float = 60, env: dict[str, str] | None = None) -> None:
        log = open(self.folder / "serve.log", "ab")  # noqa: SIM115  (the child keeps it)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--dev", f"127.0.0.1:{self.port}"], cwd=ROOT,
            env={**self.env(), **(env or {})},
            stdout=log, stderr=log, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the engine process exited: " + (self.folder / "serve.log").read_text()[-2000:])
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/v1/openapi.json")
                if connection.getresponse().status == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError("the engine did not start in time")

    def kill(self) -> None:
        """SIGKILL to the engine's whole process group: web server, cluster, workers, at once."""
        self.stop(graceful=False)

    def stop(self, *, graceful: bool = True) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        # serve starts its job cluster in a process group of its own; killed with SIGKILL it
        # cannot stop it, and a cluster whose worker a kill point took may hang in its own
        # shutdown: whatever is left of the engine's session goes too.
        for pid in _session_members(self.process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process = None
        # Its port is free again once nothing listens there.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Read the engine's own database file (a separate connection, read only)."""
        connection = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return connection.execute(sql, params).fetchall()
        finally:
            connection.close()

    def conversation(self, public_id: str) -> dict:
        row = self.query("SELECT id, state, title FROM lifecycle_conversation WHERE public_id = ?", (public_id,))[0]
        items = self.query("SELECT count(*) FROM lifecycle_item WHERE conversation_id = ?", (row[0],))[0][0]
        ops = self.query("SELECT public_id, state, attempts FROM lifecycle_deleteoperation WHERE conversation_id = ?"
                         " AND state IN ('pending', 'completed')", (row[0],))
        return {"state": row[1], "title": row[2], "items": items, "operations": ops}


@contextlib.contextmanager
def running_engine(threads: dict[str, dict], prefix: str) -> Iterator[EngineProcess]:
    """An engine process prepared with `threads` and started, in a folder of its own (not
    pytest's: parallel suites prune pytest's old temporary folders); stopped and removed after."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    process = EngineProcess(folder)
    try:
        process.prepare(threads)
        process.start()
        yield process
    finally:
        process.stop()
        shutil.rmtree(folder, ignore_errors=True)


def use_engine(settings, engine: EngineProcess) -> EngineProcess:
    """This console, configured for the engine process; the engine running (a test may have
    stopped it)."""
    if engine.process is None:
        engine.start()
    settings.ENGINE_URL = engine.url
    settings.ENGINE_TOKEN = engine.token
    settings.ENGINE_READ_TIMEOUT = 15
    settings.LIFECYCLE_OFFLINE_DELETE = "pending"
    return engine


class ResponseDropper:
    """An HTTP relay on a loopback port; `drop_next(method)` makes it pass the next such request
    to the engine, wait for the engine's whole answer, and then close the connection without
    sending a byte of it: the engine acted, the caller never hears."""

    def __init__(self, upstream_port: int, port: int) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.dropped: list[str] = []
        self._drop: set[str] = set()
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream = http.client.HTTPConnection("127.0.0.1", relay.upstream_port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                except OSError:
                    self.close_connection = True
                    return
                finally:
                    upstream.close()
                with relay._lock:
                    drop = self.command in relay._drop
                    relay._drop.discard(self.command)
                if drop:
                    relay.dropped.append(f"{self.command} {self.path} -> {answer.status}")
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_next(self, method: str) -> None:
        with self._lock:
            self._drop.add(method)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
