"""A scripted engine for the remote engine's failure tests: a real HTTP server on a loopback
port, in a thread, answering each request with what the test's routes return (the engine
API document declares delete, so the console treats it as an engine that offers it), over HTTPS
when given a server TLS context."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPENAPI = {"paths": {"/v1/threads/{id}": {"delete": {}, "get": {}}}}
Route = Callable[[BaseHTTPRequestHandler], "tuple[int, object] | None"]


@contextlib.contextmanager
def scripted_engine(routes: dict[tuple[str, str], Route],
                    tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list]]:
    """routes: {(method, path prefix): handler -> (status, JSON-able or bytes), or None when
    the handler answered by itself}. Yields the engine's URL and the requests it saw."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def answer(self) -> None:
            seen.append((self.command, self.path))
            if self.path == "/v1/openapi.json":
                status, body = 200, OPENAPI
            else:
                for (method, prefix), route in routes.items():
                    if method == self.command and self.path.startswith(prefix):
                        out = route(self)
                        if out is None:
                            return
                        status, body = out
                        break
                else:
                    status, body = 404, {"code": "not_found", "message": "Nothing here."}
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_DELETE = do_PATCH = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:  # each connection's handshake as it is accepted; a refused one is dropped
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
