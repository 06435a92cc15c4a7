"""A full or read-only metrics folder (PROMETHEUS_MULTIPROC_DIR) costs no request its answer and
kills no worker. prometheus-client made each process's figures file sparse and wrote it through
a memory map: on a full disk the first write to a page without space was SIGBUS, and every
gunicorn worker died on its first request, in a loop (reviewer, a 2 MB tmpfs). Real small tmpfs
mounts (this needs root, or a mount the system allows; skipped, saying so, where it cannot
mount one) and real processes; every test kills whatever it started and unmounts its disk."""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.migrated import migrate
from tests.test_serve import ROOT, children_of, free_port, wait_until

METRICS_TOKEN = "m" * 40
SETUP = """
from console.models import ApiToken
from tests import factories
admin = factories.make_user("metrics-admin", admin=True)
conversation = factories.make_conversation(title="Counted")
_token, raw = ApiToken.issue(admin, name="metrics disk test")
print(conversation.public_id, raw)
"""
OFF = "request figures are off in this process"


@contextlib.contextmanager
def small_disk(path: Path, *options: str):
    """A tmpfs of 1 MiB mounted at `path`, unmounted afterwards."""
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=1m", "mode=0700", *options)),
                              "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (it needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path) -> None:
    """Writes zeros to a file on `disk` until the disk refuses them: ENOSPC."""
    with open(disk / "filler.bin", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    assert os.statvfs(disk).f_bavail == 0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A migrated database (not on the small disk) with a conversation and an admin token."""
    var = tmp_path_factory.mktemp("metrics-disk")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(LETHE_VAR_DIR=str(var), ENGINE_HOME=str(var / "engine"), DJANGO_SETTINGS_MODULE="console.settings_test",
               METRICS_TOKEN=METRICS_TOKEN, LOG_FORMAT="json", STATIC_ROOT=str(var / "static"), WEB_THREADS="2")
    migrate(env)
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", SETUP], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    public_id, token = out.split()[-2:]
    return {"env": env, "public_id": public_id, "token": token, "database": next(var.glob("*.sqlite3"))}


@contextlib.contextmanager
def web_server(env: dict[str, str], log: Path):
    """`manage.py serve --only web` on a free port, its output in `log`; yields (port, the
    gunicorn master's pid). Stopped with SIGTERM, and killed if it will not stop."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--only", "web"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_until(lambda: any(b"gunicorn" in cmdline(k) for k in children_of(proc.pid)), 60), log.read_text()
        master = next(k for k in children_of(proc.pid) if b"gunicorn" in cmdline(k))
        workers = int(env.get("WEB_CONCURRENCY", "2"))
        assert wait_until(lambda: len(children_of(master)) == workers, 60), log.read_text()
        assert wait_until(lambda: listening(port), 60), log.read_text()
        yield port, master
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def listening(port: int) -> bool:
    with contextlib.suppress(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.connect()
        conn.close()
        return True
    return False


def ask(port: int, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, bytes]:
    """One request on its own connection: its status and body (an error, not a guess, when the
    server drops the connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def deaths(log: str) -> list[str]:
    return [line for line in log.splitlines() if "SIGBUS" in line or "was sent" in line or "exited with code" in line]


# The designed answers, each a new series of figures (method, view, status): more than the
# 64 KiB prometheus-client gives a histogram file at first, so the file must grow on the full disk.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "BREW")
ANSWERS = ([("/healthz", method, 200 if method in ("GET", "HEAD") else 405) for method in METHODS]
           + [("/readyz", method, 503 if method in ("GET", "HEAD") else 405) for method in METHODS]
           + [("/no-such-page/", method, 404) for method in ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")]
           + [("/favicon.ico", method, 302) for method in ("GET", "HEAD")])


def test_a_full_metrics_disk_kills_no_worker_and_every_request_gets_its_answer(served, tmp_path):
    disk = tmp_path / "disk"
    env = {**served["env"], "PROMETHEUS_MULTIPROC_DIR": str(disk), "WEB_CONCURRENCY": "1"}
    log = tmp_path / "serve.log"
    with small_disk(disk), web_server(env, log) as (port, master):
        worker = children_of(master)
        assert ask(port, "GET", "/healthz") == (200, b'{"status": "ok"}')
        counted = sorted(p.name for p in disk.glob("*.db"))
        assert counted == [f"counter_{worker[0]}.db", f"histogram_{worker[0]}.db"]
        fill(disk)

        for path, method, status in ANSWERS:
            answered, body = ask(port, method, path)
            assert answered == status, (method, path, body[:300])
        # Readiness answers as designed (this server runs no job cluster): every check, and the database's passes.
        status, body = ask(port, "GET", "/readyz")
        assert status == 503 and json.loads(body)["checks"]["database"] == {"ok": True}
        # An API write commits its row, and its client hears so.
        item = json.dumps({"role": "assistant", "content": "counted on a full disk"}).encode()
        status, body = ask(port, "POST", f"/v1/threads/{served['public_id']}/items", item,
                           Authorization=f"Bearer {served['token']}", **{"Content-Type": "application/json"})
        assert status == 201, body[:300]
        with sqlite3.connect(served["database"]) as db:
            assert db.execute("SELECT COUNT(*) FROM lifecycle_item WHERE content = 'counted on a full disk'"
                              ).fetchone() == (1,)
        # /metrics still adds up what was counted before the figures went off.
        status, body = ask(port, "GET", "/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
        assert status == 200
        assert re.search(rb'lethe_http_requests_total\{method="GET",status="200",view="healthz"\} [1-9]', body)

        assert children_of(master) == worker  # the same worker answered everything
        assert sorted(p.name for p in disk.glob("*.db")) == counted  # no dead worker's files
    text = log.read_text()
    assert deaths(text) == [], text[-3000:]
    said = [json.loads(line) for line in text.splitlines() if OFF in line]
    assert len(said) == 1, text[-3000:]  # once, naming the folder and the full disk
    assert f"the metrics folder {disk} (PROMETHEUS_MULTIPROC_DIR)" in said[0]["message"]
    assert "its disk is full" in said[0]["message"]


def test_workers_that_start_on_a_full_metrics_disk_answer_and_leave_no_files(served, tmp_path):
    disk = tmp_path / "disk"
    env = {**served["env"], "PROMETHEUS_MULTIPROC_DIR": str(disk / "prometheus"), "WEB_CONCURRENCY": "2"}
    log = tmp_path / "serve.log"
    with small_disk(disk):
        fill(disk)
        with web_server(env, log) as (port, master):
            workers = sorted(children_of(master))
            for _ in range(20):  # a new connection each time: either worker may take it
                assert ask(port, "GET", "/healthz") == (200, b'{"status": "ok"}')
                assert ask(port, "GET", "/accounts/login/")[0] == 200
            status, body = ask(port, "GET", "/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
            assert status == 200 and b"lethe_metrics_reader_up" in body
            assert sorted(children_of(master)) == workers
            assert list((disk / "prometheus").iterdir()) == []  # no empty file to spoil a scrape
    text = log.read_text()
    assert deaths(text) == [], text[-3000:]
    said = [line for line in text.splitlines() if OFF in line]
    assert 1 <= len(said) <= 2, text[-3000:]  # once per worker that was asked
    assert all("its disk is full" in line for line in said)


def test_a_process_on_a_read_only_metrics_folder_counts_nothing_and_says_so_once(tmp_path):
    disk = tmp_path / "disk"
    counting = ("import django; django.setup()\n"
                "from ops.metrics import observe_request\n"
                "for n in range(50): observe_request('GET', f'view-{n}', 200, 0.01)\n"
                "print('counted 50')\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "PROMETHEUS_MULTIPROC_DIR": str(disk),
           "LETHE_VAR_DIR": str(tmp_path / "var"), "ENGINE_HOME": str(tmp_path / "engine"), "LOG_FORMAT": "json"}
    with small_disk(disk, "ro"):
        done = subprocess.run([sys.executable, "-c", counting], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert list(disk.iterdir()) == []
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "counted 50"
    said = [line for line in done.stderr.splitlines() if OFF in line]
    assert len(said) == 1 and "a read-only disk" in said[0], done.stderr[-3000:]


def test_the_figures_files_are_given_their_space_before_they_are_mapped(tmp_path):
    """No sparse page left to fault on: the files' blocks cover their whole size, also once grown."""
    folder = tmp_path / "metrics"
    folder.mkdir()
    counting = ("import django; django.setup()\n"
                "from ops.metrics import observe_request\n"
                "for n in range(600): observe_request('GET', f'view-{n}', 200, 0.01)\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "PROMETHEUS_MULTIPROC_DIR": str(folder),
           "LETHE_VAR_DIR": str(tmp_path / "var"), "ENGINE_HOME": str(tmp_path / "engine")}
    subprocess.run([sys.executable, "-c", counting], cwd=ROOT, env=env, check=True, timeout=120)
    files = sorted(folder.glob("*.db"))
    assert [f.name.split("_")[0] for f in files] == ["counter", "histogram"]
    for file in files:
        found = file.stat()
        assert found.st_size > 65536  # grown past its first size
        assert found.st_blocks * 512 >= found.st_size, file.name
