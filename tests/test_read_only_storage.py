"""A database or a var/ folder Lethe cannot write stops a command, and serve, with one line
naming the file or folder and what to do (exit status 2), not a database traceback, and serve
starts nothing. Real processes on real files. Root may write whatever the permission bits say,
so a truly read-only folder is a read-only bind mount in a mount namespace of the command's
own (`unshare -m`); those tests are skipped where the machine does not allow one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.migrated import migrate

ROOT = Path(__file__).resolve().parent.parent
KEY = "lethe-read-only-tests-" + "k" * 40
CLEAR = ("DATABASE_URL", "LETHE_VAR_DIR", "ENGINE_HOME", "PROMETHEUS_MULTIPROC_DIR", "SECRET_KEY", "SECRET_KEY_FILE",
         "ENGINE_URL", "STATIC_ROOT")


def environment(var: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", SECRET_KEY=KEY, LETHE_VAR_DIR=str(var),
               ENGINE_HOME=str(var.parent / "lethe-engine"), STATIC_ROOT=str(var.parent / "static"),
               WEB_CONCURRENCY="1", WEB_THREADS="1")
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, read_only: Path | None = None) -> subprocess.CompletedProcess:
    """manage.py with these arguments; with `read_only`, that file or folder is mounted read-only
    for this command alone."""
    argv = [sys.executable, str(ROOT / "manage.py"), *args]
    if read_only is not None:
        where = shlex.quote(str(read_only))
        argv = ["unshare", "-m", "sh", "-c",
                f"mount --bind {where} {where} && mount -o remount,ro,bind {where} && exec {shlex.join(argv)}"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def read_only_mounts_work(tmp_path: Path) -> bool:
    probe = tmp_path / "mount-probe"
    probe.mkdir()
    if shutil.which("unshare") is None:
        return False
    where = shlex.quote(str(probe))
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {where} {where} && mount -o remount,ro,bind "
                           f"{where} && ! touch {where}/x"], capture_output=True, timeout=30)
    return done.returncode == 0


needs_mounts = pytest.mark.usefixtures("read_only_mount")


@pytest.fixture
def read_only_mount(tmp_path):
    if not read_only_mounts_work(tmp_path):
        pytest.skip("this machine does not allow a read-only bind mount (unshare -m)")


def sqlite_install(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """A migrated SQLite install under tmp_path/var, closed (no -wal or -shm left)."""
    var = tmp_path / "var"
    env = environment(var)
    database = migrate(env)
    assert database == var / "lethe.sqlite3" and not Path(f"{database}-wal").exists()
    return env, var, database


def one_line(result: subprocess.CompletedProcess) -> str:
    """The stderr line that is not a JSON log line; there must be exactly one, and no traceback."""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_serve_refuses_a_database_file_that_grants_nobody_writing_and_starts_nothing(tmp_path):
    env, var, database = sqlite_install(tmp_path)
    # 0400: owner-only, so Lethe's own chmod 600 of a database others may read leaves it as it is.
    database.chmod(0o400)
    try:
        result = manage(env, "serve", "127.0.0.1:1")
    finally:
        database.chmod(0o600)
    assert result.returncode == 2
    assert one_line(result) == (
        f"Lethe database error: The database {database} cannot be written: {database} has no write permission. "
        f"Lethe writes the database file and creates its -wal and -shm files in {var}: make that folder and the "
        "files in it writable by the user Lethe runs as (or mount the disk read-write), then start again.")
    # Nothing started and nothing written: no metrics folder, no engine folder, no static files.
    assert not (var / "prometheus").exists() and not (var / "prometheus.lock").exists()
    assert not (tmp_path / "lethe-engine").exists() and not (tmp_path / "static").exists()


@needs_mounts
@pytest.mark.parametrize("command", [("engine_folder", "--adopt"), ("migrate",), ("serve", "127.0.0.1:1")])
def test_a_read_only_var_folder_stops_a_command_with_one_line_naming_it(tmp_path, command):
    env, var, database = sqlite_install(tmp_path)
    result = manage(env, *command, read_only=var)
    assert result.returncode == 2
    assert one_line(result) == (
        f"Lethe database error: The database {database} cannot be written: its folder {var} is on a read-only "
        f"file system. Lethe writes the database file and creates its -wal and -shm files in {var}: make that "
        "folder and the files in it writable by the user Lethe runs as (or mount the disk read-write), then start "
        "again.")
    assert sorted(os.listdir(var)) == ["lethe.sqlite3"]


@needs_mounts
def test_a_read_only_database_file_in_a_writable_folder_stops_a_write_and_serve(tmp_path):
    """SQLite opens such a file and reads it: the first write fails (serve checks before it starts)."""
    env, var, database = sqlite_install(tmp_path)
    for command in (("serve", "127.0.0.1:1"), ("engine_folder", "--adopt")):
        result = manage(env, *command, read_only=database)
        assert result.returncode == 2, result.stderr[-2000:]
        assert one_line(result).startswith(
            f"Lethe database error: The database {database} cannot be written: {database} is on a read-only file "
            "system.")
        if command[0] == "serve":  # it started nothing
            assert not (var / "prometheus").exists() and not (tmp_path / "lethe-engine").exists()


def outer_database(tmp_path: Path) -> str:
    """A migrated SQLite file outside the var folder (these tests are about the metrics folder;
    the run's DATABASE_URL names a database that only exists under pytest's test name)."""
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'lethe.sqlite3'}"
    migrate(environment(tmp_path / "db" / "var", DATABASE_URL=url))
    return url


@needs_mounts
def test_serve_with_a_read_only_var_folder_names_the_metrics_folder(tmp_path):
    """On either database: the metrics folder serve empties at start is in var/."""
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    env = environment(var, DATABASE_URL=outer_database(tmp_path))
    result = manage(env, "serve", "127.0.0.1:1", read_only=var)
    assert result.returncode == 2
    assert one_line(result) == (
        f"CommandError: The metrics folder {var / 'prometheus'} cannot be written ({var / 'prometheus.lock'}: "
        "Read-only file system). Make it writable by the user Lethe runs as, or set PROMETHEUS_MULTIPROC_DIR to a "
        "folder that is.")
    assert os.listdir(var) == []


def test_serve_with_a_metrics_folder_it_cannot_make_names_it(tmp_path):
    """The same without a mount: a metrics folder under a file cannot be made, even by root."""
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = environment(var, DATABASE_URL=outer_database(tmp_path), PROMETHEUS_MULTIPROC_DIR=str(blocker / "metrics"))
    result = manage(env, "serve", "127.0.0.1:1")
    assert result.returncode == 2
    assert one_line(result) == (
        f"CommandError: The metrics folder {blocker / 'metrics'} cannot be written ({blocker}: File exists). "
        "Make it writable by the user Lethe runs as, or set PROMETHEUS_MULTIPROC_DIR to a folder that is.")
    assert not (tmp_path / "lethe-engine").exists()


def test_a_database_file_that_grants_nobody_writing_stays_read_only_for_every_command(tmp_path):
    """0444: a read-only command's first connection made it 0600, writable again; 0400: root's
    `conversations archive` wrote into it. Now group and other bits are only ever taken away,
    and a file that grants nobody writing stops a command at its first write."""
    import sqlite3

    env, var, database = sqlite_install(tmp_path)
    seeded = manage(env, "seed_demo", "--conversations", "2", "--messages", "2", "--seed", "1")
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    with sqlite3.connect(database) as db:
        (public_id,) = db.execute("SELECT public_id FROM lifecycle_conversation WHERE archived_at IS NULL AND state = 'live' ORDER BY id").fetchone()
    database.chmod(0o444)
    try:
        read = manage(env, "tool_payloads", "status")
        assert read.returncode == 0, read.stderr[-2000:]
        assert oct(database.stat().st_mode & 0o777) == oct(0o400)  # only the bits for others taken away
        archived = manage(env, "conversations", "archive", public_id, "--as", "admin")
    finally:
        database.chmod(0o600)
    assert archived.returncode == 2, archived.stdout + archived.stderr[-2000:]
    assert one_line(archived) == (
        f"Lethe database error: The database {database} cannot be written: {database} has no write permission. "
        f"Lethe writes the database file and creates its -wal and -shm files in {var}: make that folder and the "
        "files in it writable by the user Lethe runs as (or mount the disk read-write), then start again.")
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT archived_at FROM lifecycle_conversation WHERE public_id = ?", [public_id]).fetchone() == (None,)


@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"),
                    reason="its own SQLite install either way: run once, in the SQLite suite (it waits 20 s)")
def test_a_write_lock_held_elsewhere_is_one_line_and_a_read_does_not_wait_for_it(tmp_path):
    """r30: while another process held the write lock (a compaction, a backup, an sqlite3
    shell), every command waited 20 s on Django's "has SQLite JSON?" question and stopped on
    false system-check errors (exit 1, "SQLite does not support JSONFields"): a read now goes on,
    and a write that waited as long as it waits says why in one line, exit 2."""
    import sqlite3

    env, var, database = sqlite_install(tmp_path)
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        read = manage(env, "verify_erasure", "--all", "--json")
        assert read.returncode == 0, read.stderr[-2000:]
        assert json.loads(read.stdout) == {"found": False, "reports": []}
        argv = [sys.executable, str(ROOT / "manage.py"), "users", "create", "carol", "--role", "member",
                "--password-stdin"]
        write = subprocess.run(argv, cwd=ROOT, env=env, input="Long-pass-phrase-9876\n", capture_output=True,
                               text=True, timeout=120)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert write.returncode == 2
    assert one_line(write) == (
        f"Lethe database error: The database {database} is busy: another process held its write lock for the 20 s "
        "this command waited (a compaction, a backup or an open sqlite3 shell can). The step it was taking was not "
        "written; what it finished before stays. Run it again once the other process is done.")
    with sqlite3.connect(database) as reader:
        assert reader.execute("SELECT count(*) FROM auth_user WHERE username = 'carol'").fetchone() == (0,)
