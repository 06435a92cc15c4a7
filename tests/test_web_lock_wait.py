"""On PostgreSQL a web request waits at most DB_LOCK_WAIT_SECONDS for a lock, then answers the
503 `database_busy` page or API answer, as SQLite's requests do after their 20 s wait for the
write lock; the job cluster and management commands keep waiting for as long as a lock is held
(console/web_database.py). A real web server (`serve --only web`: gunicorn, and `--dev`:
runserver) against the test database, another real connection holding the lock an erasure's
VACUUM FULL takes, a real job cluster."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone
from django_q.models import Task
from django_q.tasks import async_task

from console.models import ApiToken
from lifecycle import models as m
from tests import factories
from tests.test_jobs import database_url, running_cluster
from tests.test_serve import ROOT, Tree, children_of, free_port, wait_until
from tests.test_settings_env import load, refused

WAIT = 1  # DB_LOCK_WAIT_SECONDS of the server under test
BOUND = WAIT + 10  # an answer comes within this (generous) time


def the_lock_wait() -> str:
    """A job: the wait its connection has for a lock (PostgreSQL's lock_timeout, SQLite's
    busy_timeout in milliseconds)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout" if connection.vendor == "postgresql" else "PRAGMA busy_timeout")
        return str(cursor.fetchone()[0])


def pg_connect() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"],
                           password=s["PASSWORD"] or None)


def call(port: int, method: str, path: str, body: dict | None = None, **headers: str):
    """(status, headers, body, seconds taken); a request not answered within BOUND fails."""
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        headers["Content-Type"] = "application/json"
    started = time.monotonic()
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
    try:
        client.request(method, path, body=data, headers=headers)
        answer = client.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read(), time.monotonic() - started
    finally:
        client.close()


def other_backends(*besides: int) -> set[int]:
    """The server's connections to the test database: every backend but this test's own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return {pid for (pid,) in cursor.fetchall()} - set(besides)


@pytest.fixture
def web_server(tmp_path, engine_home):
    """Starts `serve --only web [--dev]` on the test database with DB_LOCK_WAIT_SECONDS=1, one
    worker process of one thread; kills what it started, whatever happens."""
    tree = Tree()

    def start(*options: str) -> int:
        port = free_port()
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
               "SECRET_KEY": settings.SECRET_KEY, "ENGINE_HOME": str(engine_home), "LETHE_VAR_DIR": str(tmp_path),
               "STATIC_ROOT": str(tmp_path / "static"), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
               "DB_LOCK_WAIT_SECONDS": str(WAIT), "WEB_CONCURRENCY": "1", "WEB_THREADS": "1", "LOG_FORMAT": "json"}
        proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--only", "web",
                                 *options], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        tree.pids.add(proc.pid)
        tree.groups.add(proc.pid)

        def up() -> bool:
            for kid in children_of(proc.pid):
                tree.pids.add(kid)
                with contextlib.suppress(ProcessLookupError):
                    tree.groups.add(os.getpgid(kid))
            with contextlib.suppress(OSError):
                return call(port, "GET", "/accounts/login/")[0] == 200
            return False
        assert wait_until(up, 90), "the web server did not answer"
        return port

    yield start
    tree.cleanup()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", [(), ("--dev",)], ids=["gunicorn", "runserver"])
def test_a_web_request_waits_a_bounded_time_for_a_lock_then_answers_busy(web_server, server):
    admin = factories.make_user("web-lock-admin", admin=True)
    conversation = factories.make_conversation(title="Held")
    factories.add_message(conversation, content="first")
    _token, raw = ApiToken.issue(admin, name="lock wait")
    browser = Client()
    browser.force_login(admin)
    page = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}",
            "Accept-Language": "es"}
    api = {"Authorization": f"Bearer {raw}", "Accept-Language": "es"}
    items = f"/v1/threads/{conversation.public_id}/items"
    port = web_server(*server)
    assert call(port, "GET", "/conversations/", **page)[0] == 200
    assert call(port, "GET", f"/v1/threads/{conversation.public_id}", **api)[0] == 200

    if connection.vendor == "sqlite":
        # The setting is PostgreSQL's: a write still waits for SQLite's write lock as long as
        # before (20 s), so one held for 3 s is waited for, well past DB_LOCK_WAIT_SECONDS.
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(3, holder.execute, ["ROLLBACK"])
        release.start()
        try:
            status, _headers, body, took = call(port, "POST", items, {"role": "user", "content": "second"}, **api)
        finally:
            release.join()
            holder.close()
        assert status == 201, body
        assert took > 2.5
        assert list(m.Item.objects.filter(conversation=conversation).values_list("content", flat=True)) == [
            "first", "second"]
        return

    before = other_backends()
    # What finish_erasure's VACUUM FULL takes: the conversations table, for reads as well.
    holder = pg_connect()
    try:
        holder.execute("LOCK TABLE lifecycle_conversation IN ACCESS EXCLUSIVE MODE")
        status, headers, body, took = call(port, "GET", "/conversations/", **page)
        assert status == 503 and headers["Retry-After"] == "5", body[:300]
        assert "La base de datos está ocupada" in body.decode()
        assert WAIT - 0.2 < took < BOUND
        status, headers, body, took = call(port, "POST", items, {"role": "user", "content": "second"}, **api)
        assert status == 503 and headers["Retry-After"] == "5", body[:300]
        assert json.loads(body)["code"] == "database_busy"
        assert json.loads(body)["message"].startswith("La base de datos")
        assert WAIT - 0.2 < took < BOUND
        status, _headers, body, took = call(port, "GET", f"/v1/threads/{conversation.public_id}", **api)
        assert status == 503 and json.loads(body)["code"] == "database_busy" and took < BOUND
        if not server:
            # gunicorn's one thread kept its connection (CONN_MAX_AGE) through the busy answers:
            # no connection was opened for them, and the kept one still had the wait.
            assert other_backends(holder.info.backend_pid) == before
    finally:
        holder.rollback()
        holder.close()
    # Once the lock is gone the same requests are answered as usual, and nothing was stored meanwhile.
    assert list(m.Item.objects.filter(conversation=conversation).values_list("content", flat=True)) == ["first"]
    assert call(port, "GET", "/conversations/", **page)[0] == 200
    assert call(port, "POST", items, {"role": "user", "content": "second"}, **api)[0] == 201
    assert list(m.Item.objects.filter(conversation=conversation).values_list("content", flat=True)) == [
        "first", "second"]


@pytest.mark.django_db(transaction=True)
def test_the_job_cluster_and_management_commands_keep_waiting_as_long_as_a_lock_is_held(engine_home):
    """Their connections are opened outside the web entry: no lock_timeout (PostgreSQL's
    default, 0: no limit), whatever DB_LOCK_WAIT_SECONDS says; SQLite's stays 20 s."""
    expected = "0" if connection.vendor == "postgresql" else "20000"
    assert the_lock_wait() == expected  # this process (tests, management commands) opened its own
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1", "DB_LOCK_WAIT_SECONDS": str(WAIT)}
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            "from tests.test_web_lock_wait import the_lock_wait; print(the_lock_wait())"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr[-2000:]
    assert shell.stdout.split()[-1] == expected
    task_id = async_task("tests.test_web_lock_wait.the_lock_wait")
    with running_cluster(env):
        assert wait_until(lambda: Task.objects.filter(id=task_id).exists(), 90), "the job did not run"
    task = Task.objects.get(id=task_id)
    assert task.success, task.result
    assert task.result == expected


@pytest.mark.django_db(transaction=True)
def test_token_bookkeeping_waits_only_briefly_for_a_lock(api, admin_user):
    """A token's last-use write (console.busy.waiting_at_most, 0.05 s) is skipped when its row
    or the database is held, and the read goes on at once, also on a connection that would wait
    without limit (this process's, outside the web entry)."""
    conversation = factories.make_conversation()
    token = ApiToken.objects.get(user=admin_user)
    assert token.last_used_at is None
    if connection.vendor == "sqlite":
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(5, holder.execute, ["ROLLBACK"])
    else:
        holder = pg_connect()
        holder.execute("SELECT 1 FROM console_apitoken WHERE id = %s FOR UPDATE", [token.pk])
        release = threading.Timer(5, holder.rollback)
    release.start()
    try:
        started = time.monotonic()
        answer = api.get(f"/v1/threads/{conversation.public_id}")
        took = time.monotonic() - started
    finally:
        release.join()
        holder.close()
    assert answer.status_code == 200
    assert took < 2.5
    token.refresh_from_db()
    assert token.last_used_at is None  # skipped; recorded on a later request
    assert connection.vendor == "sqlite" or the_lock_wait() == "0"  # the connection's own wait is back
    api.get(f"/v1/threads/{conversation.public_id}")
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at <= timezone.now()


@pytest.mark.django_db(transaction=True)
def test_the_wait_inside_a_transaction_is_put_back_when_the_block_ends():
    """Nested in another transaction, the block's short wait ends with it (SET LOCAL would
    otherwise last until the outer transaction ends)."""
    from django.db import transaction

    from console.busy import waiting_at_most

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock_timeout")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '7s'")
        with waiting_at_most(0.05):
            assert the_lock_wait() == "50ms"
        assert the_lock_wait() == "7s"
    assert the_lock_wait() == "0"
    with waiting_at_most(0.25):
        assert the_lock_wait() == "250ms"
    assert the_lock_wait() == "0"


@pytest.mark.parametrize("value", ["0", "-1", "601", "soon", "nan"])
def test_a_lock_wait_it_cannot_use_is_refused_by_name(monkeypatch, tmp_path, value):
    assert refused(monkeypatch, tmp_path, DB_LOCK_WAIT_SECONDS=value) == (
        f"DB_LOCK_WAIT_SECONDS must be a number of seconds from 0.1 to 600, not {value!r}.")


def test_the_lock_wait_is_20_seconds_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("DB_LOCK_WAIT_SECONDS", raising=False)
    assert load(monkeypatch, tmp_path).DB_LOCK_WAIT_SECONDS == 20
    assert load(monkeypatch, tmp_path, DB_LOCK_WAIT_SECONDS=" ").DB_LOCK_WAIT_SECONDS == 20
    assert load(monkeypatch, tmp_path, DB_LOCK_WAIT_SECONDS="2.5").DB_LOCK_WAIT_SECONDS == 2.5
    # SQLite's own wait for its write lock is not this setting's.
    sqlite = load(monkeypatch, tmp_path, DB_LOCK_WAIT_SECONDS="1").DATABASES["default"]["OPTIONS"]
    assert sqlite["timeout"] == 20 and "PRAGMA busy_timeout=20000;" in sqlite["init_command"]
