"""console/sqlite: a process creates its SQLite database file at most once, owner-only, on its
first connection (a fresh install). A file moved or deleted under the running process is not
made again, empty and world-readable, by the next connection (the job cluster's next poll):
that connection fails naming the path, /readyz says `missing`, and once the file is back
everything works again. Real files in tmp_path, connections of their own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from django.db import OperationalError, connection

from console.settings import database_from_url
from console.sqlite.base import DatabaseWrapper

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif("connection.vendor != 'sqlite'", reason="the SQLite database file")]


def open_database(path) -> DatabaseWrapper:
    """A connection of its own to the database at `path`, configured as settings configure one."""
    return DatabaseWrapper({**connection.settings_dict, **database_from_url(f"sqlite:///{path}")},
                           alias=f"file-{path.name}")


def keep_a_row(connection: DatabaseWrapper, value: str) -> None:
    """A table `kept` with one row, written through `connection` (its first connection)."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE kept (value TEXT)")
        cursor.execute("INSERT INTO kept VALUES (%s)", [value])


def move(path, to) -> None:
    """As an operator moves a database: the file with its -wal and -shm."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.rename(f"{path}{suffix}", f"{to}{suffix}")


def test_the_first_connection_of_a_fresh_install_creates_the_file_owner_only(tmp_path):
    path = tmp_path / "lethe.sqlite3"
    old_umask = os.umask(0o022)
    first = open_database(path)
    try:
        first.ensure_connection()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with first.cursor() as cursor:
            cursor.execute("CREATE TABLE kept (value TEXT)")
        assert {stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode) for suffix in ("", "-wal", "-shm")} == {0o600}
    finally:
        first.close()
        os.umask(old_umask)


def test_a_file_moved_away_is_not_made_again_and_readyz_says_missing_until_it_is_back(tmp_path, client, monkeypatch):
    folder = tmp_path / "db"
    folder.mkdir()
    path, aside = folder / "lethe.sqlite3", folder / "aside.sqlite3"
    first = open_database(path)
    later = open_database(path)
    try:
        keep_a_row(first, "before the move")
        move(path, aside)

        # The job cluster's next poll: a new connection in the same process.
        with pytest.raises(OperationalError, match=f"The database file {path} is missing: it was there"):
            later.ensure_connection()
        assert not path.exists()
        assert [name for name in os.listdir(folder) if not name.startswith("aside")] == []
        monkeypatch.setattr("ops.health.connection", later)
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"] == {"ok": False, "error": "missing"}
        assert not path.exists()  # the probe made none either

        move(aside, path)
        later.ensure_connection()
        with later.cursor() as cursor:
            cursor.execute("SELECT value FROM kept")
            assert cursor.fetchall() == [("before the move",)]
        assert client.get("/readyz").json()["checks"]["database"] == {"ok": True}
    finally:
        first.close()
        later.close()


def test_a_file_deleted_under_the_process_is_refused_by_name_and_nothing_is_written(tmp_path):
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "lethe.sqlite3"
    first = open_database(path)
    first.ensure_connection()
    first.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    again = open_database(path)
    with pytest.raises(OperationalError, match="put it back"):
        again.ensure_connection()
    assert os.listdir(folder) == []


def test_a_new_process_makes_no_file_beside_the_log_of_one_moved_away_and_its_last_writes_stay(tmp_path):
    """r83: the file moved while its -wal stayed (the last committed writes in it); the restarted
    serve's first connection made a new file at the path, SQLite took the log for the new file's
    and dropped it, and the moved file, put back, had lost those writes."""
    from console.sqlite import base

    folder = tmp_path / "db"
    folder.mkdir()
    path, aside = folder / "lethe.sqlite3", folder / "moved.sqlite3"
    first = open_database(path)
    try:
        keep_a_row(first, "committed, in the log")
        assert os.path.getsize(f"{path}-wal") > 0
        os.rename(path, aside)  # the file alone: its -wal and -shm stay at the path

        base._OPENED.discard(str(path))  # a new process: it never opened this path
        base._FIRST.pop(str(path), None)
        restarted = open_database(path)
        with pytest.raises(OperationalError, match=r"is missing, but .*-wal is there: .* put the file back"):
            restarted.ensure_connection()
        assert not path.exists() and os.path.getsize(f"{path}-wal") > 0
        os.rename(aside, path)  # put back, with Lethe stopped
    finally:
        first.close()
    again = open_database(path)
    try:
        with again.cursor() as cursor:
            cursor.execute("SELECT value FROM kept")
            assert cursor.fetchall() == [("committed, in the log",)]
    finally:
        again.close()


def test_serve_started_beside_such_a_log_stops_with_one_line_and_makes_no_file(tmp_path):
    import subprocess
    import sys

    from tests.remote_engine import ROOT

    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "lethe.sqlite3"
    Path(f"{path}-wal").write_bytes(b"left by the file moved away")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DATABASE_URL=f"sqlite:///{path}", DJANGO_SETTINGS_MODULE="console.settings_test",
               ENGINE_HOME=str(tmp_path / "engine"), LETHE_VAR_DIR=str(tmp_path / "var"),
               PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"))
    done = subprocess.run([sys.executable, "manage.py", "serve", "127.0.0.1:1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert lines == [f"Lethe database error: The database file {path} is missing, but {path}-wal is there: the "
                     "file was moved or deleted and its latest writes are still in that log. Lethe does not make a "
                     "new database beside it, which would discard them: put the file back (with Lethe stopped) and "
                     "start Lethe again."]
    assert sorted(os.listdir(folder)) == ["lethe.sqlite3-wal"]
    assert Path(f"{path}-wal").read_bytes() == b"left by the file moved away"


@pytest.mark.parametrize(("command", "kind"), [(["migrate"], "truncated"), (["serve", "127.0.0.1:1"], "truncated"),
                                               (["engine_folder"], "other")])
def test_a_damaged_file_or_one_that_is_no_sqlite_database_stops_a_command_with_one_line(tmp_path, command, kind):
    """r146: a truncated copy restored in the database's place, or another engine's dump copied
    there, stopped every command with a traceback of 90 lines; one line says which and what to do,
    and the file is left as it was."""
    import sqlite3
    import subprocess
    import sys

    from tests.remote_engine import ROOT

    path = tmp_path / "lethe.sqlite3"
    if kind == "truncated":
        whole = tmp_path / "whole.sqlite3"
        made = sqlite3.connect(whole)
        made.execute("CREATE TABLE t (v TEXT)")
        made.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 2000)
        made.commit()
        made.close()
        path.write_bytes(whole.read_bytes()[:200000])
    else:
        path.write_bytes(b"PGDMP\x01\x0f\x00" + b"\x00" * 4096)
    before = path.read_bytes()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DATABASE_URL=f"sqlite:///{path}", DJANGO_SETTINGS_MODULE="console.settings_test",
               ENGINE_HOME=str(tmp_path / "engine"), LETHE_VAR_DIR=str(tmp_path / "var"),
               PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"))
    done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]
    what = "is damaged (database disk image is malformed)" if kind == "truncated" else (
        "is not a SQLite database (file is not a database)")
    assert (done.returncode, lines) == (2, [
        f"Lethe database error: The database file {path} {what}. Nothing was done. Restore it from a backup that "
        "verifies (docs/operations.md, Backups and restore), or set DATABASE_URL to the right file."]), done.stderr[-3000:]
    assert path.read_bytes() == before
