"""A PostgreSQL database that takes no writes (r114): a standby, or one whose transactions are
read-only (SQLSTATE 25006: default_transaction_read_only on for the database, or in
DATABASE_URL's options), or a user without the privileges on Lethe's tables (42501).

`serve` started on it, and the job cluster too; every API call answered 500 internal_error
("part of the request may have been done": nothing could be), GETs included (the token's
last-use write); signing in was a 500 page; `api_tokens create`, `users create` and, for a user
without grants, every command ended in a traceback. Now `serve` and the job cluster stop at start
with one line (exit status 2), commands end in one line, and a request the database refuses
answers 503 `database_unavailable` with Retry-After and words that say why. PostgreSQL only: a
scratch database migrated once for the module, and a user made and dropped by the tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from django.db import connection

from tests import factories

ROOT = Path(__file__).resolve().parent.parent

READ_ONLY_LINE = ("Lethe database error: The database {name} is read-only: its transactions are read-only "
                  "(default_transaction_read_only is on, in DATABASE_URL's options or for the server, the database or "
                  "the user). {done}Turn it off, or set DATABASE_URL to a database that takes writes, then {then}.")
COMMAND_DONE = "The step the command was taking was not written; what it finished before stays. "


def _base_name() -> str:
    """The name of the database DATABASE_URL names (the tests' own is made from it): scratch
    databases and users are named after it."""
    return unquote(urlsplit(os.environ.get("DATABASE_URL", "")).path.lstrip("/")) or "lethe"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A migrated PostgreSQL database beside the tests' own, with an admin `op`; and a user with
    no privileges at all on it. Yields (admin connection, database name, user name, URL of the
    owner, URL of that user)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("PostgreSQL: a database that takes no writes (SQLite: tests/test_read_only_storage.py)")
    import psycopg

    name, user = f"{_base_name()}_ro_{os.getpid()}"[:63], f"{_base_name()}_nowrite_{os.getpid()}"[:63]
    host, port = database["HOST"] or "127.0.0.1", database["PORT"] or 5432
    admin = psycopg.connect(host=host, port=port, user=database["USER"], password=database["PASSWORD"] or None,
                            dbname="postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'DROP ROLE IF EXISTS "{user}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    admin.execute(f'CREATE ROLE "{user}" LOGIN')
    owner_url, user_url = f"postgres://{database['USER']}@{host}:{port}/{name}", f"postgres://{user}@{host}:{port}/{name}"
    try:
        env = _env(tmp_path_factory.mktemp("scratch"), owner_url)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=600)
        subprocess.run([sys.executable, "manage.py", "users", "create", "op", "--role", "admin", "--password-stdin"],
                       cwd=ROOT, env=env, input="pw-op-1234567\n", text=True, check=True, timeout=120,
                       capture_output=True)
        yield admin, name, user, owner_url, user_url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'DROP ROLE IF EXISTS "{user}"')
        admin.close()


def _env(tmp_path: Path, url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "lethe-engine"), PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"),
               DATABASE_URL=url)
    return env


def _one_line(tmp_path: Path, url: str, *args: str, stdin: str | None = None) -> str:
    """`manage.py *args` against `url`: exit status 2, no traceback; its one stderr line (JSON log
    lines left out). `serve` and `qcluster` that start instead run until the timeout."""
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=_env(tmp_path, url),
                            input=stdin, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr[-3000:])
    lines = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1, (args, result.stderr[-3000:])
    return lines[0]


def _start() -> list[tuple[str, ...]]:
    from tests.test_serve import free_port

    return [("serve", f"127.0.0.1:{free_port()}"), ("qcluster",)]


def test_serve_and_the_job_cluster_stop_at_start_on_a_read_only_database(scratch, tmp_path):
    admin, name, _user, owner_url, _user_url = scratch
    read_only_url = f"{owner_url}?options=-c%20default_transaction_read_only%3Don"
    expected = READ_ONLY_LINE.format(name=name, done="", then="start again")
    for command in _start():
        assert _one_line(tmp_path, read_only_url, *command) == expected
    # Stored for the database (as on a server whose every database is read-only): the same.
    admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        for command in _start():
            assert _one_line(tmp_path, owner_url, *command) == expected
    finally:
        admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    assert not (tmp_path / "lethe-engine").exists()  # serve stopped before it made anything


def test_commands_that_write_end_in_one_line_on_a_read_only_database(scratch, tmp_path):
    _admin, name, _user, owner_url, _user_url = scratch
    read_only_url = f"{owner_url}?options=-c%20default_transaction_read_only%3Don"
    expected = READ_ONLY_LINE.format(name=name, done=COMMAND_DONE, then="run the command again")
    assert _one_line(tmp_path, read_only_url, "api_tokens", "create", "op", "--name", "ro") == expected
    assert _one_line(tmp_path, read_only_url, "users", "create", "bob", "--role", "admin", "--password-stdin",
                     stdin="pw-bob-1234567\n") == expected


def test_a_user_without_privileges_stops_serve_and_every_command_in_one_line(scratch, tmp_path):
    admin, name, user, owner_url, user_url = scratch
    for command in _start():  # no privilege at all: serve read a table first, and said nothing of why
        line = _one_line(tmp_path, user_url, *command)
        assert line.startswith(f"Lethe database error: The database user {user} cannot read or write the table "), line
        assert f" of the database {name} (it lacks SELECT, INSERT, UPDATE, DELETE on it); it lacks privileges on " in line
        assert line.endswith("more of Lethe's tables too. Grant it SELECT, INSERT, UPDATE and DELETE on all of "
                             "Lethe's tables (or set DATABASE_URL to the user that ran manage.py migrate), then start "
                             "again."), line
    assert _one_line(tmp_path, user_url, "api_tokens", "list") == (
        f"Lethe database error: The database {name} did not allow its user what the command needed (permission denied "
        f"for table console_apitoken). {COMMAND_DONE}Grant that user SELECT, INSERT, UPDATE and DELETE on all of "
        "Lethe's tables (or set DATABASE_URL to the user that ran manage.py migrate), then run the command again.")
    with psycopg_to(scratch) as db:  # reads, and every table but one written
        db.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{user}"')
        db.execute(f'GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{user}"')
        db.execute(f'REVOKE INSERT, UPDATE, DELETE ON console_apitoken FROM "{user}"')
    assert _one_line(tmp_path, user_url, *_start()[0]) == (
        f"Lethe database error: The database user {user} cannot write the table console_apitoken of the database "
        f"{name} (it lacks INSERT, UPDATE, DELETE on it). Grant it SELECT, INSERT, UPDATE and DELETE on all of "
        "Lethe's tables (or set DATABASE_URL to the user that ran manage.py migrate), then start again.")
    assert _one_line(tmp_path, user_url, "api_tokens", "create", "op", "--name", "x").startswith(
        f"Lethe database error: The database {name} did not allow its user what the command needed (permission denied "
        "for table console_apitoken). ")
    assert not (tmp_path / "lethe-engine").exists()


@contextlib.contextmanager
def psycopg_to(scratch):
    """A connection to the scratch database as its owner (autocommit)."""
    import psycopg

    admin = scratch[0]
    info = admin.info
    with psycopg.connect(host=info.host, port=info.port, user=info.user, password=info.password or None,
                         dbname=scratch[1], autocommit=True) as db:
        yield db


# At request time: the tests' own database made read-only, or the web process's connection
# switched to a user with reads only (SET ROLE lasts for the connection the test client keeps).

@pytest.fixture
def requests_setup(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: a database that takes no writes")
    from django.test import Client

    from console.models import ApiToken
    admin = factories.make_user("ro-admin", admin=True, password="pw-ro-admin-123")
    token, raw = ApiToken.issue(admin, name="t")
    conversation = factories.make_conversation(title="c")
    client = Client(raise_request_exception=False)  # as a server answers: through the error handlers
    return client, token, raw, conversation


def _answers(client, raw: str, conversation) -> dict:
    """What a read, a write and a sign-in answer."""
    from console.models import ApiToken

    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    before = ApiToken.objects.get().last_used_at
    read = client.get("/v1/threads?limit=1", **auth)
    written = client.post(f"/v1/threads/{conversation.public_id}/items", {"role": "user", "content": "hello"},
                          content_type="application/json", **auth)
    signed_in = client.post("/accounts/login/", {"username": "ro-admin", "password": "pw-ro-admin-123"})
    return {"read": read, "written": written, "signed_in": signed_in, "last_used_before": before}


READ_ONLY_API = ("The database is read-only now (a standby server, or one set read-only): nothing of this request "
                 "was done. Try again later; if this lasts, an operator must point Lethe at a database that takes "
                 "writes.")


def test_a_request_to_a_read_only_database_is_503_unavailable_saying_nothing_was_done(requests_setup):
    from console.models import ApiToken
    from lifecycle.models import Item

    client, _token, raw, conversation = requests_setup
    with factories.database_read_only():
        got = _answers(client, raw, conversation)
    assert got["read"].status_code == 200  # reads go on: the token's last use is not recorded
    assert ApiToken.objects.get().last_used_at == got["last_used_before"]
    written = got["written"]
    assert (written.status_code, written["Retry-After"], written.json()) == (
        503, "30", {"code": "database_unavailable", "message": READ_ONLY_API})
    assert not Item.objects.filter(conversation=conversation).exists()
    page = got["signed_in"]
    assert (page.status_code, page["Retry-After"]) == (503, "30")
    body = page.content.decode()
    assert "The database takes no writes" in body and "nothing of this request was done" in body
    assert "_auth_user_id" not in client.session


def test_a_request_refused_for_want_of_privileges_is_503_unavailable(requests_setup):
    from console.models import ApiToken

    client, _token, raw, conversation = requests_setup
    user = f"{_base_name()}_reader_{os.getpid()}"[:63]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{user}"')
        cursor.execute(f'CREATE ROLE "{user}"')
        cursor.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{user}"')
        cursor.execute(f'SET ROLE "{user}"')
    try:
        got = _answers(client, raw, conversation)
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")  # as the grantor
            cursor.execute(f'REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM "{user}"')
            cursor.execute(f'SET ROLE "{user}"')
        unread = client.get("/v1/threads?limit=1", HTTP_AUTHORIZATION=f"Bearer {raw}")  # not even the token
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f'REASSIGN OWNED BY "{user}" TO CURRENT_USER')
            cursor.execute(f'DROP OWNED BY "{user}"')
            cursor.execute(f'DROP ROLE "{user}"')
    assert got["read"].status_code == 200
    assert ApiToken.objects.get().last_used_at == got["last_used_before"]
    message = ("The database did not allow Lethe's database user what this request needed (permission denied), so "
               "it could not be done. Read the current state before you try again; if this lasts, an operator must "
               "grant that user Lethe's tables.")
    for answer in (got["written"], unread):
        assert (answer.status_code, answer["Retry-After"], answer.json()) == (
            503, "30", {"code": "database_unavailable", "message": message})
    page = got["signed_in"]
    assert page.status_code == 503 and "The database refused access" in page.content.decode()


def test_a_request_to_a_read_only_database_is_said_in_spanish(requests_setup):
    client, _token, raw, conversation = requests_setup
    with factories.database_read_only():
        answer = client.post(f"/v1/threads/{conversation.public_id}/items", {"role": "user", "content": "hola"},
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}",
                             HTTP_ACCEPT_LANGUAGE="es")
        page = client.post("/accounts/login/", {"username": "ro-admin", "password": "pw-ro-admin-123"},
                           HTTP_ACCEPT_LANGUAGE="es")
    assert answer.status_code == 503 and answer.json()["code"] == "database_unavailable"
    assert answer.json()["message"].startswith("La base de datos es de solo lectura en este momento (un servidor en "
                                               "espera, o una configurada como de solo lectura): no se hizo nada de "
                                               "esta solicitud.")
    assert page.status_code == 503 and "La base de datos no admite escrituras" in page.content.decode()


@pytest.mark.django_db
def test_serve_says_a_standby_is_one(monkeypatch):
    """A standby in recovery (pg_is_in_recovery(), as /readyz reads it: a replica named by
    mistake) cannot be made here; its answer stands in."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: a standby")
    from console.management.commands.serve import database_cannot_be_written
    from ops import health

    monkeypatch.setattr(health, "_postgresql_write_error", lambda: "in_recovery")
    assert database_cannot_be_written() == (
        f"The database {connection.settings_dict['NAME']} is a standby in recovery (a read-only replica): Lethe "
        "cannot write to it. Set DATABASE_URL to the primary server, then start again.")
    monkeypatch.undo()
    assert database_cannot_be_written() is None  # the tests' own database takes writes
