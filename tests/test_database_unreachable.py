"""A PostgreSQL server that cannot be reached stops the job cluster, serve and other commands
with one line naming the server and what to do (exit status 2): not the cluster's own
multi-line tracebacks, one per process, outside the JSON log format. Real processes against a
port where nothing listens; the password is never shown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [("qcluster",), ("serve", "127.0.0.1:1"), ("migrate",)])
def test_an_unreachable_database_server_stops_a_command_with_one_line(tmp_path, command):
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "lethe-engine"), DATABASE_URL=f"postgres://lethe:s3cret@127.0.0.1:{port}/lethe")
    result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"Lethe database error: The database server 127.0.0.1:{port} (database lethe) cannot "
                               "be reached: connection failed:")
    assert lines[0].endswith(". Start it, or correct DATABASE_URL, then start again.")
    assert not (tmp_path / "lethe-engine").exists()  # serve made no folder, as it would for a new install
