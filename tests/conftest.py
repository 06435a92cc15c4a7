from __future__ import annotations

import os
import re

import pytest
from django.test import Client
from django.utils import translation

from tests import factories


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, django_db_blocker) -> None:
    """Before the test database is made (pytest-django's hook, kept as it was): on PostgreSQL,
    drop the test databases of earlier runs on this machine whose process is gone (a killed
    run leaves its `test_<name>_<pid>` behind); a running one's is kept."""
    from django.conf import settings
    from django.db import connections

    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        return
    ours = re.compile(rf"test_{re.escape(db['NAME'])}_(\d+)")
    with django_db_blocker.unblock(), connections["default"]._nodb_cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test\\_%%'")
        for (name,) in cursor.fetchall():
            match = ours.fullmatch(name)
            if match and int(match[1]) != os.getpid() and not os.path.exists(f"/proc/{match[1]}"):
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(autouse=True)
def language_of_the_thread():
    """Each test starts in the default language: a request in Spanish leaves Spanish active in
    the thread that served it (the test's own, with the test client) until another request
    activates another, so a later test that reads text without a request would read Spanish."""
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def polled_size_forgotten():
    """The status poller's database figures (kept a few seconds per process) are not carried
    from one test's database into the next."""
    yield
    from retention.views import _PolledSize

    _PolledSize.key = None


@pytest.fixture(autouse=True)
def engine_home(settings, tmp_path, request):
    """Every test gets its own real engine folder. A test with a database starts as an install
    does once `serve` has run: the folder marked as its database's before any conversation
    exists (lifecycle.engine_folder; tests/test_engine_folder.py starts from other states)."""
    settings.ENGINE_HOME = tmp_path / "engine"
    settings.ENGINE_HOME.mkdir()
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or "live_server" in request.fixturenames or (
        marker is not None and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))
    if marker is not None or {"db", "transactional_db"} & set(request.fixturenames):
        request.getfixturevalue("transactional_db" if transactional else "db")
        from lifecycle import engine_folder
        from lifecycle.models import RetainedFactsPolicy
        from retention.models import ToolPayloadPolicy

        engine_folder.adopt(force=False)
        # The settings rows migrate makes (a transactional test's flush removed them).
        RetainedFactsPolicy.objects.get_or_create(id=1)
        ToolPayloadPolicy.objects.get_or_create(id=1)
    return settings.ENGINE_HOME


@pytest.fixture
def admin_user(db):
    return factories.make_user("alice", admin=True)


@pytest.fixture
def member_user(db):
    return factories.make_user("bob", admin=False)


@pytest.fixture
def admin_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def member_client(member_user) -> Client:
    client = Client()
    client.force_login(member_user)
    return client


def token_client(user) -> Client:
    """A client of the JSON API with a bearer token of `user`, as scripts and apps call it."""
    from console.models import ApiToken

    _token, raw = ApiToken.issue(user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")


@pytest.fixture
def api(admin_user) -> Client:
    return token_client(admin_user)


@pytest.fixture
def member_api(member_user) -> Client:
    return token_client(member_user)


@pytest.fixture
def conversation(db):
    return factories.make_conversation(title="Fix flaky login test")


@pytest.fixture
def parses(monkeypatch):
    """The fleet files parsed, by path (a fresh cache, so earlier tests' parses do not count)."""
    from lifecycle import enginefs

    seen: list[str] = []
    parse = enginefs._parse_fleet
    monkeypatch.setattr(enginefs, "_parsed", {})
    monkeypatch.setattr(enginefs, "_parse_fleet", lambda path, data: seen.append(str(path)) or parse(path, data))
    return seen
