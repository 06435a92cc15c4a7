from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has not reaped it yet.
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(")")[-1].split()[0] != "Z"


def test_it_serves_and_stops_the_web_server_and_the_job_cluster_together(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(LETHE_VAR_DIR=str(tmp_path), ENGINE_HOME=str(tmp_path / "engine"),
               DJANGO_SETTINGS_MODULE="console.settings_test")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2).status
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        assert status == 200
        kids = children_of(proc.pid)
        assert len(kids) == 2  # qcluster and runserver
        proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        assert proc.wait(30) == 0
        assert not any(alive(pid) for pid in kids)
    finally:
        if proc.poll() is None:
            proc.kill()
