"""A PostgreSQL server that cannot be reached stops the job cluster, serve and other commands
with one line naming the server and what to do (exit status 2): not the cluster's own
multi-line tracebacks, one per process, outside the JSON log format. Real processes against a
port where nothing listens; the password is never shown."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.migrated import migrate

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


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="a PostgreSQL server")
@pytest.mark.parametrize(("part", "said"), [("database", 'database "{name}" does not exist'),
                                            ("role", 'role "{role}" does not exist')])
def test_a_server_that_refuses_the_database_or_role_says_so_not_that_it_cannot_be_reached(tmp_path, part, said):
    """r149: a running server without the database (not yet created) was said to be unreachable,
    and the line said to start it."""
    from urllib.parse import urlsplit

    server = urlsplit(os.environ["DATABASE_URL"])
    name, role = "lethe_never_created_r149", "lethe_no_such_role_r149"
    url = (server._replace(path=f"/{name}") if part == "database"
           else server._replace(netloc=f"{role}@{server.hostname}:{server.port or 5432}")).geturl()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "lethe-engine"), DATABASE_URL=url)
    result = subprocess.run([sys.executable, "manage.py", "migrate"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert "cannot be reached" not in lines[0] and "Start it" not in lines[0]
    assert lines[0].startswith("Lethe database error: The database server ") and " refused the connection to database " in lines[0]
    assert said.format(name=name, role=role) in lines[0]
    assert lines[0].endswith("Create the database or its role (docs/deploy.md), or correct DATABASE_URL, then start again.")


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="a PostgreSQL server")
def test_a_server_that_refuses_a_setting_is_not_said_to_lack_the_database(tmp_path):
    """r154: every refusal the server sent was answered with 'Create the database or its role'."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "lethe-engine"),
               # (the maintenance database, which every server has: the suite's own may not exist yet)
               DATABASE_URL=os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
               "?options=-c%20statement_timeout%3Dx")
    result = subprocess.run([sys.executable, "manage.py", "migrate"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert " refused the connection to database " in lines[0] and "Create the database" not in lines[0], lines[0]
    assert lines[0].endswith("Correct DATABASE_URL or the server's settings, or wait for the server if it is starting "
                             "or full, then start again.")


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "lethe-engine"), **extra)
    return env


def _one_line_error(env) -> list[str]:
    """`tool_payloads status` run in `env`: it must stop with exit status 2 and no traceback; its
    stderr lines (the JSON log lines left out)."""
    result = subprocess.run([sys.executable, "manage.py", "tool_payloads", "status"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return [line for line in result.stderr.splitlines() if not line.startswith("{")]


def test_a_database_never_migrated_is_one_line_that_says_to_migrate(tmp_path):
    """A wrong SQLite path (or a database never migrated) ended in a traceback about a missing
    table."""
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/missing.sqlite3")
    assert _one_line_error(env) == [f"Lethe database error: The database {tmp_path}/missing.sqlite3 has no Lethe tables (no such "
                     "table: retention_toolpayloadpolicy): it was never migrated, or DATABASE_URL names another "
                     "database. Run manage.py migrate, or correct DATABASE_URL."]


def test_ctrl_c_ends_a_command_with_one_line_not_a_traceback(tmp_path):
    import signal
    import time

    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    migrate(env)
    subprocess.run([sys.executable, "manage.py", "shell", "-c",
                    "from django.contrib.auth import get_user_model; "
                    "get_user_model().objects.create_user('op', password='pw-op-12345', is_staff=True)"],
                   cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
    # No job cluster runs: the analysis waits in the queue until interrupted.
    # As from a terminal, where Ctrl-C is not ignored (a suite started in the background by a
    # non-interactive shell ignores SIGINT, and its children would inherit that).
    process = subprocess.Popen([sys.executable, "manage.py", "tool_payloads", "analyze", "--age", "2", "--as", "op"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert [line for line in err.splitlines() if line.strip() and not line.startswith("{")][-1] == "Interrupted."


def test_a_reader_that_goes_away_ends_a_command_without_a_traceback(tmp_path):
    """`manage.py tool_payloads status | head -3` printed a BrokenPipeError traceback (r42)."""
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    migrate(env)
    process = subprocess.Popen([sys.executable, "manage.py", "shell", "-v0", "-c", "for n in range(10**6): print(n)"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"0\n"
    process.stdout.close()  # as `head -1` does once it has its line
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]


def test_a_reader_gone_before_the_output_ends_a_command_without_blame_or_traceback(tmp_path):
    """Output left buffered at the end failed at exit with "Exception ignored ... BrokenPipeError"
    (`api_tokens list`); a command's folder-error handler took the broken pipe for an engine folder
    that could not be written (`conversations status`: "io_error: ...: Broken pipe", r43)."""
    from console.management.cli import io_error

    assert isinstance(io_error(BrokenPipeError(32, "Broken pipe"), "Nothing more was done"), BrokenPipeError)
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3", LETHE_DEMO_PASSWORD="pw-pipe-123")
    migrate(env)
    subprocess.run([sys.executable, "manage.py", "seed_demo", "--conversations", "2", "--messages", "2"], cwd=ROOT,
                   env=env, check=True, timeout=300, capture_output=True)
    conversation = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v0", "-c",
         "from lifecycle.models import Conversation; print(Conversation.objects.first().public_id)"],
        cwd=ROOT, env=env, check=True, timeout=120, capture_output=True, text=True).stdout.strip()
    for args in (("api_tokens", "list"), ("conversations", "status", conversation)):
        process = subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdout.close()  # gone before the command writes anything
        err = process.stderr.read().decode()
        assert process.wait(timeout=120) == 1, (args, err[-3000:])
        assert "Traceback" not in err and "Exception ignored" not in err and "io_error" not in err, (args, err[-3000:])
        assert "Broken pipe" not in err, (args, err[-3000:])


def test_an_argument_that_is_not_utf8_is_one_line(tmp_path):
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    result = subprocess.run([sys.executable.encode(), b"manage.py", b"conversations", b"status", b"c_a\xff"],
                            cwd=ROOT, env=env, capture_output=True, timeout=120)
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.strip() == "Lethe: an argument is not UTF-8 text (c_a\\udcff); nothing was done."
    assert not (tmp_path / "db.sqlite3").exists()  # it stopped before any connection


def test_a_database_missing_one_table_says_to_migrate_not_that_it_has_none(tmp_path):
    import sqlite3

    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    migrate(env)
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:  # as an upgrade whose migrate has not run
        db.execute("DROP TABLE retention_toolpayloadoperation")
    assert _one_line_error(env) == [f"Lethe database error: The database {tmp_path}/db.sqlite3 lacks a table this release uses "
                     "(no such table: retention_toolpayloadoperation): its migrations are not all applied. Run "
                     "manage.py migrate."]


def test_a_database_one_migration_behind_says_to_migrate_for_a_missing_column(tmp_path):
    """r32: a backup from before an upgrade, restored and not migrated yet (the restore steps
    once had `engine_folder` run before `migrate`): a column this release added was a traceback."""
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    for args in (("migrate", "-v0"), ("engine_folder", "--adopt"), ("migrate", "lifecycle", "0024", "-v0")):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, timeout=300)
    result = subprocess.run([sys.executable, "manage.py", "engine_folder"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if not line.startswith("{")] == [
        f"Lethe database error: The database {tmp_path}/db.sqlite3 lacks a column this release uses (no such column: "
        "lifecycle_enginefoldermark.database_key): its migrations are not all applied. Run manage.py migrate."]
    # r33: the take-over refused the same way had replaced the folder's mark first (the live
    # database's deletes waited): refused, it changes nothing
    # the folder as the live database marked it (this restore's row names the mark of its backup)
    (tmp_path / "lethe-engine" / ".lethe-engine-folder").write_text("ab" * 16 + "\n")
    mark = (tmp_path / "lethe-engine" / ".lethe-engine-folder").read_bytes()
    taken = subprocess.run([sys.executable, "manage.py", "engine_folder", "--adopt", "--take-from-other-database"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert taken.returncode == 2 and "Traceback" not in taken.stderr and "Run manage.py migrate." in taken.stderr
    assert (tmp_path / "lethe-engine" / ".lethe-engine-folder").read_bytes() == mark


def _postgresql_database_never_migrated(name: str):
    """An empty PostgreSQL database beside the one the tests run on (its URL, and a function
    that drops it); None when the tests run on SQLite."""
    import contextlib

    import psycopg
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        return None
    params = {"host": database["HOST"] or "127.0.0.1", "port": database["PORT"] or 5432, "user": database["USER"],
              "password": database["PASSWORD"] or None, "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**params) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with contextlib.closing(psycopg.connect(**params)) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    url = f"postgres://{database['USER']}@{params['host']}:{params['port']}/{name}"
    return url, drop


@pytest.mark.parametrize("command", [("qcluster",), ("serve", "127.0.0.1:8471"), ("serve", "--only", "web",
                                                                                   "127.0.0.1:8472")])
def test_serve_and_the_job_cluster_stop_on_a_database_never_migrated(tmp_path, command):
    """A mistyped SQLite path (or an empty PostgreSQL database): serve and the job cluster kept
    running, the sign-in answering 500 and the cluster logging errors every 10 s."""
    databases = [(f"sqlite:///{tmp_path}/missing.sqlite3", f"{tmp_path}/missing.sqlite3",
                  "no such table: lifecycle_conversation")]
    postgresql = _postgresql_database_never_migrated(f"fixD_never_migrated_{command[-1][-1]}")
    if postgresql:
        url, drop = postgresql
        databases.append((url, url.rsplit("/", 1)[1], 'relation "lifecycle_conversation" does not exist'))
    try:
        for url, name, why in databases:
            env = _env(tmp_path, DATABASE_URL=url)
            result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                                    text=True, timeout=120)
            assert result.returncode == 2, result.stderr[-3000:]
            lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
            assert lines == [f"Lethe database error: The database {name} has no Lethe tables ({why}): it was never "
                             "migrated, or DATABASE_URL names another database. Run manage.py migrate, or correct "
                             "DATABASE_URL."]
            assert not (tmp_path / "lethe-engine").exists()  # it stopped before anything was made
    finally:
        if postgresql:
            drop()


def test_a_database_file_moved_away_under_the_web_server_is_503_unavailable_and_no_empty_one_is_made(tmp_path):
    """The SQLite file moved away while `serve` runs: a worker that had not opened it yet made an
    empty database in its place and answered 500 internal_error ("part of the request may have
    been done"). Every worker now knows the file serve opened: the API answers 503
    database_unavailable with Retry-After, a page the plain 503 page, and no file is made."""
    import time
    import urllib.error
    import urllib.request

    from tests.test_serve import Tree, free_port

    database = tmp_path / "db.sqlite3"
    env = _env(tmp_path, DATABASE_URL=f"sqlite:///{database}", PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"),
               WEB_CONCURRENCY="2", STATIC_ROOT=str(tmp_path / "static"))
    migrate(env)
    token = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            "from console.models import ApiToken; from tests import factories; "
                            "print(ApiToken.issue(factories.make_user('op', admin=True), name='t')[1])"],
                           cwd=ROOT, env=env, check=True, timeout=120, capture_output=True, text=True).stdout.split()[-1]
    port = free_port()
    tree = Tree()
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--only", "web", f"127.0.0.1:{port}"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tree.groups.add(os.getpgid(proc.pid))
    tree.pids.add(proc.pid)

    def get(path: str, **headers: str) -> tuple[int, bytes, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (loopback)
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read(), dict(refused.headers)

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if get("/accounts/login/")[0] == 200:
                    break
            time.sleep(0.3)
        auth = {"Authorization": f"Bearer {token}"}
        assert get("/v1/threads", **auth)[0] == 200
        database.rename(tmp_path / "moved.sqlite3")
        for _ in range(4):  # both workers, whichever answers
            status, body, headers = get("/v1/threads", **auth)
            assert (status, json.loads(body)["code"], headers["Retry-After"]) == (503, "database_unavailable", "30")
        assert not database.exists()
    finally:
        tree.cleanup()


@pytest.mark.django_db(transaction=True)
def test_a_postgresql_connection_ended_by_the_server_is_503_unavailable_on_pages_and_the_api():
    """The server ends the web process's connection (a restart, an administrator): the request
    that finds it gone answers 503 database_unavailable with Retry-After (a page: the plain 503
    page), not the 500 that says part of the request may have been done; the next one works."""
    from django.db import connection
    from django.test import Client

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: a server that ends a connection (SQLite: the test above)")
    from console.models import ApiToken
    from tests import factories

    admin = factories.make_user("unavailable-admin", admin=True)
    _token, raw = ApiToken.issue(admin, name="t")
    client = Client(raise_request_exception=False)  # as a server answers: through the error handlers
    client.force_login(admin)
    for path, headers in (("/settings/system/data-storage/", {}), ("/v1/threads", {"HTTP_AUTHORIZATION": f"Bearer {raw}"})):
        assert client.get(path, **headers).status_code == 200
        factories.end_database_session()
        try:
            answer = client.get(path, **headers)
        finally:
            connection.close()  # as Django does at the end of a request whose connection broke
        assert (answer.status_code, answer["Retry-After"]) == (503, "30")
        if path.startswith("/v1/"):
            assert answer.json()["code"] == "database_unavailable"
        else:
            assert "The database cannot be reached" in answer.content.decode()
        assert client.get(path, **headers).status_code == 200


@pytest.mark.parametrize("where", ["unreachable", "not_migrated"])
def test_api_tokens_list_prints_nothing_on_stdout_when_the_database_cannot_be_read(tmp_path, where):
    """`api_tokens list` printed its table header on standard output, then failed with "cannot be
    reached" (exit 2): a script read a header as an empty list. Now standard output is empty."""
    url = (f"postgres://lethe:s3cret@127.0.0.1:{closed_port()}/lethe" if where == "unreachable"
           else f"sqlite:///{tmp_path}/missing.sqlite3")
    result = subprocess.run([sys.executable, "manage.py", "api_tokens", "list"], cwd=ROOT,
                            env=_env(tmp_path, DATABASE_URL=url), capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1 and lines[0].startswith("Lethe database error: The database ")
    assert ("cannot be reached" if where == "unreachable" else "has no Lethe tables") in lines[0]
