from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from django.utils import timezone

from ops.jobs import record_run
from ops.models import JobStat
from tests import factories
from tests.migrated import migrate

ROOT = Path(__file__).resolve().parent.parent


def test_it_answers_healthz_without_the_database_a_session_or_a_known_host():
    # No django_db mark: pytest-django makes any database access here fail the test.
    client = Client()
    response = client.get("/healthz", HTTP_HOST="10.1.2.3:8000")  # a probe uses the pod's address
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"
    assert "sessionid" not in response.cookies and "csrftoken" not in response.cookies
    assert client.head("/healthz").status_code == 200
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_it_is_not_ready_until_a_job_cluster_has_finished_a_job(client):
    response = client.get("/readyz", HTTP_HOST="10.1.2.3")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["job_cluster"] == {"ok": False, "error": "never", "limit_seconds": 300}
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["engine_folder"] == {"ok": True}
    assert body["checks"]["migrations"] == {"ok": True, "unapplied": 0}

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"
    assert response.json()["checks"]["job_cluster"]["ok"] is True


@pytest.mark.django_db
def test_it_is_not_ready_when_the_last_job_finished_too_long_ago(client, settings):
    settings.READYZ_HEARTBEAT_SECONDS = 120
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01, finished_at=timezone.now() - timedelta(seconds=200))
    check = client.get("/readyz").json()["checks"]["job_cluster"]
    assert check["ok"] is False and check["limit_seconds"] == 120 and 199 <= check["seconds_since_last_job"] <= 230
    # A later job on another cluster makes it ready; an older timestamp never moves it back.
    record_run("lifecycle.tasks.recover", success=False, seconds=0.5)
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01, finished_at=timezone.now() - timedelta(hours=1))
    assert client.get("/readyz").status_code == 200
    assert JobStat.objects.get(func="ops.tasks.heartbeat").runs == 2


@pytest.mark.django_db
def test_it_reports_an_engine_folder_it_cannot_write_and_leaves_no_probe_behind(client, engine_home, settings):
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    before = sorted(os.listdir(engine_home))
    assert client.get("/readyz").status_code == 200
    assert sorted(os.listdir(engine_home)) == before

    blocker = engine_home.parent / "not-a-folder"
    blocker.write_bytes(b"x")
    settings.ENGINE_HOME = blocker
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["engine_folder"] == {"ok": False, "error": "missing"}


@pytest.mark.django_db
def test_it_reports_unapplied_migrations(client):
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    recorder = MigrationRecorder(connection)
    recorder.record_unapplied("ops", "0001_initial")
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == {"ok": False, "unapplied": 1}
    recorder.record_applied("ops", "0001_initial")
    assert client.get("/readyz").status_code == 200


def test_it_stays_healthy_but_not_ready_when_the_database_is_unreachable(tmp_path):
    script = (
        "import json\n"
        "from django.test import Client\n"
        "c = Client()\n"
        "h, r = c.get('/healthz'), c.get('/readyz')\n"
        "print(json.dumps([h.status_code, h.json(), r.status_code, r.json()]))\n"
    )
    env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/lethe_nowhere",
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "ENGINE_HOME": str(tmp_path), "LOG_LEVEL": "CRITICAL"}
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    health_status, health, ready_status, ready = json.loads(out.stdout.strip().splitlines()[-1])
    assert (health_status, health) == (200, {"status": "ok"})
    assert ready_status == 503
    assert ready["checks"]["database"] == {"ok": False, "error": "OperationalError"}
    assert ready["checks"]["engine_folder"] == {"ok": False, "error": "database"}  # written to, mark not compared
    assert ready["checks"]["job_cluster"]["ok"] is False
    assert ready["checks"]["migrations"]["ok"] is False


@pytest.mark.django_db
def test_a_console_with_a_remote_engine_has_no_engine_folder_to_check(client, settings, tmp_path):
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    settings.ENGINE_URL, settings.ENGINE_HOME = "http://engine.example:8150", tmp_path / "never-made"
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["engine_folder"] == {"ok": True, "remote": True}
    assert not (tmp_path / "never-made").exists()


def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite database file")


def database_check(client) -> tuple[int, dict]:
    response = client.get("/readyz")
    checks = response.json()["checks"]
    if not checks["database"]["ok"]:  # the checks that read the database wait for it
        assert checks["job_cluster"] == checks["migrations"] == {"ok": False, "error": "database"}
    return response.status_code, checks["database"]


@pytest.mark.django_db
def test_a_sqlite_file_that_cannot_be_written_is_not_ready(client):
    sqlite_only()
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    path = Path(connection.settings_dict["NAME"])
    mode = path.stat().st_mode
    # Without any write bit: root could still write it (tests may run as root), but the file
    # is meant to be read-only, and the check says so whoever runs it.
    path.chmod(0o444)
    try:
        assert database_check(client) == (503, {"ok": False, "error": "read_only"})
    finally:
        path.chmod(mode)
    assert client.get("/readyz").status_code == 200
    # Its folder, where WAL creates the -wal and -shm files, counts as much. The folder is this
    # process's own (tests/database_folder.py): a folder shared with the other suites' databases
    # made their connections opened meanwhile read-only for the rest of their run.
    assert {p.name for p in path.parent.iterdir()} <= {path.name, f"{path.name}-wal", f"{path.name}-shm"}
    folder_mode = path.parent.stat().st_mode
    path.parent.chmod(0o555)
    try:
        assert database_check(client) == (503, {"ok": False, "error": "read_only"})
    finally:
        path.parent.chmod(folder_mode)
    assert database_check(client) == (200, {"ok": True})


@pytest.mark.django_db
def test_a_sqlite_file_removed_or_replaced_under_the_running_process_is_not_ready(client):
    sqlite_only()
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    path = Path(connection.settings_dict["NAME"])
    moved = path.with_name(path.name + ".moved")
    os.rename(path, moved)  # the open connection keeps writing into a file no longer at the path
    try:
        assert database_check(client) == (503, {"ok": False, "error": "missing"})
        assert not path.exists()  # the probe made no empty database in its place
        path.write_bytes(moved.read_bytes())  # a copy at the path: another file than the one open
        assert database_check(client) == (503, {"ok": False, "error": "replaced"})
    finally:
        path.unlink(missing_ok=True)
        os.rename(moved, path)
    assert database_check(client) == (200, {"ok": True})


@pytest.mark.django_db(transaction=True)
def test_a_sqlite_file_swapped_before_a_new_connection_is_still_replaced(client):
    """A web worker opens a new connection per request, so its connection always matched the
    file at the path and /readyz never said replaced; the job cluster's long-lived connections
    kept writing into the old file meanwhile. The file this process first opened counts too."""
    import shutil

    sqlite_only()
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    path = Path(connection.settings_dict["NAME"])
    original = path.with_name(path.name + ".original")
    connection.close()
    os.rename(path, original)
    shutil.copyfile(original, path)  # the same bytes, another file
    try:
        assert database_check(client) == (503, {"ok": False, "error": "replaced"})
        assert connection.file_identity == (path.stat().st_dev, path.stat().st_ino)  # a new connection, the new file
    finally:
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.rename(original, path)
    assert database_check(client) == (200, {"ok": True})


def test_the_job_cluster_stops_when_its_sqlite_file_is_swapped(tmp_path):
    """Its connections keep the file they opened: it wrote into an unlinked file while /readyz
    said ready. Now it stops with one line and exit status 2."""
    import shutil
    import time

    database = tmp_path / "db" / "lethe.sqlite3"
    database.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DATABASE_URL=f"sqlite:///{database}", DJANGO_SETTINGS_MODULE="console.settings_test",
               ENGINE_HOME=str(tmp_path / "engine"), LETHE_VAR_DIR=str(tmp_path / "var"), Q_WORKERS="1")
    migrate(env)
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(6)  # started, its connections open
        assert cluster.poll() is None
        swapped = database.with_name("swapped.sqlite3")
        shutil.copyfile(database, swapped)
        os.rename(swapped, database)
        _out, err = cluster.communicate(timeout=60)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, 9)
            cluster.wait()
    assert cluster.returncode == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert lines == [f"Lethe database error: The database file {database} was replaced while the job cluster ran "
                     "(another file is at its path now): it stopped rather than write into the one it had open, which "
                     "nobody reads any more. Start it again (and the web server, whose /readyz says replaced) to use "
                     "the file now at the path."]


def test_a_sqlite_path_with_no_file_is_not_ready_and_the_probe_creates_none(tmp_path):
    """A request opens a new connection: the probe looks before it connects, as connecting
    would create an empty database at the path (and every later check would pass it)."""
    script = (
        "import json\n"
        "from django.test import Client\n"
        "r = Client().get('/readyz')\n"
        "print(json.dumps([r.status_code, r.json()]))\n"
    )
    folder = tmp_path / "db"
    folder.mkdir()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{folder / 'lethe.sqlite3'}", "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "ENGINE_HOME": str(tmp_path), "LOG_LEVEL": "CRITICAL"}
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status, ready = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == 503
    assert ready["checks"]["database"] == {"ok": False, "error": "missing"}
    assert ready["checks"]["job_cluster"] == ready["checks"]["migrations"] == {"ok": False, "error": "database"}
    assert os.listdir(folder) == []


@pytest.mark.django_db(transaction=True)
def test_a_read_only_postgresql_database_is_not_ready(client):
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL setting")
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    with factories.database_read_only():
        assert database_check(client) == (503, {"ok": False, "error": "read_only"})
        with connection.cursor() as cursor, pytest.raises(Exception, match="read-only transaction"):
            cursor.execute("UPDATE ops_jobstat SET runs = runs")  # writes fail indeed
    assert database_check(client) == (200, {"ok": True})


@pytest.mark.django_db(transaction=True)
def test_a_database_made_read_only_is_not_ready_on_connections_opened_before(client):
    """Connections keep the default_transaction_read_only they started with (CONN_MAX_AGE 60 s):
    the check reads the setting stored for the database and the role as well, so every
    connection says read_only at once, and ready again once it is reset."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL setting")
    import psycopg

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    connection.ensure_connection()
    opened = connection.connection
    s, name = connection.settings_dict, connection.settings_dict["NAME"]
    other = psycopg.connect(dbname="postgres", user=s["USER"] or None, host=s["HOST"] or None,
                            port=s["PORT"] or None, password=s["PASSWORD"] or None, autocommit=True)
    try:
        other.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        assert database_check(client) == (503, {"ok": False, "error": "read_only"})
        with connection.cursor() as cursor:
            cursor.execute("SHOW default_transaction_read_only")
            assert cursor.fetchone()[0] == "off"  # this session started before: its own value says nothing
        # The most specific stored setting wins, as when a connection starts: this role in this database.
        other.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{name}" SET default_transaction_read_only = off')
        assert database_check(client) == (200, {"ok": True})
    finally:
        other.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{name}" RESET default_transaction_read_only')
        other.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        other.close()
    assert database_check(client) == (200, {"ok": True})
    assert connection.connection is opened  # all of it on the connection opened before the change


def disk_with_free(monkeypatch, folder, free: int) -> None:
    """The disk holding `folder` has `free` bytes free (others as they are)."""
    import shutil

    real = shutil.disk_usage
    folder = os.path.realpath(folder)

    def usage(path):
        found = real(path)
        return found._replace(free=free) if os.path.realpath(path) == folder else found

    monkeypatch.setattr(shutil, "disk_usage", usage)


@pytest.mark.django_db
def test_a_sqlite_database_whose_disk_is_full_is_not_ready(client, monkeypatch):
    """Permissions and read-only mounts were checked, not room: SQLite answers "database or
    disk is full" to every write while /readyz said ready."""
    from ops.health import NO_SPACE_BYTES

    sqlite_only()
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    folder = Path(connection.settings_dict["NAME"]).parent
    disk_with_free(monkeypatch, folder, NO_SPACE_BYTES - 1)
    assert database_check(client) == (503, {"ok": False, "error": "no_space"})
    disk_with_free(monkeypatch, folder, NO_SPACE_BYTES)
    assert database_check(client) == (200, {"ok": True})


@pytest.mark.django_db
def test_a_read_only_or_full_engine_folder_is_named_so(client, engine_home, monkeypatch, unwritable_engine_folder):
    """The write probe's OSError was reported by its class name ("OSError"), the same for a
    read-only mount and a full disk; and a disk with a few bytes left passed."""
    import errno

    from ops.health import NO_SPACE_BYTES

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    for code, error in ((errno.EROFS, "read_only"), (errno.ENOSPC, "no_space"), (errno.EIO, "EIO")):
        unwritable_engine_folder(code)
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["checks"]["engine_folder"] == {"ok": False, "error": error}
    unwritable_engine_folder(None)
    disk_with_free(monkeypatch, engine_home, NO_SPACE_BYTES - 1)
    assert client.get("/readyz").json()["checks"]["engine_folder"] == {"ok": False, "error": "no_space"}
    disk_with_free(monkeypatch, engine_home, NO_SPACE_BYTES)
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_the_engine_folder_is_never_said_ok_unchecked_while_the_database_fails(client, engine_home, monkeypatch):
    """A copy's folder read ok whenever the database check failed (r42: a full disk): the mark
    is compared when the database can still be read, and otherwise the check says it could not."""
    from lifecycle import engine_folder
    from ops.health import NO_SPACE_BYTES, check_engine_folder

    sqlite_only()
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    (engine_home / engine_folder.MARK_NAME).write_text("f" * 32 + "\n")  # another database's folder
    disk_with_free(monkeypatch, Path(connection.settings_dict["NAME"]).parent, NO_SPACE_BYTES - 1)
    checks = client.get("/readyz").json()["checks"]
    assert checks["database"] == {"ok": False, "error": "no_space"}
    assert checks["engine_folder"] == {"ok": False, "error": "not_this_folder"}
    assert check_engine_folder(database_ok=False) == {"ok": False, "error": "database"}


@pytest.mark.django_db
def test_a_job_stamped_before_the_clock_was_set_back_is_no_sign_of_a_running_cluster(client):
    """r129: a job finished while the clock ran two hours fast kept its time as the latest (the
    greater of the two), so for two hours /readyz said the cluster ran, and the pages did not say
    it seemed stopped, though none ran. A time ahead of the clock is no sign of one; the next job
    finished under the true clock replaces it, and readiness follows that one."""
    from ops.health import cluster_stopped

    ahead = timezone.now() + timedelta(hours=2)
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01, finished_at=ahead)
    check = client.get("/readyz").json()["checks"]["job_cluster"]
    assert (check["ok"], check["error"]) == (False, "ahead_of_clock") and 7100 <= check["seconds_ahead"] <= 7200
    assert cluster_stopped() == {"since": None}  # never a time ahead of the clock (r131)
    # a job that runs rarely, stamped before the clock was set back, keeps its time until it runs
    # again: the heartbeat of a cluster on the true clock is what counts (r131: not ready for the step)
    record_run("lifecycle.tasks.startup", success=True, seconds=0.01, finished_at=ahead)
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)  # a cluster that runs, on the true clock
    assert JobStat.objects.get(func="ops.tasks.heartbeat").last_finished_at <= timezone.now()
    assert client.get("/readyz").status_code == 200 and cluster_stopped() is None
    # skew of a minute between two clusters' clocks is not a step: the later time is kept
    soon = timezone.now() + timedelta(minutes=1)
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01, finished_at=soon)
    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)
    assert JobStat.objects.get(func="ops.tasks.heartbeat").last_finished_at == soon
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_an_old_job_time_is_not_taken_over_the_times_ahead_of_a_clock_set_back(client):
    """r132: every job ran a minute before the cluster stopped, stamped by a clock an hour fast,
    and one rarely run job had a time of two days ago: readiness and the pages took that one
    ("none since two days ago"). With nothing recent on this clock, the times ahead of it say
    what ran last: ahead_of_clock, and the pages say no job finished recently, with no time."""
    from ops.health import cluster_stopped

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01, finished_at=timezone.now() + timedelta(hours=1))
    record_run("retention.jobs.daily_check", success=True, seconds=0.01, finished_at=timezone.now() - timedelta(days=2))
    assert client.get("/readyz").json()["checks"]["job_cluster"]["error"] == "ahead_of_clock"
    assert cluster_stopped() == {"since": None}
