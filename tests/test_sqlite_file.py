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
        first.ensure_connection()
        with first.cursor() as cursor:
            cursor.execute("CREATE TABLE kept (value TEXT)")
            cursor.execute("INSERT INTO kept VALUES ('before the move')")
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
