from __future__ import annotations

import os
import re

import pytest
from django.core.servers.basehttp import WSGIRequestHandler
from django.test import Client
from django.utils import translation

from tests import factories

# Django's test server (live_server) writes an answer's head and its body apart: with Nagle's
# algorithm on, the body waits for the client's delayed acknowledgement of the head, about
# 40 ms an answer on Linux (schemathesis's 1,700 requests spent 85 s in it). The test server's
# connections send at once (TCP_NODELAY); what they send is unchanged.
WSGIRequestHandler.disable_nagle_algorithm = True


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, django_db_blocker):
    """Before the test database is made (pytest-django's hook, kept as it was): this process's
    own folder for a SQLite test database and for backups (tests/database_folder.py); on
    PostgreSQL, drop the test databases of earlier runs on this machine whose process is gone
    (a killed run leaves its `test_<name>_<pid>` behind); a running one's is kept."""
    from django.conf import settings
    from django.db import connections

    from tests.database_folder import own_test_folder

    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.postgresql":
        ours = re.compile(rf"test_{re.escape(db['NAME'])}_(\d+)")
        with django_db_blocker.unblock(), connections["default"]._nodb_cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test\\_%%'")
            for (name,) in cursor.fetchall():
                match = ours.fullmatch(name)
                if match and int(match[1]) != os.getpid() and not os.path.exists(f"/proc/{match[1]}"):
                    cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
    with own_test_folder(connections["default"].settings_dict, settings.VAR_DIR):
        yield


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


@pytest.fixture
def unwritable_engine_folder(monkeypatch, engine_home):
    """`refuse(errno.EROFS)` (a read-only mount) or `refuse(errno.ENOSPC)` (a full disk): from
    then on every change in the engine folder fails with that errno, as the kernel's would
    (opening a file for writing or creating it, making, removing or renaming an entry);
    reads go on, and on EROFS the folder's disk reads as mounted read-only (`os.statvfs`).
    `refuse(None)` makes it writable again. At the os functions themselves, so
    whichever way the code opens (a path, or a folder's descriptor) meets it."""
    import errno as errnos

    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    tmpfile = getattr(os, "O_TMPFILE", 0)  # (it holds O_DIRECTORY's bit: only the whole of it is a write)
    root = os.path.realpath(engine_home)
    refused: dict[str, int | None] = {"errno": None}

    def inside(path, dir_fd=None) -> bool:
        if isinstance(path, int):  # a descriptor: the file it is
            path, dir_fd = os.readlink(f"/proc/self/fd/{path}"), None
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        path = os.path.abspath(path)
        return path == root or path.startswith(root + os.sep)

    def check(path, dir_fd=None) -> None:
        code = refused["errno"]
        if code is not None and inside(path, dir_fd):
            raise OSError(code, os.strerror(code), os.fsdecode(path) if not isinstance(path, int) else None)

    def guard(name: str, folders: tuple[str, ...] = ("dir_fd",)):
        real = getattr(os, name)

        def changed(*args, **kwargs):
            for path, folder in zip(args, folders, strict=False):
                check(path, kwargs.get(folder))
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, changed)

    real_open = os.open

    def opened(path, flags, mode=0o777, *, dir_fd=None):
        if flags & writing or (tmpfile and flags & tmpfile == tmpfile):
            check(path, dir_fd)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opened)
    for name in ("mkdir", "unlink", "remove", "rmdir"):
        guard(name)
    for name in ("rename", "replace", "link"):
        guard(name, ("src_dir_fd", "dst_dir_fd"))

    real_statvfs = os.statvfs

    def statvfs(path):  # what a preview asks, writing nothing: a read-only mount's flag
        seen = real_statvfs(path)
        if refused["errno"] == errnos.EROFS and inside(path):
            return os.statvfs_result((*seen[:8], seen.f_flag | os.ST_RDONLY, seen.f_namemax))
        return seen

    monkeypatch.setattr(os, "statvfs", statvfs)

    def refuse(code: int | None = errnos.EROFS) -> None:
        refused["errno"] = code

    return refuse
