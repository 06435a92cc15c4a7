"""Two `manage.py serve` on one host with the same PROMETHEUS_MULTIPROC_DIR: the second exits 2
with a one-line message and empties nothing, so the running server keeps its request figures.
Real processes; every test kills whatever it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

from tests.migrated import migrate
from tests.test_serve import ROOT, Tree, children_of, free_port, wait_until


def answers(port: int) -> bool:
    with contextlib.suppress(urllib.error.URLError, ConnectionError, OSError):
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200
    return False


def test_a_second_serve_on_the_same_metrics_folder_refuses_and_empties_nothing(tmp_path):
    metrics = tmp_path / "metrics"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(LETHE_VAR_DIR=str(tmp_path / "var"), ENGINE_HOME=str(tmp_path / "engine"),
               DJANGO_SETTINGS_MODULE="console.settings_test", PROMETHEUS_MULTIPROC_DIR=str(metrics),
               WEB_CONCURRENCY="1", WEB_THREADS="2")
    migrate(env)
    port = free_port()
    tree = Tree()
    try:
        def start_web() -> subprocess.Popen:
            proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--only", "web"],
                                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            tree.pids.add(proc.pid)
            tree.groups.add(proc.pid)
            return proc

        first = start_web()
        assert wait_until(lambda: answers(port), 60), "the first serve did not answer /healthz"
        for kid in children_of(first.pid):
            tree.pids.add(kid)
            with contextlib.suppress(ProcessLookupError):
                tree.groups.add(os.getpgid(kid))
        # The running server's figures: a marker named as prometheus-client names its files,
        # and whatever the workers wrote.
        marker = metrics / "counter_999999.db"
        marker.write_bytes(b"figures of the running server")
        before = sorted(p.name for p in metrics.iterdir())

        # The same address: without the lock it would empty the folder, then fail to bind.
        second = subprocess.run([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--only", "web"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                                start_new_session=True)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr[-2000:]
        assert "Another serve is using the metrics folder" in lines[0]
        assert "give each serve its own PROMETHEUS_MULTIPROC_DIR" in lines[0]
        assert "Traceback" not in second.stderr
        assert marker.read_bytes() == b"figures of the running server"
        assert sorted(p.name for p in metrics.iterdir()) == before
        # The lock is beside the folder, not in it.
        assert (tmp_path / "metrics.lock").is_file()
        assert answers(port)

        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        assert wait_until(tree.everything_stopped, 10)

        # Once the first has stopped, the folder is free again: a new serve takes it and, as
        # at every start, empties it.
        third = start_web()
        assert wait_until(lambda: answers(port), 60), "a serve after the first stopped did not start"
        assert not marker.exists()
        third.send_signal(signal.SIGTERM)
        assert third.wait(30) == 0
    finally:
        tree.cleanup()
