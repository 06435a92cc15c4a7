"""`manage.py soak` at a small size: two web servers and two job clusters on one PostgreSQL
database, a mixed API load over both, one cluster SIGKILLed and restarted, then the books.

The soak itself runs only in the PostgreSQL suite: it exercises several hosts sharing one
database, which SQLite (one host's database, docs/deploy.md) is not meant for. Its refusals run
on both engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.test_serve import ROOT

ON_POSTGRES = connection.vendor == "postgresql"


def soak(tmp_path, database_url: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url, "LETHE_VAR_DIR": str(tmp_path / "var"),
           "ENGINE_HOME": str(tmp_path / "soak-engine"), "DJANGO_SETTINGS_MODULE": "console.settings",
           "SECRET_KEY": "lethe-soak-test-" + "s" * 40}
    return subprocess.run([sys.executable, "manage.py", "soak", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(not ON_POSTGRES, reason="The soak runs several hosts on one PostgreSQL database; "
                                            "SQLite serves one host (docs/deploy.md), so the PostgreSQL suite runs it.")
def test_two_web_servers_and_two_clusters_lose_and_double_nothing_under_load(tmp_path):
    base = os.environ["DATABASE_URL"]
    out = soak(tmp_path, f"{base}_soak", "--seconds", "20", "--clients", "2", "--settle-seconds", "240")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    figures = json.loads(out.stdout)
    assert figures["errors"] == 0 and figures["requests"] > 0
    assert set(figures["kinds"]) >= {"append", "read_items", "list_threads", "thread_detail", "archive", "unarchive",
                                     "delete", "delete_repeat", "operation"}
    assert figures["appends_acknowledged"] == figures["appends_stored"] > 0
    assert figures["deletes_requested"] == figures["deletes_completed"] == figures["delete_operations"] > 0
    assert figures["verify_erasure"] == {"checked": figures["deletes_requested"], "found": False}
    kill = figures["cluster_kill"]
    assert kill["name"] in ("jobs-1", "jobs-2") and kill["restarted_at_s"] > kill["at_s"]
    assert figures["jobs_failed"] == 0 and figures["web_servers"] == figures["job_clusters"] == 2
    assert all(8200 <= port < 8220 for port in figures["web_ports"])


def test_it_refuses_a_database_that_is_not_a_postgresql_soak_database(tmp_path):
    sqlite = soak(tmp_path, f"sqlite:///{tmp_path / 'soak.sqlite3'}", "--seconds", "5", timeout=120)
    assert sqlite.returncode == 1 and "needs DATABASE_URL to name a PostgreSQL database" in sqlite.stderr
    assert json.loads(sqlite.stdout)["failed"]
    if ON_POSTGRES:  # a real database is never dropped: the name must say it is a soak's
        base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
        other = soak(tmp_path, f"{base}/lethe_not_this_one", "--seconds", "5", timeout=120)
        assert other.returncode == 1 and "does not look like a soak database" in other.stderr
