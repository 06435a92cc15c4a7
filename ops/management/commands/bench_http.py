"""Benchmark: concurrent API clients against a real HTTP server, printing requests, errors,
throughput and p50/p99 latency.

    manage.py bench_http --clients 8 --seconds 20 --server prod   # starts gunicorn (serve's)
    manage.py bench_http --clients 8 --seconds 20 --server dev    # starts the development server
    manage.py bench_http --url http://127.0.0.1:8140               # a server already running

Each client is a thread with its own keep-alive connection, reading the conversation list,
a conversation and a page of its items in turn with an admin's API token, as a native app
would. The server runs on the current database (seed it first); a throwaway admin and token
are made for the run and removed after it. Only loopback addresses are accepted.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import statistics
import subprocess
import threading
import time
import uuid
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.models import ApiToken
from lifecycle.models import Conversation

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Command(BaseCommand):
    help = "Benchmark concurrent API clients against a real HTTP server (requests, errors, p50/p99)."

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=8)
        parser.add_argument("--seconds", type=float, default=20.0)
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--url", help="A server already running on this machine.")
        target.add_argument("--server", choices=("prod", "dev"), default="prod",
                            help="Start this web server for the run: prod (gunicorn, as serve) or dev.")
        parser.add_argument("--port", type=int, default=8140, help="Port for the server the run starts.")

    def handle(self, *args, clients: int, seconds: float, url: str | None, server: str, port: int, **options):
        if clients < 1 or not 0 < seconds <= 600:
            raise CommandError("--clients must be at least 1 and --seconds between 0 and 600.")
        conversation = Conversation.objects.order_by("-last_activity_at").first()
        if conversation is None:
            raise CommandError("Seed some conversations first (manage.py seed_demo).")
        base = url or f"http://127.0.0.1:{port}"
        parts = urlsplit(base)
        if parts.scheme != "http" or parts.hostname not in LOOPBACK:
            raise CommandError("The benchmark only sends traffic to http:// on this machine (127.0.0.1).")
        user = get_user_model().objects.create_user(username=f"bench-http-{uuid.uuid4().hex[:8]}", is_staff=True)
        process = None
        try:
            _token, raw = ApiToken.issue(user, name="bench_http")
            if url is None:
                process = self.start(server, parts.hostname, parts.port)
            label = f"{server} server" if url is None else base
            paths = [
                "/v1/threads?limit=50",
                f"/v1/threads/{conversation.public_id}",
                f"/v1/threads/{conversation.public_id}/items?limit=100",
            ]
            result = run_load(parts.hostname, parts.port or 80, paths, raw, clients=clients, seconds=seconds)
        finally:
            if process is not None:
                self.stop(process, server)
            user.delete()
        timings = sorted(result["timings"])
        if not timings:
            raise CommandError(f"No request succeeded ({result['errors']} errors).")
        p99 = timings[min(len(timings) - 1, int(len(timings) * 0.99))]
        self.stdout.write(
            f"http benchmark ({label}, {clients} clients, {seconds:g} s): "
            f"{result['requests']:,} requests, {result['errors']} errors, "
            f"{result['requests'] / result['elapsed']:,.0f} req/s, "
            f"p50 {statistics.median(timings):.1f} ms, p99 {p99:.1f} ms"
        )

    def start(self, server: str, host: str, port: int) -> subprocess.Popen:
        from console.management.commands.serve import commands, empty_metrics_dir

        spec = commands(f"{host}:{port}", dev=server == "dev")["web server"]
        if server == "prod":
            empty_metrics_dir()
        env = {**(spec.env or os.environ), "ACCESS_LOG": "false", "LOG_LEVEL": "WARNING"}
        process = subprocess.Popen(spec.argv, env=env, cwd=settings.BASE_DIR, process_group=0,
                                   stdout=subprocess.DEVNULL)
        process.stop_signal = spec.stop_signal
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise CommandError(f"The {server} server exited with {process.returncode} (is port {port} free?).")
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection(host, port, timeout=2)
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    connection.close()
                    return process
            time.sleep(0.3)
        self.stop(process, server)
        raise CommandError(f"The {server} server did not answer within 60 s.")

    @staticmethod
    def stop(process: subprocess.Popen, server: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(process.stop_signal)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_load(host: str, port: int, paths: list[str], token: str, *, clients: int, seconds: float) -> dict:
    lock = threading.Lock()
    totals = {"requests": 0, "errors": 0, "timings": []}
    start = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(host, port, timeout=30)
        timings, requests, errors = [], 0, 0
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        for path in paths:  # warm-up, not measured: connections, caches, first queries
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection.request("GET", path, headers=headers)
                connection.getresponse().read()
        start.wait()
        stop_at = time.monotonic() + seconds
        turn = index
        while time.monotonic() < stop_at:
            path = paths[turn % len(paths)]
            turn += 1
            began = time.perf_counter()
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection(host, port, timeout=30)
            requests += 1
            if ok:
                timings.append((time.perf_counter() - began) * 1000)
            else:
                errors += 1
        connection.close()
        with lock:
            totals["requests"] += requests
            totals["errors"] += errors
            totals["timings"] += timings

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(seconds + 60)
    totals["elapsed"] = max(time.monotonic() - began, 1e-9)
    return totals
