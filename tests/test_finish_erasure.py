"""`manage.py finish_erasure`: completed deletes still waiting for physical erasure get it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.actions.set_closed import set_closed
from lifecycle.deletion import executor
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def sqlite_snapshot(table: str):
    """SQLite: a second connection holds a read snapshot (of `table`) meanwhile, which keeps
    any checkpoint busy; PostgreSQL: nothing."""
    if connection.vendor != "sqlite":
        yield
        return
    reader = sqlite3.connect(str(connection.settings_dict["NAME"]))
    reader.execute("BEGIN")
    reader.execute(f"SELECT count(*) FROM {table}").fetchone()
    try:
        yield
    finally:
        reader.rollback()
        reader.close()


def _table_files(table: str) -> list[Path]:
    """The PostgreSQL files of a table and its TOAST table (the tests run beside the server)."""
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
        cursor.execute("SHOW data_directory")
        root = Path(cursor.fetchone()[0])
        cursor.execute(
            "SELECT pg_relation_filepath(c.oid), pg_relation_filepath(NULLIF(c.reltoastrelid, 0)) "
            "FROM pg_class c WHERE c.oid = %s::regclass", [table])
        paths = [p for p in cursor.fetchone() if p]
    base = [root / p for p in paths]
    return [f for p in base for f in [p, *sorted(p.parent.glob(p.name + ".[0-9]*"))] if f.exists()]


def test_it_rewrites_the_touched_tables_and_marks_the_receipt_physically_erased(capsys):
    target = factories.make_conversation(title="Erase me")
    secret = factories.marker("finish-erasure-secret")
    factories.add_message(target, content=secret)
    bystander = factories.make_conversation(title="Stays")
    kept = factories.marker("finish-erasure-kept")
    factories.add_message(bystander, content=kept)
    op = request_deletion(target, key="finish-1", acting_user=None)

    # A reader's open snapshot keeps the checkpoint busy, so the delete waits for it.
    with sqlite_snapshot("lifecycle_item"):
        assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert op.physical_state == m.PhysicalState.PENDING
    assert {h["kind"] for h in op.receipt["holders"]} & {"wal", "database_files"}

    call_command("finish_erasure", "--json")
    report = json.loads(capsys.readouterr().out)
    op.refresh_from_db()
    assert (report["waiting"], report["erased"], report["still_pending"]) == (1, 1, 0), report
    assert op.physical_state == m.PhysicalState.ERASED and op.physically_erased_at is not None
    assert not {h["kind"] for h in op.receipt["holders"]} & {"wal", "database_files"}
    if connection.vendor == "postgresql":
        assert "lifecycle_item" in report["tables"]
        raw = b"".join(path.read_bytes() for path in _table_files("lifecycle_item"))
        assert kept.encode() in raw  # the scan reads the live table
        assert secret.encode() not in raw
    else:
        name = str(connection.settings_dict["NAME"])
        raw = Path(name).read_bytes() + (Path(name + "-wal").read_bytes() if Path(name + "-wal").exists() else b"")
        assert secret.encode() not in raw and kept.encode() in raw

    call_command("finish_erasure")
    assert "No delete is waiting" in capsys.readouterr().out



def _raw_bytes(table: str) -> bytes:
    """What the database's files hold: PostgreSQL's files of `table`; SQLite's file and log."""
    if connection.vendor == "postgresql":
        return b"".join(path.read_bytes() for path in _table_files(table))
    name = str(connection.settings_dict["NAME"])
    return b"".join(Path(p).read_bytes() for p in (name, name + "-wal") if Path(p).exists())


def test_a_row_removed_before_the_delete_is_erased_from_the_table_files_too(capsys):
    """Close deletes the process lease row, whose holder is content, long before any delete:
    the delete finds no lease row, but PostgreSQL keeps the dead row's bytes in the table's
    files until the table is rewritten. A receipt is physically erased only once every table
    that can hold the conversation's content has been."""
    target = factories.make_conversation(title="Closed first")
    holder = factories.marker("lease-holder")[:120]
    m.ProcessLease.objects.create(conversation=target, holder=holder)
    factories.add_message(target, content=factories.marker("closed-first"))
    set_closed(target, closed=True, acting_user=None)
    assert not m.ProcessLease.objects.filter(conversation=target).exists()
    if connection.vendor == "postgresql":
        assert holder.encode() in _raw_bytes("lifecycle_processlease")  # the dead row, in the file
    op = request_deletion(target, key="finish-closed", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert "lifecycle_processlease" in op.touched_tables
    assert next(s for s in op.receipt["stores"] if s["store"] == "lifecycle.ProcessLease")["records"] == 0

    call_command("finish_erasure", "--json")
    report = json.loads(capsys.readouterr().out)
    op.refresh_from_db()
    assert op.physical_state == m.PhysicalState.ERASED
    if connection.vendor == "postgresql":
        assert "lifecycle_processlease" in report["tables"]
    assert holder.encode() not in _raw_bytes("lifecycle_processlease")


def test_an_old_transaction_anywhere_on_the_server_keeps_the_rewrite_from_claiming_erasure(monkeypatch):
    """VACUUM FULL copies deleted rows another transaction could still see; transaction ids are
    shared by every database of the server (a write transaction's id is in every snapshot taken
    while it runs, the rewrite's own too). The rewrite waits for them, else claims nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite's physical erasure is the WAL checkpoint")
    import psycopg

    from lifecycle.deletion import rewrite

    monkeypatch.setattr(rewrite, "HORIZON_WAIT_SECONDS", 0.5)
    settings_dict = connection.settings_dict
    holder = psycopg.connect(host=settings_dict["HOST"] or "127.0.0.1", port=settings_dict["PORT"] or 5432,
                             user=settings_dict["USER"], dbname="postgres")
    holder.execute("SELECT pg_current_xact_id()")  # a write transaction in another database, left open
    try:
        target = factories.make_conversation(title="Erase me")
        secret = factories.marker("held-erasure-secret")
        factories.add_message(target, content=secret)
        op = request_deletion(target, key="held-1", acting_user=None)
        assert executor.run_erasure(op.pk) == "completed"
        held = rewrite.finish_waiting_erasures()
        op.refresh_from_db()
        assert held.held_by >= 1 and (held.erased, held.tables) == (0, [])
        assert op.physical_state == m.PhysicalState.PENDING and op.physically_erased_at is None
    finally:
        holder.rollback()
        holder.close()
    done = rewrite.finish_waiting_erasures()
    op.refresh_from_db()
    assert (done.held_by, done.erased) == (0, 1) and op.physical_state == m.PhysicalState.ERASED
    raw = b"".join(path.read_bytes() for path in _table_files("lifecycle_item"))
    assert secret.encode() not in raw


def test_on_sqlite_a_reader_that_keeps_the_log_says_why_the_erasure_is_still_pending(capsys):
    """A long read holding an older state kept the checkpoint from folding the log back: the
    command said only "Physically erased: 0 of 1; still pending: 1"."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL: the sessions holding old snapshots are counted and named (held_by)")
    conversation = factories.make_conversation(title="Read while erased")
    factories.add_message(conversation, "user", "words to erase " * 50)
    reader = sqlite3.connect(connection.settings_dict["NAME"])
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM lifecycle_item").fetchone()  # a snapshot from before the delete
        op = request_deletion(conversation, key="held-by-a-reader", acting_user=None)
        executor.run_erasure(op.pk)
        call_command("finish_erasure")
        out = capsys.readouterr().out
        assert "still pending: 1" in out
        assert "another connection is still reading an older state" in out
        assert m.DeleteOperation.objects.get(pk=op.pk).physical_state == "pending"
    finally:
        reader.close()
    call_command("finish_erasure")
    assert m.DeleteOperation.objects.get(pk=op.pk).physical_state == "erased"


def test_a_bound_delete_keeps_this_consoles_copy_of_the_title_physically_pending_until_finish_erasure(capsys,
                                                                                                       settings):
    """A console of a remote engine keeps a copy of each engine conversation's title (its
    binding). The request clears it and the acknowledgement deletes the binding, but the old
    rows stay in the database's files: on PostgreSQL in the bindings' table files, which
    finish_erasure did not rewrite ("No delete is waiting"), while nothing said so; on SQLite
    in the write-ahead log while a reader kept the acknowledgement's checkpoint busy, which
    was assumed done. The bound delete now says physically pending, then erased."""
    from django.test import Client
    from django.utils import translation

    from console.models import ApiToken
    from remote import delivery
    from remote.models import EngineBinding
    from tests.scripted_engine import scripted_engine

    title = factories.marker("console-title")[:100]
    target = "c_" + "d" * 20
    completed = {"id": "op_" + "2" * 20, "target": target, "state": "completed", "code": None,
                 "requested_at": "2026-01-01T00:00:00Z", "completed_at": "2026-01-01T00:00:01Z",
                 "receipt": {"stores": [{"store": "lifecycle.Item", "action": "erased", "records": 1, "bytes": 9}]}}
    binding = EngineBinding.objects.create(engine_id=target, owner_kind="account", owner_id=1, scope="bound",
                                           thread_id="t-title", title=title, engine_state="live")
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, completed)}) as (url, _seen):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        op = delivery.request_bound_delete(binding, key="console-copy", actor=None)
        # A reader's open snapshot keeps the acknowledgement's checkpoint busy.
        with sqlite_snapshot("remote_enginebinding"):
            assert delivery.deliver(op.pk, budget=5) == "completed"
    op.refresh_from_db()
    assert not EngineBinding.objects.filter(title=title).exists()
    assert op.physical_state == m.PhysicalState.PENDING and op.physically_erased_at is None
    if connection.vendor == "postgresql":
        assert title.encode() in _raw_bytes("remote_enginebinding")  # the old rows, in the table's files
    _token, raw = ApiToken.issue(factories.make_user(admin=True))
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")
    copy = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()["console_copy"]
    assert copy["physical"] == {"state": "pending", "erased_at": None}
    pending_holder = "database_files" if connection.vendor == "postgresql" else "wal"
    assert pending_holder in {h["kind"] for h in copy["holders"]}
    admin = Client(HTTP_HOST="127.0.0.1")
    admin.force_login(factories.make_user(admin=True))
    page = admin.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    translation.deactivate()
    assert 'data-testid="console-physical"' in page and "Borrado físico pendiente" in page, page

    call_command("finish_erasure", "--json")
    report = json.loads(capsys.readouterr().out)
    op.refresh_from_db()
    assert (report["waiting"], report["erased"], report["still_pending"]) == (1, 1, 0), report
    assert op.physical_state == m.PhysicalState.ERASED and op.physically_erased_at is not None
    if connection.vendor == "postgresql":
        assert report["tables"] == ["remote_enginebinding"]  # only the copy waited: no content table
    assert title.encode() not in _raw_bytes("remote_enginebinding")
    copy = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()["console_copy"]
    assert copy["physical"]["state"] == "erased" and copy["physical"]["erased_at"]
    assert not {h["kind"] for h in copy["holders"]} & {"database_files", "wal"}
    page = admin.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Physically erased as of" in page
    call_command("finish_erasure")
    assert "No delete is waiting" in capsys.readouterr().out


def test_a_title_cleared_by_a_read_that_found_it_deleted_elsewhere_is_erased_from_the_files_and_said(
        capsys, settings):
    """r74: a conversation deleted on the engine by other means (another console, the engine's
    own API) had its title cleared here by the next read of the engine's list, but the old
    title stayed in this console's files (PostgreSQL's table files and planner samples;
    SQLite's write-ahead log) with no delete to follow it: finish_erasure found nothing waiting
    and nothing said so. The binding now waits for the same checkpoint or rewrite, and Engine
    conversations and the API say so until then."""
    from django.test import Client

    from console.models import ApiToken
    from remote import physical, tasks
    from remote.models import EngineBinding
    from remote.sync import refresh
    from tests.scripted_engine import scripted_engine

    title = factories.marker("elsewhere-title")[:100]
    target = "c_" + "e" * 20
    listed = {"id": target, "owner": {"kind": "account", "id": 1}, "scope": "bound", "thread_id": "t-elsewhere",
              "state": "live", "title": title, "last_activity_at": "2026-01-01T00:00:00Z"}
    state = {"row": listed}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, {"results": [state["row"]], "next": None})}) as (
            url, _seen):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        refresh("")
        binding = EngineBinding.objects.get(engine_id=target)
        assert binding.title == title and binding.copy_pending_since is None
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE remote_enginebinding")  # the planner samples the title
        state["row"] = {**listed, "state": "deleted", "title": ""}  # deleted on the engine by other means
        with sqlite_snapshot("remote_enginebinding"):  # a reader keeps a checkpoint busy meanwhile
            refresh("")
            binding.refresh_from_db()
            assert (binding.title, binding.engine_state) == ("", "deleted") and binding.copy_pending_since
            assert tasks.sweep() == 0 and EngineBinding.objects.get(pk=binding.pk).copy_pending_since
        refresh("")  # read again: still pending, since the same moment
        assert EngineBinding.objects.get(pk=binding.pk).copy_pending_since == binding.copy_pending_since
    assert title.encode() in _raw_bytes("remote_enginebinding")

    _token, raw = ApiToken.issue(factories.make_user(admin=True))
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")
    [shown] = api.get("/api/v1/bindings?owner_kind=account&owner_id=1").json()["results"]
    assert shown["title"] == "" and shown["title_copy_pending_since"]
    admin = Client(HTTP_HOST="127.0.0.1")
    admin.force_login(factories.make_user(admin=True))
    page = admin.get("/engine/conversations/?owner=account:1").content.decode()
    assert 'data-testid="title-copy-pending"' in page and title not in page
    words = ("its write-ahead log still holds it until a checkpoint" if connection.vendor == "sqlite"
             else "its table files still hold it until an operator runs manage.py finish_erasure")
    assert words in page
    spanish = admin.get("/engine/conversations/?owner=account:1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert 'data-testid="title-copy-pending"' in spanish and words not in spanish

    if connection.vendor == "sqlite":
        assert tasks.sweep() == 0  # the minute sweep's checkpoint, no reader now
    else:
        call_command("finish_erasure", "--json")
        report = json.loads(capsys.readouterr().out)
        assert (report["waiting"], report["erased"], report["still_pending"], report["tables"]) == (
            1, 1, 0, ["remote_enginebinding"]), report
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stats WHERE tablename = 'remote_enginebinding' "
                           "AND most_common_vals::text LIKE %s", [f"%{title[:40]}%"])
            assert cursor.fetchone()[0] == 0
    assert EngineBinding.objects.get(pk=binding.pk).copy_pending_since is None
    assert not physical.cleared_titles().exists()
    assert title.encode() not in _raw_bytes("remote_enginebinding")
    assert 'data-testid="title-copy-pending"' not in admin.get("/engine/conversations/?owner=account:1").content.decode()
    assert api.get("/api/v1/bindings?owner_kind=account&owner_id=1").json()["results"][0][
        "title_copy_pending_since"] is None


def test_a_rewrite_marks_erased_only_the_copies_that_waited_before_it_began():
    """r77: the mark compared the time a read began with the rewrite's start, so a title a read
    cleared while the rewrite ran (its old row copied into the new table file) was marked erased.
    Only what waited when the rewrite began is now: a title cleared since, or cleared again since
    (a new time), stays pending."""
    from datetime import timedelta

    from django.utils import timezone

    from remote import physical
    from remote.models import EngineBinding

    def cleared(n: int, at):
        return EngineBinding.objects.create(engine_id=f"c_{n:020d}", owner_kind="account", owner_id=1, scope="bound",
                                            thread_id=f"t{n}", engine_state="deleted", copy_pending_since=at)

    long_ago = timezone.now() - timedelta(hours=1)
    waited, again = cleared(1, long_ago), cleared(2, long_ago)
    before = physical.waiting_now()
    late = cleared(3, long_ago)  # cleared while the rewrite ran, with a time older than its start
    EngineBinding.objects.filter(pk=again.pk).update(copy_pending_since=timezone.now())  # cleared again
    assert physical.record_compaction(before=before, finished_at=timezone.now(),
                                      tables_rewritten=physical.tables()) == 1
    assert set(physical.cleared_titles().values_list("pk", flat=True)) == {again.pk, late.pk}
    assert EngineBinding.objects.get(pk=waited.pk).copy_pending_since is None
    assert physical.record_compaction(before=physical.waiting_now(), finished_at=timezone.now(),
                                      tables_rewritten=["another_table"]) == 0  # not its table: nothing


def test_on_sqlite_the_minute_sweep_retries_a_bound_deletes_checkpoint_a_reader_kept_busy():
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL: only finish_erasure erases the copy physically")
    from django.utils import timezone

    from remote import tasks
    from remote.models import BoundDelete

    now = timezone.now()
    op = BoundDelete.objects.create(key="k-sweep", binding_ref="b_" + "0" * 20, engine_id="c_" + "e" * 20,
                                    owner_kind="account", owner_id=1, scope="bound", thread_id="t1",
                                    state="completed", receipt={"stores": []}, acknowledged_at=now,
                                    completed_at=now, physical_state=m.PhysicalState.PENDING)
    reader = sqlite3.connect(str(connection.settings_dict["NAME"]))
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM remote_bounddelete").fetchone()
        tasks.sweep()
        assert BoundDelete.objects.get(pk=op.pk).physical_state == m.PhysicalState.PENDING
    finally:
        reader.close()
    tasks.sweep()
    op.refresh_from_db()
    assert op.physical_state == m.PhysicalState.ERASED and op.physically_erased_at is not None


def test_a_bound_delete_acknowledged_by_older_code_is_physically_pending_until_finish_erasure(capsys, settings):
    """A rolling upgrade: new code records the request, a server still running the code from
    before remote 0004 acknowledges it (its UPDATE names no physical_state, which stays ""). The
    binding and its title are deleted, the title's old rows stay in the files: the delete is
    physically pending (it was neither, so finish_erasure said no delete was waiting), then
    erased."""
    from django.utils import timezone

    from remote import delivery, physical
    from remote.models import BoundDelete, EngineBinding
    from tests.scripted_engine import scripted_engine

    title = factories.marker("older-ack-title")[:100]
    binding = EngineBinding.objects.create(engine_id="c_" + "9" * 20, owner_kind="account", owner_id=1,
                                           scope="bound", thread_id="t-older-ack", title=title, engine_state="live")
    with scripted_engine({}) as (url, _seen):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        op = delivery.request_bound_delete(binding, key="older-ack", actor=None)
    # Keeps the log's frames from being checkpointed meanwhile (the older code tried none).
    with sqlite_snapshot("remote_enginebinding"):
        now = timezone.now()
        BoundDelete.objects.filter(pk=op.pk).update(state="completed", waiting_on="", binding=None,
                                                    acknowledged_at=now, completed_at=now, receipt={"stores": []})
        EngineBinding.objects.filter(pk=binding.pk).delete()
        op.refresh_from_db()
        assert op.physical_state == ""
        assert list(physical.waiting()) == [op]
        copy = physical.console_copy(op)
        assert copy is not None and copy["physical"] == {"state": "pending", "erased_at": None}
        assert ("wal" if connection.vendor == "sqlite" else "database_files") in {h["kind"] for h in copy["holders"]}
        assert title.encode() in _raw_bytes("remote_enginebinding")

    call_command("finish_erasure", "--json")
    report = json.loads(capsys.readouterr().out)
    op.refresh_from_db()
    assert (report["waiting"], report["erased"], report["still_pending"]) == (1, 1, 0), report
    assert op.physical_state == m.PhysicalState.ERASED and op.physically_erased_at is not None
    assert physical.console_copy(op)["physical"]["state"] == "erased"
    assert title.encode() not in _raw_bytes("remote_enginebinding")


def test_on_sqlite_a_checkpoint_marks_more_pending_bound_deletes_than_sqlite_takes_variables():
    """remote 0004 made every completed bound delete pending; marking them erased named each in
    one statement: past 32,766 SQL variables (the default limit of many SQLite builds) every
    checkpoint failed with "too many SQL variables" and none was ever erased."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's variable limit")
    from django.utils import timezone

    from remote import physical
    from remote.models import BoundDelete

    now = timezone.now()
    BoundDelete.objects.bulk_create([
        BoundDelete(key=f"k-{i}", public_id=f"bd_{i:020x}", binding_ref=f"b_{i:020x}", engine_id=f"c_{i:020x}",
                    owner_kind="account", owner_id=1, scope="bound", thread_id=f"t{i}", state="completed",
                    receipt={"stores": []}, acknowledged_at=now, completed_at=now, requested_at=now,
                    physical_state=m.PhysicalState.PENDING)
        for i in range(33_000)
    ], batch_size=500)
    connection.ensure_connection()
    saved = connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)
    try:
        assert physical.checkpoint() == 33_000
    finally:
        connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, saved)
    assert BoundDelete.objects.filter(physical_state=m.PhysicalState.ERASED).count() == 33_000


def test_finish_erasure_measures_the_reusable_space_again_after_its_rewrite(capsys, admin_client):
    """PostgreSQL: the rewrite hands a large delete's space back to the file system; the figure
    kept from the last measurement (the 15-minute job) was larger than the whole database
    after it, and stayed on Data & storage and in the API until that job ran again. SQLite's
    reusable space is read live from the file at every read (nothing is kept): it is checked
    against the file's size the same way."""
    import base64
    import os

    from retention.models import StorageSnapshot
    from retention.storage import database_size, measure_database

    target = factories.make_conversation(title="Large")
    for _ in range(40):  # random text: TOAST cannot compress it, ~40 MB stored
        factories.add_message(target, content=base64.b64encode(os.urandom(768 * 1024)).decode())
    op = request_deletion(target, key="reuse-1", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    measure_database()  # what the measure-database job does, before the rewrite
    before = database_size()

    call_command("finish_erasure", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["still_pending"] == 0, report  # (SQLite: the delete's own checkpoint erased it already)
    after = database_size()
    assert after.reusable_bytes <= after.file_bytes, after
    answer = admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()["database"]
    assert answer["reusable_bytes"] <= answer["file_bytes"], answer
    if connection.vendor == "postgresql" and not before.reusable_is_estimate:
        assert report["erased"] == 1 and "lifecycle_item" in report["tables"], report
        assert before.reusable_bytes > 30 * 1024 * 1024 > after.file_bytes, (before, after)  # the review's case
        kept = StorageSnapshot.load()
        assert kept.reusable_measured_at > before.reusable_measured_at  # measured again by finish_erasure
        assert (after.reusable_bytes, after.reusable_is_estimate) == (kept.reusable_bytes, False)
        assert after.reusable_bytes < 5 * 1024 * 1024
        assert answer["reusable_bytes"] == kept.reusable_bytes



def test_a_read_held_in_another_database_does_not_keep_the_rewrite_from_erasing(monkeypatch):
    """r35: a long read in another database of the server (another application, a pg_dump of
    it) kept every receipt pending ("3 sessions still hold snapshots"), though since PostgreSQL
    14 only this database's snapshots keep VACUUM FULL from dropping its deleted rows. The
    rewrite now goes ahead, and the rows are gone from the table's files."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite's physical erasure is the WAL checkpoint")
    import psycopg

    from lifecycle.deletion import rewrite

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int")
        if cursor.fetchone()[0] < 140000:
            pytest.skip("before PostgreSQL 14 every session's snapshot holds every database back")
    monkeypatch.setattr(rewrite, "HORIZON_WAIT_SECONDS", 5)  # other test runs' short writes may end
    settings_dict = connection.settings_dict
    target = factories.make_conversation(title="Erase me too")
    secret = factories.marker("read-elsewhere-secret")
    factories.add_message(target, content=secret)
    reader = psycopg.connect(host=settings_dict["HOST"] or "127.0.0.1", port=settings_dict["PORT"] or 5432,
                             user=settings_dict["USER"], dbname="postgres")
    try:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM pg_class").fetchone()  # a snapshot from before the delete, no writes
        op = request_deletion(target, key="read-elsewhere", acting_user=None)
        assert executor.run_erasure(op.pk) == "completed"
        with connection.cursor() as cursor:  # the reader's snapshot is older than the delete
            cursor.execute("SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = %s",
                           [reader.info.backend_pid])
            assert cursor.fetchone()[0]
        done = rewrite.finish_waiting_erasures()
        op.refresh_from_db()
        assert (done.held_by, done.erased) == (0, 1) and op.physical_state == m.PhysicalState.ERASED
        raw = b"".join(path.read_bytes() for path in _table_files("lifecycle_item"))
        assert secret.encode() not in raw  # rewritten while the reader still held its snapshot
    finally:
        reader.rollback()
        reader.close()


def test_finish_erasure_killed_at_any_of_its_points_is_finished_by_the_next_run(tmp_path):
    """Killed (SIGKILL) after a table's rewrite, after the statistics', after the receipts were
    marked, or between two receipts (SQLite): the next run finishes, every receipt marked once,
    and the erased text is gone from the files while the kept text stays."""
    import os
    import subprocess
    import sys

    from tests.test_jobs import ROOT, database_url

    secrets, ops = [], []
    for n in range(2):
        target = factories.make_conversation(title=f"Killed finish {n}")
        secrets.append(factories.marker(f"finish-killed-secret-{n}"))
        factories.add_message(target, content=secrets[-1])
        ops.append(request_deletion(target, key=f"finish-killed-{n}", acting_user=None))
    bystander = factories.make_conversation(title="Stays")
    kept = factories.marker("finish-killed-kept")
    factories.add_message(bystander, content=kept)
    with sqlite_snapshot("lifecycle_item"):
        for op in ops:
            assert executor.run_erasure(op.pk) == "completed"
    assert set(m.DeleteOperation.objects.values_list("physical_state", flat=True)) == {m.PhysicalState.PENDING}
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "DATABASE_URL": database_url(),
           "LETHE_TEST_KILL_AT": "*", "LETHE_TEST_KILL_DIR": str(kills)}
    runs = []
    while not runs or runs[-1].returncode != 0:
        assert len(runs) < 10, [r.stderr[-500:] for r in runs]
        runs.append(subprocess.run([sys.executable, "manage.py", "finish_erasure", "--json"], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=300))
        assert runs[-1].returncode in (0, -9), runs[-1].stderr[-2000:]
    killed = {path.name for path in kills.iterdir()}
    assert killed == ({"finish-erasure-table", "finish-erasure-statistics", "finish-erasure-recorded"}
                      if connection.vendor == "postgresql" else {"finish-erasure-checkpoint"}), killed
    assert len(runs) == len(killed) + 1  # each point killed once, then a run to the end
    assert set(m.DeleteOperation.objects.values_list("physical_state", flat=True)) == {m.PhysicalState.ERASED}
    raw = _raw_bytes("lifecycle_item")
    assert kept.encode() in raw and not any(secret.encode() in raw for secret in secrets)
    assert json.loads(runs[-1].stdout)["still_pending"] == 0
