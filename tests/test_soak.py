"""`manage.py soak` at a small size: two web servers and two job clusters on one PostgreSQL
database, a mixed API load over both, one cluster SIGKILLed and restarted, then the books.

The soak itself runs only in the PostgreSQL suite: it exercises several hosts sharing one
database, which SQLite (one host's database, docs/deploy.md) is not meant for. Its refusals run
on both engines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import Task

from lifecycle.actions.append_item import append_item
from lifecycle.models import Conversation, DeleteOperation, Item
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
    cleanup = figures["cleanup"]
    assert (cleanup["starts"], cleanup["admitted"], cleanup["refused_busy"], cleanup["cleanup_operations"]) == (2, 1, 1, 1)
    assert cleanup["state"] == "succeeded" and cleanup["removed_messages"] == cleanup["eligible"] > 0


def test_it_refuses_a_database_that_is_not_a_postgresql_soak_database(tmp_path):
    sqlite = soak(tmp_path, f"sqlite:///{tmp_path / 'soak.sqlite3'}", "--seconds", "5", timeout=120)
    assert sqlite.returncode == 1 and "needs DATABASE_URL to name a PostgreSQL database" in sqlite.stderr
    assert json.loads(sqlite.stdout)["failed"]
    if ON_POSTGRES:  # a real database is never dropped: the name must say it is a soak's
        base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
        other = soak(tmp_path, f"{base}/lethe_not_this_one", "--seconds", "5", timeout=120)
        assert other.returncode == 1 and "does not look like a soak database" in other.stderr


# ---- The books the soak keeps catch what they are for (both engines, in-process) -----------

TAMPERINGS = {
    "lost append": lambda s: Item.objects.filter(content=s.appended[0][1]).delete(),
    "duplicated append": lambda s: append_item(Conversation.objects.get(public_id=s.work[0][0]), role="user",
                                               content=s.appended[1][1]),
    "unacknowledged append": lambda s: append_item(Conversation.objects.get(public_id=s.work[0][0]), role="user",
                                                   content="soak:0:99:never-answered"),
    "lost archive": lambda s: Conversation.objects.filter(public_id=s.work[0][0]).update(archived_at=None),
    "doubly counted erasure": lambda s: DeleteOperation.objects.update(
        receipt={"stores": [{"store": "lifecycle.Item", "records": 6}]}),
    "operation not completed": lambda s: DeleteOperation.objects.update(state="pending"),
    "other operation answered": lambda s: s.repeats.update(dict.fromkeys(s.repeats, "op_" + "0" * 20)),
    "failed job": lambda s: Task.objects.create(id="t" * 32, name="x", func="lifecycle.tasks.erase",
                                                started=timezone.now(), stopped=timezone.now(), success=False),
    "request error": lambda s: s.recorder.error("append", "POST /v1/threads/x/items: 500"),
}
EXPECTED = {
    "lost append": "1 lost appends", "duplicated append": "1 duplicated appends",
    "unacknowledged append": "1 stored but never acknowledged", "lost archive": "archived should be True",
    "doubly counted erasure": "receipt counts items [6], 3 were stored",
    "operation not completed": "operation pending", "other operation answered": "answered op_",
    "failed job": "1 failed job(s)", "request error": "1 request error(s)",
}


@pytest.fixture
def books(db, admin_user):
    """A soak's books after a small honest run, kept by hand: three acknowledged appends, one
    archive, one delete erased once."""
    from lifecycle.deletion import executor
    from lifecycle.engine import get_engine
    from ops.soak import Soak
    from tests import factories

    s = Soak(seconds=10, clients=1, settle_seconds=1, out=lambda line: None)
    work = factories.make_conversation(title="Soak work")
    doomed = factories.make_conversation(title="Soak doomed")
    for n in range(3):
        factories.add_message(doomed, content=f"doomed {n}")
        text = f"soak:0:{n}:{uuid.uuid4().hex}"
        s.appended.append((work.public_id, text, append_item(work, role="user", content=text).pk))
    get_engine().set_archived(work.public_id, True, actor=admin_user)
    s.archived[work.public_id] = True
    op = get_engine().request_delete(doomed.public_id, key="soak-test-key", actor=admin_user)
    executor.run_erasure(DeleteOperation.objects.get(public_id=op.id).pk)
    s.work, s.doomed, s.seeded_items = [[work.public_id]], [[(doomed.public_id, 3)]], {doomed.public_id: 3}
    s.deletes, s.repeats = {doomed.public_id: op.id}, {doomed.public_id: op.id}
    return s


def test_honest_books_pass(books):
    books.check_books()
    assert books.figures["appends_acknowledged"] == books.figures["appends_stored"] == 3
    assert books.figures["delete_operations"] == 1 and books.figures["jobs_failed"] == 0


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_the_books_catch_each_kind_of_lost_or_doubled_work(books, tampering):
    from ops.soak import SoakFailed

    TAMPERINGS[tampering](books)
    with pytest.raises(SoakFailed, match=re.escape(EXPECTED[tampering])):
        books.check_books()
    assert EXPECTED[tampering] in " ".join(books.figures["violations"])


def test_the_cleanup_books_catch_a_second_cleanup_operation(db):
    from ops.soak import Soak, SoakFailed
    from retention.models import ToolPayloadOperation

    s = Soak(seconds=10, clients=1, settle_seconds=1, out=lambda line: None)
    s.figures["cleanup"] = {"state": "succeeded", "removed_messages": 0}
    ToolPayloadOperation.objects.create(kind="cleanup", state="succeeded", slot=None)
    s.cleanup_checked()
    ToolPayloadOperation.objects.create(kind="cleanup", state="succeeded", slot=None)
    with pytest.raises(SoakFailed, match="2 cleanup operation"):
        s.cleanup_checked()
    s.cleanup_failure = "two cleanup starts at once answered [(202, ...), (202, ...)]"
    with pytest.raises(SoakFailed, match="two cleanup starts"):
        s.cleanup_checked()
