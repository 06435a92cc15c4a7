"""The console against a real second Lethe process serving the engine API (issue 7).

One engine process per module (its own SQLite file and engine folder, `serve --dev` on a
loopback port in 8150-8169: web server and job cluster). The console is this test process,
on SQLite or PostgreSQL as the suite runs, talking HTTP to it through `HttpEngine`; where a
test is about jobs, the console's own django-q2 cluster runs as a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import ProtectedError
from django.test import Client

from console.models import ApiToken
from lifecycle.engine import get_engine
from lifecycle.engine.http import EngineUnreachable, EngineUnsupported, HttpEngine
from lifecycle.engine.inprocess import InProcessEngine
from lifecycle.errors import ActionRefused
from lifecycle.models import AuditFact, RetainedFactsPolicy
from remote import delivery
from remote.models import BoundDelete, BoundDeleteKey, EngineBinding, EngineRead
from remote.sync import refresh
from tests import factories
from tests.remote_engine import (
    ROOT,
    EngineProcess,
    ResponseDropper,
    free_port,
    running_engine,
    use_engine,
)
from tests.test_erasure_crash import stop_group
from tests.test_jobs import database_url
from tests.test_remote_answers import NONE_LEFT_OUT

HOST = {"HTTP_HOST": "127.0.0.1"}
THREADS = {
    "complete": {"thread_id": "t-complete"},
    "before": {"thread_id": "t-before", "title": "Title ZQXW4L before"},
    "during": {"thread_id": "t-during"},
    "lost": {"thread_id": "t-lost"},
    "killed": {"thread_id": "t-killed"},
    "refuse": {"thread_id": "t-refuse"},
    "unsupported": {"thread_id": "t-unsupported"},
    "running": {"thread_id": "t-running", "running": True},
    "shared-account": {"thread_id": "t-shared"},
    "shared-computer": {"thread_id": "t-shared", "owner": "computer"},
    "replay": {"thread_id": "t-replay"},
    "replay-other": {"thread_id": "t-replay-other"},
    "iface": {"thread_id": "t-iface"},
    "iface-other": {"thread_id": "t-iface-other"},
    "status": {"thread_id": "t-status"},
    "member": {"thread_id": "t-member"},
    "clash": {"thread_id": "t-clash", "title": "Clash title"},
    "clash-other": {"thread_id": "t-clash-other"},
    "legacy": {"thread_id": "t-legacy", "title": "Legacy title"},
    "unsent": {"thread_id": "t-unsent"},
    "resend": {"thread_id": "t-resend"},
    "long-title": {"thread_id": "t-long-title"},
    "nul-title": {"thread_id": "t-nul-title"},
}


@pytest.fixture(scope="module")
def engine():
    with running_engine(THREADS, "lethe-remote-engine-") as process:
        yield process


@pytest.fixture
def own_dir():
    folder = Path(tempfile.mkdtemp(prefix="lethe-remote-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def remote(settings, engine):
    """This console, configured for the engine process; the engine running."""
    settings.REMOTE_RETRY_SECONDS = 0.5
    settings.REMOTE_RETRY_MAX_SECONDS = 2
    return use_engine(settings, engine)


def thread(engine: EngineProcess, name: str) -> str:
    return engine.seeded["threads"][name]


def binding(engine: EngineProcess, name: str) -> EngineBinding:
    return EngineBinding.objects.get(engine_url="", engine_id=thread(engine, name))


def engine_receipt(engine: EngineProcess, name: str) -> dict:
    """The receipt as the engine itself reports it, asked directly."""
    ops = engine.conversation(thread(engine, name))["operations"]
    assert len(ops) == 1
    return HttpEngine(engine.url, engine.token).operation(ops[0][0]).receipt


def figures(receipt: dict) -> dict:
    return {s["store"]: (s["records"], s["bytes"]) for s in receipt["stores"]}


def deleted_once(engine: EngineProcess, name: str) -> None:
    """Erased on the engine, by exactly one operation, recorded as deleted exactly once."""
    row = engine.conversation(thread(engine, name))
    assert (row["state"], row["title"], row["items"]) == ("deleted", "", 0)
    assert [op[1] for op in row["operations"]] == ["completed"]
    conversation_id = engine.query("SELECT id FROM lifecycle_conversation WHERE public_id = ?",
                                   (thread(engine, name),))[0][0]
    facts = engine.query("SELECT count(*) FROM lifecycle_auditfact WHERE action = 'conversation.deleted'"
                         " AND conversation_id = ?", (conversation_id,))[0][0]
    assert facts == 1


def admin_api(_db=None) -> Client:
    user = factories.make_user(admin=True)
    _token, raw = ApiToken.issue(user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def api_delete(client: Client, binding_id: str, key: str):
    return client.delete(f"/api/v1/bindings/{binding_id}", HTTP_IDEMPOTENCY_KEY=key)


# ---- one interface, two implementations ------------------------------------------------------


@pytest.fixture(params=["embedded", "http"])
def any_engine(request, settings, db):
    """(engine client, a conversation id it holds, another one) for either implementation."""
    if request.param == "embedded":
        settings.ENGINE_URL = ""
        account = factories.make_account()
        first = factories.make_conversation(account, thread_id="t-iface")
        factories.add_message(first)
        factories.add_tool(first)
        other = factories.make_conversation(account, thread_id="t-iface-other")
        return InProcessEngine, get_engine(), first.public_id, other.public_id
    engine = request.getfixturevalue("remote")
    return HttpEngine, get_engine(), thread(engine, "iface"), thread(engine, "iface-other")


@pytest.mark.django_db(transaction=True)
def test_both_engines_answer_the_same_way(any_engine):
    kind, client, target, other = any_engine
    assert type(client) is kind  # get_engine() picks by ENGINE_URL
    with pytest.raises(ActionRefused) as unknown:
        client.request_delete("c_" + "0" * 20, key="iface-unknown", actor=None)
    assert (unknown.value.code, unknown.value.status) == ("not_found", 404)
    archived = client.set_archived(other, True, actor=None)
    assert (archived["archived"], archived["changed"]) == (True, True)
    again = client.set_archived(other, True, actor=None)  # someone made it so first: said as no change
    assert (again["archived"], again["changed"]) == (True, False)
    assert [client.set_closed(other, True, actor=None)["changed"] for _ in range(2)] == [True, False]
    preview = client.preview_delete(target)
    assert preview["admission"]["outcome"] == "admitted"
    op = client.request_delete(target, key="iface-key", actor=None)
    assert op.state in ("pending", "completed") and op.target == target
    assert client.request_delete(target, key="iface-key", actor=None).id == op.id  # same key: same operation
    with pytest.raises(ActionRefused) as reused:
        client.request_delete(other, key="iface-key", actor=None)
    assert (reused.value.code, reused.value.status) == ("idempotency_key_reused", 422)
    done = client.wait(op.id, timeout=60)
    assert done.state == "completed"
    assert figures(done.receipt)["lifecycle.Item"][0] == 2
    assert client.operation(op.id).receipt["stores"] == done.receipt["stores"]
    # several by id, in the order asked; an id that names none is left out
    named = client.operations_named(["op_" + "0" * 20, op.id, "not an id"])
    assert [view.id for view in named] == [op.id] and named[0].state == "completed"


# ---- the HTTP client's own outcomes -----------------------------------------------------------


def test_a_silent_engine_is_unreachable_after_the_read_timeout():
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))
        server.listen()
        port = server.getsockname()[1]
        engine = HttpEngine(f"http://127.0.0.1:{port}", "t", connect_timeout=1, read_timeout=0.5, retries=1)
        started = time.monotonic()
        with pytest.raises(EngineUnreachable) as caught:
            engine.operation("op_" + "1" * 20)
        assert caught.value.code == "engine_unreachable" and caught.value.status == 503
        assert time.monotonic() - started < 5  # two tries of 0.5 s and a short backoff, not forever


def test_nothing_listening_is_unreachable_and_a_plain_web_server_is_unsupported(tmp_path):
    closed = free_port()
    with pytest.raises(EngineUnreachable):
        HttpEngine(f"http://127.0.0.1:{closed}", "t", retries=0).operation("op_" + "1" * 20)
    with plain_server(tmp_path) as url:
        engine = HttpEngine(url, "t", retries=0)
        with pytest.raises(EngineUnsupported):
            engine.request_delete("c_" + "1" * 20, key="k", actor=None)
        with pytest.raises(EngineUnsupported):
            engine.supports_delete()


@contextlib.contextmanager
def plain_server(folder):
    """A real web server that is not an engine: GET serves files, DELETE is not implemented."""

    class Quiet(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Quiet)
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ---- bound delete ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_bound_delete_keeps_the_binding_until_the_engines_receipt_is_acknowledged(remote):
    refresh("")
    b = binding(remote, "complete")
    assert (b.owner_kind, b.scope, b.thread_id, b.title) == ("account", "bound", "t-complete", "complete")
    op = delivery.request_bound_delete(b, key="bound-1", actor=None)
    assert (op.state, op.waiting_on, op.binding_id) == ("pending", "engine", b.pk)
    b.refresh_from_db()
    assert b.title == ""  # the request is content-free; the binding itself stays
    with pytest.raises(ProtectedError):  # nothing can cascade the binding away first
        b.delete()
    assert remote.conversation(thread(remote, "complete"))["state"] == "live"  # nothing sent yet
    assert delivery.deliver(op.pk, budget=60) == "completed"
    op.refresh_from_db()
    assert (op.state, op.waiting_on, op.binding_id, op.attempts) == ("completed", "", None, 1)
    assert op.acknowledged_at is not None and op.acknowledged_at >= op.receipt_at
    assert not EngineBinding.objects.filter(pk=b.pk).exists()
    assert op.receipt["stores"] == engine_receipt(remote, "complete")["stores"]
    assert figures(op.receipt)["lifecycle.Item"] == (2, figures(op.receipt)["lifecycle.Item"][1])
    deleted_once(remote, "complete")
    # This console's own audit facts: who asked (the engine is told no user), then the
    # receipt acknowledged; ids only, never the title.
    ids = {"engine_conversation": b.engine_id, "delete": op.public_id}
    assert list(AuditFact.objects.filter(conversation=None, action__startswith="conversation.")
                .order_by("pk").values_list("action", "actor_id", "new_value")) == [
        ("conversation.delete_requested", None, {"state": "pending_delete", **ids}),
        ("conversation.deleted", None, {"state": "deleted", **ids}),
    ]
    # Everything else on the engine is untouched, and still bound here.
    assert remote.conversation(thread(remote, "before"))["items"] == 2
    assert EngineBinding.objects.filter(engine_id=thread(remote, "before")).exists()


@pytest.mark.django_db(transaction=True)
def test_engine_stopped_before_the_delete_pending_then_completed_after_restart(remote):
    from ops.jobs import record_run

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)  # this console's job cluster runs
    refresh("")
    b = binding(remote, "before")
    client = admin_api()
    remote.stop()
    answer = api_delete(client, b.public_id, "before-1")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["state"], body["waiting_on"], body["last_error"]) == ("pending", "engine", "engine_unreachable")
    op = BoundDelete.objects.get(public_id=body["id"])
    assert delivery.deliver(op.pk, budget=0) == "pending"
    status = client.get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert (status["state"], status["waiting_on"], status["attempts"]) == ("pending", "engine", 1)
    assert status["next_attempt_at"] and status["last_error_message"] and status["receipt"] is None
    assert "engine" in status["waiting_message"].lower()
    assert EngineBinding.objects.filter(pk=b.pk).exists()
    assert remote.conversation(thread(remote, "before"))["state"] == "live"  # nothing erased, nothing claimed
    remote.start()
    assert delivery.deliver(op.pk, budget=60) == "completed"
    op.refresh_from_db()
    assert op.state == "completed" and op.attempts == 2 and op.last_error == ""
    assert op.receipt["stores"] == engine_receipt(remote, "before")["stores"]
    assert not EngineBinding.objects.filter(pk=b.pk).exists()
    deleted_once(remote, "before")
    if connection.vendor == "sqlite":
        # The console's own copy of the title is gone from its database files too, log included
        from pathlib import Path

        name = Path(str(connection.settings_dict["NAME"]))
        files = [p for p in (name, Path(f"{name}-wal")) if p.exists()]
        assert b.title and not [p for p in files if b.title.encode() in p.read_bytes()]


@pytest.mark.django_db(transaction=True)
def test_engine_stopped_during_the_delete_finishes_after_restart(remote, own_dir):
    tmp_path = own_dir
    refresh("")
    b = binding(remote, "during")
    op = delivery.request_bound_delete(b, key="during-1", actor=None)
    kills = tmp_path / "kills"
    kills.mkdir()
    # The engine's own worker dies in the middle of the erasure; the whole engine is stopped then.
    remote.stop()
    remote.start(env={"LETHE_TEST_KILL_AT": "complete", "LETHE_TEST_KILL_DIR": str(kills)})
    assert delivery.deliver(op.pk, budget=0) == "pending"  # the engine took it and is erasing
    deadline = time.monotonic() + 60
    while not (kills / "complete").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    remote.kill()
    on_engine = remote.conversation(thread(remote, "during"))
    assert on_engine["state"] == "pending_delete" and on_engine["operations"][0][1] == "pending"
    assert on_engine["items"] == 0  # it stopped after every store was erased, before Completed
    assert delivery.deliver(op.pk, budget=0) == "pending"
    op.refresh_from_db()
    assert (op.state, op.last_error, op.waiting_on) == ("pending", "engine_unreachable", "engine")
    assert op.receipt is None and EngineBinding.objects.filter(pk=b.pk).exists()
    remote.start()  # its recovery finishes the erasure; this console follows it to the receipt
    assert delivery.deliver(op.pk, budget=90) == "completed"
    op.refresh_from_db()
    assert op.receipt["stores"] == engine_receipt(remote, "during")["stores"]
    assert figures(op.receipt)["lifecycle.Item"][0] == 2  # exact: measured before the crash
    deleted_once(remote, "during")


@pytest.mark.django_db(transaction=True)
def test_a_lost_answer_is_retried_with_the_same_key_and_nothing_is_erased_twice(remote, settings):
    refresh("")
    b = binding(remote, "lost")
    relay = ResponseDropper(remote.port, free_port({remote.port}))
    try:
        settings.ENGINE_URL = relay.url
        settings.ENGINE_RETRIES = 0  # the job's own retry, not the client's, recovers here
        op = delivery.request_bound_delete(b, key="lost-1", actor=None)
        relay.drop_next("DELETE")
        assert delivery.deliver(op.pk, budget=60) == "completed"
    finally:
        relay.close()
    assert len(relay.dropped) == 1 and relay.dropped[0].startswith("DELETE") and relay.dropped[0].endswith("202")
    op.refresh_from_db()
    assert op.attempts == 2 and op.state == "completed"
    assert op.receipt["stores"] == engine_receipt(remote, "lost")["stores"]
    deleted_once(remote, "lost")


@pytest.mark.django_db(transaction=True)
def test_a_console_worker_killed_between_receipt_and_acknowledgement_finishes_on_a_real_cluster(remote, own_dir):
    tmp_path = own_dir
    refresh("")
    b = binding(remote, "killed")
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "Q_WORKERS": "1", "ENGINE_URL": remote.url, "ENGINE_TOKEN": remote.token, "REMOTE_RETRY_SECONDS": "1",
           "LETHE_TEST_KILL_AT": "remote.acknowledge", "LETHE_TEST_KILL_DIR": str(kills),
           "ENGINE_HOME": str(tmp_path / "console-engine")}
    (tmp_path / "console-engine").mkdir()
    op = delivery.request_bound_delete(b, key="killed-1", actor=None)
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            op.refresh_from_db()
            if op.state != "pending":
                break
            time.sleep(0.3)
    finally:
        stop_group(cluster)
    assert (kills / "remote.acknowledge").exists()  # the worker really died there, receipt in hand
    op.refresh_from_db()
    assert op.state == "completed" and op.attempts == 2  # asked again with the same key, then acknowledged
    assert op.receipt["stores"] == engine_receipt(remote, "killed")["stores"]
    assert not EngineBinding.objects.filter(pk=b.pk).exists()
    deleted_once(remote, "killed")


@pytest.mark.django_db(transaction=True)
def test_refuse_mode_answers_unavailable_and_records_nothing(remote, settings):
    refresh("")
    b = binding(remote, "refuse")
    settings.LIFECYCLE_OFFLINE_DELETE = "refuse"
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port({remote.port})}"  # nothing listens there: offline
    with pytest.raises(ActionRefused) as refused:
        delivery.request_bound_delete(b, key="refuse-1", actor=None)
    assert refused.value.code == "engine_offline" and refused.value.extra == {"outcome": "unavailable"}
    answer = api_delete(admin_api(), b.public_id, "refuse-2")
    assert answer.status_code == 409
    assert (answer.json()["code"], answer.json()["outcome"]) == ("engine_offline", "unavailable")
    assert BoundDelete.objects.count() == 0 and BoundDeleteKey.objects.count() == 0
    b.refresh_from_db()
    assert b.title == "refuse"  # not even the title copy was touched
    assert remote.conversation(thread(remote, "refuse"))["state"] == "live"
    # The default records it as Pending instead.
    settings.LIFECYCLE_OFFLINE_DELETE = "pending"
    op = delivery.request_bound_delete(b, key="refuse-3", actor=None)
    assert (op.state, op.last_error) == ("pending", "engine_unreachable")


@pytest.mark.django_db(transaction=True)
def test_an_engine_without_delete_is_unavailable_and_the_binding_stays(remote, settings, tmp_path):
    refresh("")
    b = binding(remote, "unsupported")
    with plain_server(tmp_path) as url:
        settings.ENGINE_URL = url
        answer = api_delete(admin_api(), b.public_id, "unsupported-1")
    assert answer.status_code == 409
    assert (answer.json()["code"], answer.json()["outcome"]) == ("engine_unsupported", "unavailable")
    op = BoundDelete.objects.get(key="unsupported-1")
    assert (op.state, op.binding_id) == ("unavailable", None)
    assert EngineBinding.objects.filter(pk=b.pk).exists()
    assert remote.conversation(thread(remote, "unsupported"))["state"] == "live"


@pytest.mark.django_db(transaction=True)
def test_an_engine_refusal_is_refused_here_and_keeps_everything(remote):
    refresh("")
    b = binding(remote, "running")
    op = delivery.request_bound_delete(b, key="running-1", actor=None)
    assert delivery.deliver(op.pk, budget=30) == "refused"
    op.refresh_from_db()
    assert (op.state, op.code, op.binding_id) == ("refused", "conversation_turn_active", b.pk)
    assert EngineBinding.objects.filter(pk=b.pk).exists()
    assert remote.conversation(thread(remote, "running"))["state"] == "live"
    # The request had cleared the list's copy of the title; the engine said no, so it is back
    assert b.title and EngineBinding.objects.get(pk=b.pk).title == b.title
    assert list(AuditFact.objects.filter(conversation=None, action__startswith="conversation.")
                .order_by("pk").values_list("action", "new_value")) == [
        ("conversation.delete_requested", {"state": "pending_delete", "engine_conversation": b.engine_id,
                                           "delete": op.public_id}),
        ("conversation.delete_ended", {"state": "live", "outcome": "refused", "code": "conversation_turn_active",
                                       "engine_conversation": b.engine_id, "delete": op.public_id}),
    ]
    # Closed on the engine (its turn interrupted), a new request is admitted and completes;
    # the earlier refusal keeps the binding's identity but lets the binding itself go.
    assert get_engine().set_closed(b.engine_id, True, actor=None)["closed"] is True
    again = delivery.request_bound_delete(b, key="running-2", actor=None)
    assert again.pk != op.pk and delivery.deliver(again.pk, budget=60) == "completed"
    op.refresh_from_db()
    assert (op.state, op.binding_id, op.binding_ref) == ("refused", None, b.public_id)
    assert not EngineBinding.objects.filter(pk=b.pk).exists()
    deleted_once(remote, "running")


@pytest.mark.django_db(transaction=True)
def test_a_key_the_engine_knows_for_another_conversation_does_not_stop_a_console_delete(remote):
    """r16: the console forwarded the client's key, so a key the engine had used (asked of it
    directly, or by another console) for another conversation ended this console's delete
    Unavailable (engine_key_conflict), with the binding's title left blank. The engine is
    called with the console delete's own key now."""
    refresh("")
    direct = HttpEngine(remote.url, remote.token)
    direct.request_delete(thread(remote, "clash-other"), key="clash-key-1", actor=None)
    b = binding(remote, "clash")
    op = delivery.request_bound_delete(b, key="clash-key-1", actor=None)
    assert op.engine_key == f"lethe-console-{op.public_id}"
    assert delivery.deliver(op.pk, budget=60) == "completed"
    deleted_once(remote, "clash")
    # A delete recorded before engine_key existed (or by a server still on older code) and
    # already sent once goes on with its key, as a lost request did; the engine's 422 (that key
    # is another conversation's) proves it never applied it: it goes on with its own (r20: it
    # ended Unavailable, engine_key_conflict, and asking again did too).
    legacy = binding(remote, "legacy")
    direct.request_delete(thread(remote, "clash-other"), key="clash-key-2", actor=None)
    old = delivery.request_bound_delete(legacy, key="clash-key-2", actor=None)
    BoundDelete.objects.filter(pk=old.pk).update(engine_key="", attempts=1)
    assert delivery.deliver(old.pk, budget=60) == "completed"
    old.refresh_from_db()
    assert (old.state, old.engine_key) == ("completed", f"lethe-console-{old.public_id}")
    deleted_once(remote, "legacy")
    # One recorded by older code and never sent takes its own key before the first call.
    unsent = binding(remote, "unsent")
    fresh = delivery.request_bound_delete(unsent, key="unsent-key-1", actor=None)
    BoundDelete.objects.filter(pk=fresh.pk).update(engine_key="")
    assert delivery.deliver(fresh.pk, budget=60) == "completed"
    fresh.refresh_from_db()
    assert (fresh.engine_key, fresh.attempts) == (f"lethe-console-{fresh.public_id}", 1)
    deleted_once(remote, "unsent")


@pytest.mark.django_db(transaction=True)
def test_account_and_computer_with_equal_raw_ids_are_never_confused(remote, client, admin_user):
    refresh("")
    account_b, computer_b = binding(remote, "shared-account"), binding(remote, "shared-computer")
    assert account_b.thread_id == computer_b.thread_id == "t-shared"
    assert (account_b.owner_kind, computer_b.owner_kind) == ("account", "computer")
    assert (account_b.scope, computer_b.scope) == ("bound", "local")
    assert account_b.engine_id != computer_b.engine_id and account_b.public_id != computer_b.public_id
    api = admin_api()
    body = api_delete(api, account_b.public_id, "shared-1").json()
    assert body["state"] == "pending" and body["owner"] == {"kind": "account", "id": remote.seeded["account"]}
    # One owner's conversations at a time: the computer's list shows its own, with no delete.
    computer_list = api.get("/api/v1/bindings", {"owner_kind": "computer", "owner_id": remote.seeded["computer"]})
    rows = {r["thread_id"]: r for r in computer_list.json()["results"]}
    assert rows["t-shared"]["id"] == computer_b.public_id and rows["t-shared"]["delete"] is None
    account_rows = api.get("/api/v1/bindings", {"owner_kind": "account", "owner_id": remote.seeded["account"]})
    assert {r["id"]: r["delete"] for r in account_rows.json()["results"]}[account_b.public_id] == body["id"]
    client.force_login(admin_user)
    page = client.get("/engine/conversations/", {"owner": f"computer:{remote.seeded['computer']}"}).content.decode()
    assert computer_b.public_id in page and account_b.public_id not in page and body["id"] not in page
    page = client.get("/engine/conversations/", {"owner": f"account:{remote.seeded['account']}"}).content.decode()
    assert body["id"] in page and computer_b.public_id not in page
    op = BoundDelete.objects.get(public_id=body["id"])
    requested = AuditFact.objects.get(action="conversation.delete_requested", conversation=None)
    assert requested.actor_id == op.requested_by_id is not None  # the API token's user, on this console
    assert requested.new_value["engine_conversation"] == account_b.engine_id
    assert delivery.deliver(op.pk, budget=60) == "completed"
    deleted_once(remote, "shared-account")
    twin = remote.conversation(thread(remote, "shared-computer"))
    assert (twin["state"], twin["items"], twin["operations"]) == ("live", 2, [])
    computer_b.refresh_from_db()  # still bound, untouched
    assert computer_b.title == "shared-computer"
    # Its own delete goes to its own conversation on the engine.
    other = delivery.request_bound_delete(computer_b, key="shared-2", actor=None)
    assert other.engine_id == thread(remote, "shared-computer") and other.owner_kind == "computer"


@pytest.mark.django_db(transaction=True)
def test_a_stale_replay_gets_the_recorded_outcome_and_changes_nothing(remote):
    refresh("")
    b, other = binding(remote, "replay"), binding(remote, "replay-other")
    api = admin_api()
    first = api_delete(api, b.public_id, "replay-1").json()
    op = BoundDelete.objects.get(public_id=first["id"])
    assert delivery.deliver(op.pk, budget=60) == "completed"
    done = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert done["state"] == "completed" and done["receipt"]["stores"] == engine_receipt(remote, "replay")["stores"]
    engine_ops = remote.conversation(thread(remote, "replay"))["operations"]
    # The same request again, long after: the recorded outcome, the same receipt, no new call.
    again = api_delete(api, b.public_id, "replay-1")
    assert again.status_code == 202 and again.json() == done
    assert BoundDelete.objects.get(pk=op.pk).attempts == 1
    # The same key for another conversation: 422, nothing recorded for it.
    reused = api_delete(api, other.public_id, "replay-1")
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert not BoundDelete.objects.filter(binding=other).exists()
    # A new key for the released binding: the delete that let it go, as the engine answers a new
    # key for a conversation it deleted (r122: 404); the key is remembered for it, nothing sent.
    joined = api_delete(api, b.public_id, "replay-2")
    assert joined.status_code == 202 and joined.json() == done
    assert BoundDeleteKey.objects.get(key="replay-2").delete_id == op.pk
    assert BoundDelete.objects.get(pk=op.pk).attempts == 1
    # An id this console never bound is unknown, whatever the key.
    assert api_delete(api, "b_" + "0" * 20, "replay-1").status_code == 404
    # Replayed straight at the engine with the old key: its recorded operation, not a second erasure.
    replayed = HttpEngine(remote.url, remote.token).request_delete(thread(remote, "replay"), key="replay-1", actor=None)
    op.refresh_from_db()
    assert replayed.id == op.engine_operation and replayed.receipt["stores"] == op.receipt["stores"]
    assert remote.conversation(thread(remote, "replay"))["operations"] == engine_ops
    deleted_once(remote, "replay")


@pytest.mark.django_db(transaction=True)
def test_a_confirmation_sent_again_after_its_delete_completed_leads_to_that_delete(remote, client, admin_user):
    """r122: the Delete form sent again once its bound delete completed (a reload after the
    answer was lost) was 404: the binding is gone once the engine's receipt is acknowledged.
    Its key leads to its delete, as the embedded delete page's does; nothing is sent again."""
    refresh("")
    b = binding(remote, "resend")
    client.force_login(admin_user)
    url = f"/engine/conversations/{b.public_id}/delete/"
    page = client.get(url, **HOST).content.decode()
    form = {name: re.search(rf'name="{name}" value="([^"]+)"', page).group(1) for name in ("key", "seen")}
    first = client.post(url, form, **HOST)
    op = BoundDelete.objects.get(binding_ref=b.public_id)
    assert (first.status_code, first["Location"]) == (302, f"/engine/deletes/{op.public_id}/")
    assert delivery.deliver(op.pk, budget=60) == "completed"
    assert not EngineBinding.objects.filter(public_id=b.public_id).exists()
    engine_ops = remote.conversation(thread(remote, "resend"))["operations"]
    again = client.post(url, form, **HOST)
    assert (again.status_code, again["Location"]) == (302, f"/engine/deletes/{op.public_id}/")
    shown = client.get(again["Location"], **HOST).content.decode()
    assert 'data-state="completed"' in shown and "had already been requested" not in shown
    # A confirmation from a page shown before the delete completed: that delete, said so.
    late = client.post(url, {**form, "key": "ui-shown-before"}, follow=True, **HOST)
    assert late.redirect_chain == [(f"/engine/deletes/{op.public_id}/", 302)]
    assert "had already been requested: your confirmation did nothing more" in late.content.decode()
    assert list(BoundDeleteKey.objects.filter(delete=op).order_by("pk").values_list("key", flat=True)) == [
        form["key"], "ui-shown-before"]
    # One delete, called once; the engine erased the conversation once.
    assert list(BoundDelete.objects.filter(engine_id=b.engine_id).values_list("pk", "attempts")) == [(op.pk, 1)]
    assert remote.conversation(thread(remote, "resend"))["operations"] == engine_ops
    deleted_once(remote, "resend")
    # A member may not; an id never bound is unknown.
    member = factories.make_user("resend-member", admin=False)
    client.force_login(member)
    assert client.post(url, form, **HOST).status_code == 403
    client.force_login(admin_user)
    assert client.post("/engine/conversations/b_" + "0" * 20 + "/delete/", form, **HOST).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_status_page_says_whose_step_it_is(remote, client, admin_user, settings):
    from ops.jobs import record_run

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)  # this console's job cluster runs
    refresh("")
    b = binding(remote, "status")
    client.force_login(admin_user)
    # The confirmation: the engine's own figures and periods (not this console's policy)
    RetainedFactsPolicy.objects.filter(pk=RetainedFactsPolicy.load().pk).update(usage_days=11)
    confirm = " ".join(re.sub(r"<[^>]+>", " ", client.get(f"/engine/conversations/{b.public_id}/delete/")
                              .content.decode()).split())
    assert "Messages and tool calls 2 records" in confirm and "could not be asked" not in confirm
    assert "Exports you saved 0 records Files are kept; their link to the conversation is cut." in confirm
    assert "Usage and metering" in confirm and "kept for 400 days after the delete" in confirm
    assert "11 days" not in confirm and "Provider retention follows provider terms." in confirm
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port({remote.port})}"
    op = delivery.request_bound_delete(b, key="status-1", actor=None)
    delivery.deliver(op.pk, budget=0)
    # The retry comes REMOTE_RETRY_SECONDS later; put it further off, as after a few failures.
    from datetime import timedelta

    from django.utils import timezone

    BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    page = client.get(f"/engine/deletes/{op.public_id}/").content.decode()
    assert 'data-state="pending"' in page and 'data-waiting="engine"' in page
    assert "Waiting on: the engine" in page and "(next retry: " in page and "cannot be reached" in page
    assert re.search(r"\(next retry: [^)]* UTC\)", page)  # an absolute time names its zone
    assert "m..<" not in page  # no period after "a.m." or "p.m."
    assert "Completed" not in page
    settings.ENGINE_URL = remote.url
    assert delivery.deliver(op.pk, budget=60) == "completed"
    page = client.get(f"/engine/deletes/{op.public_id}/").content.decode()
    assert 'data-state="completed"' in page and op.engine_operation in page
    # The receipt by store label and action, in its unit; never the engine's store keys
    words = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "Messages and tool calls 2 records erased · " in words and "Event log 0 files erased" in words
    assert "Exports you saved 0 records kept, links cut" in words
    assert "Provider-retained inputs follows provider terms" in words
    assert "lifecycle.Item" not in page and "approval_receipts" not in page
    body = json.loads(client.get(f"/api/v1/bound-deletes/{op.public_id}").content)
    assert body["attempts"] == 2 and body["waiting_on"] is None and body["receipt"] is not None


@pytest.mark.django_db(transaction=True)
def test_the_job_cluster_reads_the_engine_by_itself_and_records_the_read(remote, own_dir):
    """No one presses Read from the engine: the cluster's hourly read (remote-read-engines, due
    at the first start after migrate) lists the engine's conversations and records the read."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import Schedule

    read = Schedule.objects.get(name="remote-read-engines")
    assert (read.func, read.minutes, read.repeats) == ("remote.tasks.read_engines", 60, -1)
    Schedule.objects.exclude(pk=read.pk).delete()  # the cluster does this job alone
    Schedule.objects.filter(pk=read.pk).update(next_run=timezone.now())
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "Q_WORKERS": "1", "ENGINE_URL": remote.url, "ENGINE_TOKEN": remote.token,
           "ENGINE_HOME": str(own_dir / "console-engine")}
    (own_dir / "console-engine").mkdir()
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not EngineRead.objects.filter(read_at__isnull=False).exists():
            time.sleep(0.3)
    finally:
        stop_group(cluster)
    record = EngineRead.objects.get()
    assert record.engine_url == "" and record.read_at is not None and record.state == "ok"
    live = {row[0] for row in remote.query("SELECT public_id FROM lifecycle_conversation WHERE state = 'live'")}
    assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == live and live
    assert set(EngineBinding.objects.values_list("synced_at", flat=True)) == {record.read_at}
    assert Schedule.objects.get(pk=read.pk).next_run >= record.read_at + timedelta(minutes=59)


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_fails_its_read_never_keeps_another_from_its_own_and_the_list_says_so(remote, settings):
    """The hourly read queues one job per configured engine, each under its own time limit (r71:
    one job read them all, and one engine that used its time starved the others): ENGINE_URL
    unreachable is recorded (and said on the list, to admins and members, in English and
    Spanish) while the engine in ENGINE_TOKENS is read whole; the next read that goes through
    takes the line away. Read from the engine reads an ENGINE_TOKENS engine too (r71: only
    ENGINE_URL's, and no button without one)."""
    from django_q.models import OrmQ

    from remote import tasks

    live = remote.query("SELECT count(*) FROM lifecycle_conversation WHERE state = 'live'")[0][0]
    settings.ENGINE_TOKENS = {remote.url: remote.token}
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port({remote.port})}"  # nothing listens there
    OrmQ.objects.all().delete()
    queued = tasks.read_engines()
    jobs = [row.task for row in OrmQ.objects.order_by("id")]
    assert set(queued) == {"ENGINE_URL", remote.url} and [job["id"] for job in jobs] == list(queued.values())
    assert [(job["func"], job["args"], job["ack_failure"]) for job in jobs] == [
        ("remote.tasks.read_engine", ("",), True), ("remote.tasks.read_engine", (remote.url,), True)]
    assert [tasks.read_engine(*job["args"]) for job in jobs] == [
        "engine_unreachable", {"created": live, "updated": 0, "returned": 0, **NONE_LEFT_OUT}]
    assert EngineBinding.objects.filter(engine_url=remote.url).count() == live
    assert not EngineBinding.objects.filter(engine_url="").exists()
    failed, other = EngineRead.objects.get(engine_url=""), EngineRead.objects.get(engine_url=remote.url)
    assert (failed.state, failed.read_at, failed.error_code, failed.error_message) == (
        "failed", None, "engine_unreachable", "")
    assert other.state == "ok" and other.read_at is not None
    member = factories.make_user(admin=False)
    for who, language, words in ((factories.make_user(admin=True), "en", "The engine cannot be reached"),
                                 (member, "es", "No se puede contactar con el motor")):
        viewer = Client(**HOST)
        viewer.force_login(who)
        page = viewer.get("/engine/conversations/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
        assert page.count('data-testid="read-failed"') == 1  # the engine in ENGINE_TOKENS read fine
        assert words in page.split('data-testid="read-failed"', 1)[1].split("</p>", 1)[0]
    settings.ENGINE_URL = remote.url
    assert tasks.read_engine("") == {"created": live, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
    viewer = Client(**HOST)
    viewer.force_login(member)
    assert 'data-testid="read-failed"' not in viewer.get("/engine/conversations/").content.decode()
    # Only an engine in ENGINE_TOKENS: the button is there, and reads it.
    settings.ENGINE_URL = ""
    boss = Client(**HOST)
    boss.force_login(factories.make_user(admin=True))
    assert 'action="/engine/conversations/sync/"' in boss.get("/engine/conversations/").content.decode()
    before = EngineRead.objects.get(engine_url=remote.url).read_at
    answer = boss.post("/engine/conversations/sync/", follow=True)
    said = [str(message) for message in answer.context["messages"]]
    assert said == [f"The engine at {remote.url}: Read the engine's conversations: 0 new, {live} already listed "
                    "and brought up to date."]
    assert EngineRead.objects.get(engine_url=remote.url).read_at > before


ORPHAN_ROW = """
from lifecycle import fleet
from lifecycle.enginefs import EngineHome
row = {"agent_id": "sa_legacy_0rphan", "origin": None, "legacy": True, "status": "completed", "delivery": "settled",
       "started_at": "2020-01-01T00:00:00+00:00", "finished_at": None, "prompt": "p", "result": "r"}
fleet.update_fleet(home=EngineHome(), change=lambda rows: rows + [row])
"""


@pytest.mark.django_db(transaction=True)
def test_a_delete_the_engine_cannot_attribute_names_the_subagent_rows_to_resolve_there(settings):
    """r69: the README says a bound delete blocked by a subagent row of unknown origin names it;
    the console said only that such rows exist (the engine's operation named them). Now the page
    and the API name each row; resolved on the engine, a new delete completes."""
    with running_engine({"blocked": {"thread_id": "t-blocked"}}, "lethe-way-out-") as engine:
        engine.manage("shell", "-c", ORPHAN_ROW)
        use_engine(settings, engine)
        refresh("")
        b = EngineBinding.objects.get()
        answer = api_delete(admin_api(), b.public_id, "way-out-1")
        op = BoundDelete.objects.get()
        delivery.deliver(op.pk, budget=5)
        op.refresh_from_db()
        assert (op.state, op.code) == ("unavailable", "conversation_child_ownership_ambiguous"), answer.content
        assert op.way_out == {"ambiguous": [{"agent_id": "sa_legacy_0rphan", "status": "completed",
                                             "started_at": "2020-01-01T00:00:00Z", "finished_at": None}]}  # (r75: UTC "Z")
        body = admin_api().get(f"/api/v1/bound-deletes/{op.public_id}").json()
        assert body["way_out"] == op.way_out
        viewer = Client(**HOST)
        viewer.force_login(factories.make_user(admin=False))
        for language, words in (("en", "Subagent rows of unknown origin on the engine"),
                                ("es", "Filas de subagentes de origen desconocido en el motor")):
            page = viewer.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
            part = page.split('data-testid="way-out"', 1)[1].split("</div>", 1)[0]
            assert words in part and "<code><bdi>sa_legacy_0rphan</bdi></code>" in part
        # Resolved on the engine (its own API), a new delete of the same conversation completes.
        resolved = HttpEngine(engine.url, engine.token).call(
            "POST", "/v1/subagents/sa_legacy_0rphan/resolve", body={"action": "clear"})
        assert resolved[0] == 200
        again = api_delete(admin_api(), b.public_id, "way-out-2")
        assert again.status_code == 202
        second = BoundDelete.objects.exclude(pk=op.pk).get()
        deadline = time.monotonic() + 60
        while second.state == "pending" and time.monotonic() < deadline:
            delivery.deliver(second.pk, budget=5)
            second.refresh_from_db()
        assert (second.state, second.way_out) == ("completed", None)


@pytest.mark.django_db(transaction=True)
def test_sync_bindings_reads_the_engine_as_a_command_and_members_cannot_delete(remote):
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "ENGINE_URL": remote.url, "ENGINE_TOKEN": remote.token}
    done = subprocess.run([sys.executable, "manage.py", "sync_bindings"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    live = remote.query("SELECT count(*) FROM lifecycle_conversation WHERE state = 'live'")[0][0]
    assert done.stdout.strip() == f"{live} created, 0 updated"
    assert EngineBinding.objects.count() == live
    assert refresh("") == {"created": 0, "updated": live, "returned": 0, **NONE_LEFT_OUT}  # again: nothing new, nothing doubled
    member = factories.make_user(admin=False)
    _token, raw = ApiToken.issue(member)
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST).delete(
        f"/api/v1/bindings/{binding(remote, 'member').public_id}", HTTP_IDEMPOTENCY_KEY="member-1")
    assert answer.status_code == 403 and BoundDelete.objects.count() == 0
    # On the screen a member sees the list read-only: no Delete, and the note says why
    viewer = Client(**HOST)
    viewer.force_login(member)
    b = binding(remote, "member")
    page = viewer.get(f"/engine/conversations/?owner={b.owner_kind}:{b.owner_id}").content.decode()
    assert f'data-binding="{b.public_id}"' in page and f"/engine/conversations/{b.public_id}/delete/" not in page
    assert 'data-testid="admins-only"' in page
    bad = api_delete(admin_api(), binding(remote, "member").public_id, "has spaces")
    assert bad.status_code == 400 and bad.json()["code"] == "idempotency_key_invalid"
    assert BoundDelete.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_title_a_runtime_wrote_too_long_is_shortened_and_a_row_not_taken_leaves_only_its_conversation_out(remote):
    """r123: a runtime wrote a title of 305 characters on an engine on SQLite (which does not
    enforce the column's 300; PostgreSQL would have refused it), and every read of the engine
    failed, engine_bad_answer, "Nothing was read". The title is shortened; a conversation whose
    title holds a NUL (which PostgreSQL could not store) is left out and named, the others read."""
    long_title = "Título " + "é" * 298  # 305 characters
    titles = {thread(remote, "long-title"): long_title, thread(remote, "nul-title"): "before \x00 after"}
    with sqlite3.connect(remote.db, timeout=10) as engine_db:  # the runtime's own writes
        for public_id, title in titles.items():
            engine_db.execute("UPDATE lifecycle_conversation SET title = ? WHERE public_id = ?", (title, public_id))
    engine_db.close()
    try:
        out = io.StringIO()
        call_command("sync_bindings", stdout=out)
        live = remote.query("SELECT count(*) FROM lifecycle_conversation WHERE state = 'live'")[0][0]
        assert out.getvalue().splitlines() == [
            f"{live - 1} created, 0 updated",
            "1 left out (the engine's row is not in the form expected; the field not taken is named): "
            f"{thread(remote, 'nul-title')} (title)"]
        assert EngineBinding.objects.get(engine_id=thread(remote, "long-title")).title == long_title[:300]
        assert not EngineBinding.objects.filter(engine_id=thread(remote, "nul-title")).exists()
        assert EngineBinding.objects.count() == live - 1
    finally:
        with sqlite3.connect(remote.db, timeout=10) as engine_db:
            for public_id in titles:
                engine_db.execute("UPDATE lifecycle_conversation SET title = 'Restored' WHERE public_id = ?",
                                  (public_id,))
        engine_db.close()


@pytest.mark.django_db
def test_without_an_engine_address_a_bound_delete_is_unavailable(settings):
    settings.ENGINE_URL = ""
    b = EngineBinding.objects.create(engine_id="c_" + "e" * 20, owner_kind="account", owner_id=7, scope="bound",
                                     thread_id="t-nowhere", title="Nowhere")
    EngineBinding.objects.create(engine_id="c_" + "f" * 20, owner_kind="computer", owner_id=7, scope="local",
                                 thread_id="t-nowhere", title="Same id, computer")
    api = admin_api()
    answer = api_delete(api, b.public_id, "nowhere-1")
    assert answer.status_code == 409
    assert (answer.json()["code"], answer.json()["outcome"]) == ("engine_not_configured", "unavailable")
    assert BoundDelete.objects.get(key="nowhere-1").state == "unavailable"
    assert EngineBinding.objects.filter(pk=b.pk).exists()
    listing = api.get("/api/v1/bindings").json()  # no owner named: the first owner, accounts first
    assert listing["owner"] == {"kind": "account", "id": 7}
    assert [r["id"] for r in listing["results"]] == [b.public_id]
    assert api.get("/api/v1/bindings", {"owner_kind": "account"}).status_code == 400  # a pair or nothing
