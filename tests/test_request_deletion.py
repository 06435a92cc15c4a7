"""Delete: admission, the intent, erasure store by store, the tombstone and the receipt."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django_q.models import OrmQ

from lifecycle import fleet
from lifecycle import models as m
from lifecycle.actions.append_item import append_item
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from lifecycle.deletion.plan import step_keys
from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused
from lifecycle.registry import STORES, RetentionClass
from lifecycle.search import fold
from tests import factories

pytestmark = pytest.mark.django_db

ERASED_TABLES = [s for s in STORES if s.kind == "table" and s.retention == RetentionClass.ERASE and not s.tombstone]


def delete(conversation, key="k-1", user=None) -> m.DeleteOperation:
    return request_deletion(conversation, key=key, acting_user=user)


def test_it_erases_every_erase_store_and_keeps_every_retained_row(admin_user, engine_home):
    target = factories.make_conversation(title="Secret launch plans")
    markers = factories.fill_every_store(target)
    # The same raw thread id under another owner, with its own content: a different conversation.
    twin = factories.make_conversation(factories.make_computer("box"), thread_id=target.thread_id, title="Twin")
    twin_markers = factories.fill_every_store(twin)
    home = EngineHome()

    op = delete(target, user=admin_user)
    assert op.state == m.DeleteState.PENDING
    target.refresh_from_db()
    assert target.state == m.ConversationState.PENDING_DELETE
    assert m.DeletionFence.objects.filter(conversation_id=target.pk).exists()
    assert executor.run_erasure(op.pk) == m.DeleteState.COMPLETED

    target.refresh_from_db()
    assert (target.state, target.title, target.thread_id) == ("deleted", "", twin.thread_id)
    assert target.search_title in ("", None)  # the folded title is content too
    assert not m.Conversation.objects.search("Secret launch").exists()
    assert m.Conversation.objects.search(target.thread_id).count() == 2  # identity stays findable
    for s in ERASED_TABLES:
        assert not s.rows(target).exists(), s.key
        assert s.rows(twin).exists(), s.key
    for s in (m.OperationBinding, m.HistoryReceipt):
        row = s.objects.get(conversation=target)
        assert (row.operation_id, row.target_id, row.outcome) in {("op_b1", "turn_1", "applied"), ("op_h1", "item_1", "applied")}
        assert getattr(row, "request" if s is m.OperationBinding else "detail") is None
    for folder in home.conversation_paths(target.storage_key):
        assert not folder.exists()
    for folder in home.conversation_paths(twin.storage_key):
        assert folder.exists()
    # Fleet rows: the target's gone from both files, the twin's kept.
    for path in (home.fleet_path, home.legacy_fleet_path):
        rows = fleet.read_rows(path)
        assert not fleet.children(rows, target)
        assert fleet.children(rows, twin)
    # Kept: exports (detached), workspace files, memory, facts; shared links revoked where possible.
    export = m.Export.objects.get(path__contains=markers["lifecycle.Export"])
    assert export.conversation_id is None
    assert m.WorkspaceFile.objects.filter(conversation=target).count() == 1
    assert m.MemoryEntry.objects.filter(conversation=target, text=markers["lifecycle.MemoryEntry"]).exists()
    assert m.UsageFact.objects.filter(conversation=target).count() == 1
    assert m.BillingFact.objects.filter(conversation=target).count() == 1
    links = {link.publisher: link.revoked_at for link in m.SharedLink.objects.filter(conversation=target)}
    assert links["web"] is not None and links["mirror"] is None
    # Nothing of the twin changed.
    assert m.Item.objects.filter(conversation=twin, content=twin_markers["lifecycle.Item"]).exists()
    assert m.SharedLink.objects.filter(conversation=twin, revoked_at__isnull=True).count() == 2


def test_it_writes_an_exact_content_free_receipt(admin_user):
    target = factories.make_conversation(title="Receipt check")
    markers = factories.fill_every_store(target)
    items = m.Item.objects.filter(conversation=target).count()
    op = delete(target, user=admin_user)
    executor.run_erasure(op.pk)
    op.refresh_from_db()
    receipt = op.receipt
    by_store = {e["store"]: e for e in receipt["stores"]}
    assert [e["store"] for e in receipt["stores"]] == step_keys()[1:]
    assert by_store["lifecycle.Item"]["records"] == items == 2
    assert by_store["lifecycle.Item"]["bytes"] > len(markers["lifecycle.Item"])
    assert by_store["lifecycle.Turn"]["records"] == 1
    # The title and its search fold (lifecycle.search), both erased.
    assert by_store["lifecycle.Conversation"] == {"store": "lifecycle.Conversation", "class": "erase",
                                                  "action": "erased", "records": 1,
                                                  "bytes": len("Receipt check") + len(fold("Receipt check"))}
    assert by_store["lifecycle.OperationBinding"]["action"] == "compacted"
    assert by_store["lifecycle.OperationBinding"]["records"] == 1
    assert by_store["events"]["records"] == 2  # the log and its lock file
    assert by_store["subagents"]["records"] == 1 and by_store["legacy_subagents"]["records"] == 1
    assert by_store["lifecycle.Export"] == {"store": "lifecycle.Export", "class": "retain_detach",
                                            "action": "detached", "records": 1, "bytes": 0}
    assert by_store["lifecycle.SharedLink"]["records"] == 1 and by_store["lifecycle.SharedLink"]["remaining"] == 1
    kept = {e["store"]: e for e in receipt["kept"]}
    assert kept["lifecycle.MemoryEntry"]["records"] == 1
    assert kept["lifecycle.UsageFact"]["records"] == 1
    # The kept counts are the rows as they stand after the delete, its own audit fact included
    assert kept["lifecycle.AuditFact"]["records"] == m.AuditFact.objects.filter(conversation=target).count()
    assert m.AuditFact.objects.filter(conversation=target, action="conversation.deleted").exists()
    # "Erased or compacted" counts the same stores its bytes do: rows as records (a fleet file's
    # rows too; not the conversation's own, which stays as the tombstone), the conversation's
    # folders' entries as files
    changed = [e for e in receipt["stores"] if e["action"] in ("erased", "compacted")]
    folders = {"events", "approval_receipts", "artifacts"}
    assert by_store["lifecycle.Conversation"]["records"] == 1  # its title erased; the row stays
    assert executor.changed_totals(receipt["stores"]) == {
        "records": sum(e["records"] or 0 for e in changed
                       if e["store"] not in folders and e["store"] != "lifecycle.Conversation"),
        "files": sum(e["records"] or 0 for e in changed if e["store"] in folders),
        "bytes": sum(e["bytes"] or 0 for e in changed), "partial": False}  # its own receipt: every figure given
    assert any(e["action"] == "compacted" and e["records"] for e in changed)
    assert kept["provider"]["action"] == "out_of_scope"
    text = json.dumps(receipt)
    for value in markers.values():
        assert value not in text
    assert "Receipt check" not in text
    assert op.completed_at is not None and op.step == ""
    # Nor do the steps the operation keeps hold the erased subagent rows' ids (text the runtime wrote)
    agent = "sa_" + target.public_id[2:10]
    details = json.dumps(list(m.DeleteStep.objects.filter(operation=op).values_list("detail", flat=True)))
    assert agent not in details and agent not in text


def test_a_migration_forgets_the_agent_ids_earlier_deletes_kept_on_their_steps():
    import importlib

    from django.apps import apps

    migration = importlib.import_module("lifecycle.migrations.0022_step_detail_without_agent_ids")
    target = factories.make_conversation(title="Earlier delete")
    op = delete(target)
    executor.run_erasure(op.pk)
    step = m.DeleteStep.objects.get(operation=op, key="subagents")
    m.DeleteStep.objects.filter(pk=step.pk).update(detail={"agents": ["sa_earlier"], "again": {"records": 1, "bytes": 9}})

    migration.forget_agent_ids(apps, None)

    assert m.DeleteStep.objects.get(pk=step.pk).detail == {"again": {"records": 1, "bytes": 9}}
    assert not m.DeleteStep.objects.filter(detail__has_key="agents").exists()


def test_it_records_the_intent_and_its_job_before_erasing_anything(admin_user):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    before = m.Item.objects.filter(conversation=target).count()
    op = delete(target, user=admin_user)
    assert OrmQ.objects.count() == 1  # the erasure job, committed with the intent
    assert [s.key for s in op.steps.order_by("position")] == step_keys()
    assert m.Item.objects.filter(conversation=target).count() == before
    audit = m.AuditFact.objects.get(action="conversation.delete_requested")
    assert (audit.actor, audit.conversation) == (admin_user, target)
    assert audit.old_value == {"state": "live"}
    assert audit.new_value == {"state": "pending_delete", "operation": op.public_id}


def test_it_refuses_an_active_conversation_with_one_code_per_cause_and_records_no_intent(admin_user):
    target = factories.make_conversation()
    factories.start_turn(target)
    m.RuntimeClaim.objects.create(conversation=target, kind=m.ClaimKind.SHELL_JOB, label="make")
    m.RuntimeClaim.objects.create(conversation=target, kind=m.ClaimKind.AUTOMATION, label="nightly")
    op = delete(target, user=admin_user)
    assert (op.state, op.reason) == ("refused", "conversation_turn_active")
    assert op.reasons == ["conversation_turn_active", "conversation_shell_job_live", "conversation_ownership_unresolved"]
    target.refresh_from_db()
    assert target.state == "live"
    assert not m.DeletionFence.objects.exists() and not op.steps.exists() and OrmQ.objects.count() == 0
    append_item(target, role="user", content="still writable")
    # The same key answers the same, even once the cause is gone; a new key asks again.
    m.Turn.objects.update(state=m.TurnState.DONE)
    m.RuntimeClaim.objects.all().delete()
    assert delete(target, key="k-1").pk == op.pk
    again = delete(target, key="k-2")
    assert again.state == "pending"


@pytest.mark.parametrize(("kind", "code"), [
    (m.ClaimKind.APPROVAL, "conversation_approval_pending"),
    (m.ClaimKind.USER_INPUT, "conversation_input_pending"),
    (m.ClaimKind.DYNAMIC_TOOL, "conversation_dynamic_tool_pending"),
    (m.ClaimKind.SHELL_JOB, "conversation_shell_job_live"),
    (m.ClaimKind.TASK, "conversation_ownership_unresolved"),
])
def test_it_names_each_pending_claim(kind, code):
    target = factories.make_conversation()
    m.RuntimeClaim.objects.create(conversation=target, kind=kind)
    op = delete(target)
    assert (op.state, op.reason, op.reasons) == ("refused", code, [code])


def test_it_refuses_while_a_child_is_running_or_undelivered():
    target = factories.make_conversation()
    fleet.put_row({"agent_id": "sa_run", "origin": {"conversation": target.public_id}, "status": "completed",
                   "delivery": "pending"})
    op = delete(target)
    assert (op.state, op.reason) == ("refused", "conversation_child_content_custody_unavailable")


def test_it_is_unavailable_while_a_legacy_row_of_unknown_origin_overlaps(admin_user):
    target = factories.make_conversation(days_idle=1)
    other = factories.make_conversation(days_idle=400)
    legacy = {"agent_id": "sa_legacy", "origin": None, "status": "completed", "delivery": "settled",
              "started_at": target.created_at.isoformat(), "finished_at": target.last_activity_at.isoformat(),
              "prompt": "who knows"}
    fleet.update_fleet(lambda rows: [*rows, legacy])
    op = delete(target)
    assert (op.state, op.reason) == ("unavailable", "conversation_child_ownership_ambiguous")
    assert not m.DeletionFence.objects.exists()
    # Its lifetime does not overlap a conversation that ended long before.
    assert delete(other, key="k-other").state == "pending"


def test_it_is_unavailable_when_the_fleet_file_cannot_be_read(engine_home):
    target = factories.make_conversation()
    home = EngineHome()
    home.fleet_path.parent.mkdir(parents=True, exist_ok=True)
    home.fleet_path.write_bytes(b'{"agents": [ broken')
    op = delete(target)
    assert (op.state, op.reason) == ("unavailable", "conversation_child_state_unreadable")


def test_it_answers_a_second_request_with_the_operation_in_flight():
    target = factories.make_conversation()
    first = delete(target, key="a")
    assert delete(target, key="b").pk == first.pk
    assert delete(target, key="a").pk == first.pk
    assert m.DeleteOperation.objects.count() == 1
    assert set(m.OperationKey.objects.values_list("key", flat=True)) == {"a", "b"}


def test_it_refuses_a_key_used_for_another_conversation():
    first, second = factories.make_conversation(), factories.make_conversation()
    delete(first, key="same")
    with pytest.raises(ActionRefused) as caught:
        delete(second, key="same")
    assert (caught.value.code, caught.value.status) == ("idempotency_key_reused", 422)
    second.refresh_from_db()
    assert second.state == "live" and not m.DeleteOperation.objects.filter(conversation=second).exists()


@pytest.mark.parametrize("key", ["", None, "has space", "x" * 201, "ñ"])
def test_it_refuses_a_missing_or_malformed_key(key):
    target = factories.make_conversation()
    with pytest.raises(ActionRefused) as caught:
        delete(target, key=key)
    assert caught.value.status == 400
    assert not m.DeleteOperation.objects.exists() and not m.OperationKey.objects.exists()


def test_it_refuses_every_write_path_once_the_intent_exists(admin_user):
    from lifecycle.actions.append_log import append_log
    from lifecycle.actions.import_items import import_items
    from lifecycle.actions.recover_torn_logs import recover_torn_logs
    from lifecycle.actions.set_archived import set_archived
    from lifecycle.actions.set_closed import set_closed
    from lifecycle.actions.update_item import update_item
    from lifecycle.actions.write_artifact import write_artifact

    target = factories.make_conversation(closed=True)
    item = factories.add_message(target)
    delete(target)
    attempts = [
        lambda: append_item(target, role="user", content="late"),
        lambda: update_item(item, title="late"),
        lambda: import_items(target, [{"role": "user", "content": "imported"}]),
        lambda: set_closed(target, closed=False, acting_user=admin_user),  # resume
        lambda: set_archived(target, archived=True, acting_user=admin_user),
        lambda: append_log(target, log="events", records=[{"late": True}]),
        lambda: write_artifact(target, name="late.txt", data=b"late"),
        lambda: recover_torn_logs(target),
        lambda: fleet.put_row({"agent_id": "sa_late", "origin": {"conversation": target.public_id}}),
    ]
    for attempt in attempts:
        with pytest.raises(ActionRefused) as caught:
            attempt()
        assert caught.value.code == "conversation_deletion_pending"
    assert m.Item.objects.filter(conversation=target).count() == 1
    assert not EngineHome().thread_dir(target.storage_key).exists()
    assert not EngineHome().artifacts_dir(target.storage_key).exists()
    assert not fleet.children(fleet.read_rows(EngineHome().fleet_path), target)


def test_it_refuses_a_raw_database_write_after_the_intent(admin_user):
    from django.db import IntegrityError, transaction

    from lifecycle.fence import is_fence_error

    target = factories.make_conversation()
    item = factories.add_message(target)
    op = delete(target)
    with pytest.raises(IntegrityError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE lifecycle_item SET content = 'late' WHERE id = %s", [item.pk])
    assert is_fence_error(caught.value)
    executor.run_erasure(op.pk)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lifecycle_item (conversation_id, seq, role, tool_kind, tool_call_id, status, title, content, "
            "payload_bytes, removable_bytes, revision, created_at, updated_at) "
            "VALUES (%s, 9, 'user', '', '', '', '', 'resurrected', 0, 0, 1, %s, %s)",
            [target.pk, "2026-01-01 00:00:00", "2026-01-01 00:00:00"],
        )
    assert not m.Item.objects.filter(conversation=target).exists()


def test_a_second_run_changes_nothing(admin_user):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = delete(target)
    executor.run_erasure(op.pk)
    op.refresh_from_db()
    receipt, completed = op.receipt, op.completed_at
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert (op.receipt, op.completed_at) == (receipt, completed)
    assert m.AuditFact.objects.filter(action="conversation.deleted").count() == 1


def test_it_stays_pending_with_a_clear_error_when_the_fleet_file_turns_unreadable():
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = delete(target)
    home = EngineHome()
    home.fleet_path.write_bytes(b"not json")
    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    target.refresh_from_db()
    assert (op.state, op.step, op.last_error) == ("pending", "subagents", "fleet_unreadable")
    assert target.state == "pending_delete"
    assert not m.Item.objects.filter(conversation=target).exists()  # earlier steps are done
    home.fleet_path.write_bytes(json.dumps({"version": 1, "agents": []}).encode())
    assert executor.run_erasure(op.pk, force=True) == "completed"


def test_a_symlinked_folder_is_never_followed_and_keeps_the_delete_pending(tmp_path):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    home = EngineHome()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_bytes(b"not the conversation's")
    folder = home.artifacts_dir(target.storage_key)
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    # The preview says that folder could not be counted, and does not fail (it answered 500)
    from lifecycle.deletion.preview import preview

    artifacts = next(s for s in preview(target)["stores"] if s["store"] == "artifacts")
    assert artifacts["records"] is None
    op = delete(target)
    assert executor.run_erasure(op.pk) == "pending"
    assert next(s for s in preview(target)["stores"] if s["store"] == "artifacts")["records"] is None
    op.refresh_from_db()
    assert (op.state, op.step, op.last_error) == ("pending", "artifacts", "unsafe_path")
    assert (outside / "precious.txt").read_bytes() == b"not the conversation's"
    folder.unlink()  # an operator removes the link
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert (outside / "precious.txt").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("special", ["fifo", "socket", "unreadable"])
def test_a_fifo_a_socket_or_an_unreadable_file_in_a_folder_does_not_stop_the_delete(special, monkeypatch):
    """The fingerprints read samples of the folder's regular files only: opening a FIFO waited
    for a writer for ever and a socket failed the delete at its first step on every retry."""
    import os
    import socket
    import threading

    target = factories.make_conversation()
    factories.fill_every_store(target)
    home = EngineHome()
    folder = home.artifacts_dir(target.storage_key)
    path = folder / f"special-{special}"
    listener = None
    if special == "fifo":
        os.mkfifo(path)
    elif special == "socket":
        listener = socket.socket(socket.AF_UNIX)
        with monkeypatch.context() as here:
            here.chdir(folder)  # a socket's address is at most 107 bytes: bound by its relative name
            listener.bind(path.name)
    else:
        path.write_bytes(b"secret")
        path.chmod(0)
    op = delete(target)
    done = []
    runner = threading.Thread(target=lambda: done.append(executor.run_erasure(op.pk)), daemon=True)
    runner.start()
    runner.join(60)
    try:
        assert done == ["completed"], "the delete finished"
        assert not folder.exists() and not os.path.lexists(path)
        op.refresh_from_db()
        assert op.state == "completed" and op.receipt["verification"]["logical"] == "clean"
    finally:
        if runner.is_alive() and special == "fifo":  # let a blocked open() go
            with open(path, "wb"):
                pass
        if listener is not None:
            listener.close()


@pytest.mark.django_db(transaction=True)
def test_the_receipt_names_the_backups_made_before_the_delete(settings, tmp_path):
    import os
    import time

    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    target = factories.make_conversation()
    verified = create_backup()  # a real backup, with its receipt sidecar beside it
    copied = settings.LETHE_BACKUP_DIR / "operator-copy.sqlite3"  # a copy an operator put there
    copied.write_bytes(b"backup")
    os.utime(copied, (time.time() - 3600, time.time() - 3600))
    time.sleep(0.01)
    op = delete(target)
    executor.run_erasure(op.pk)
    (settings.LETHE_BACKUP_DIR / "lethe-later.sqlite3").write_bytes(b"made after")
    op.refresh_from_db()
    backups = [h for h in op.receipt["holders"] if h["kind"] == "backup"]
    # Both hold the content; the receipt sidecar holds none; the later file never held it.
    assert sorted(h["name"] for h in backups) == sorted([verified.name, "operator-copy.sqlite3"])
    kinds = {h["kind"] for h in op.receipt["holders"]}
    if connection.vendor == "sqlite":
        # Nothing else held a snapshot, so the checkpoint ran: the log no longer holds it.
        assert op.physical_state == m.PhysicalState.ERASED and "wal" not in kinds
    else:
        # Until a compaction that rewrites the tables, their files are named too.
        assert op.physical_state == m.PhysicalState.PENDING and "database_files" in kinds


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outcome", ["published", "cancelled"])
def test_a_backup_being_made_while_a_delete_completes_is_named_on_its_receipt(settings, tmp_path, outcome):
    """The backup's copy started while the content was there: once published it holds that
    content, so the receipt names it, though it had no receipt (nor final name) when the delete
    completed. One that is then cancelled was never published: the receipt stops naming it."""
    from retention.backups import BackupError, create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    target = factories.make_conversation(title="Held by a backup ZQXBKP")
    factories.add_message(target)
    deleted = []

    def delete_meanwhile(*_figures):
        if not deleted:
            op = delete(target)
            assert executor.run_erasure(op.pk) == "completed"
            deleted.append(op)

    cancel = outcome == "cancelled"
    try:
        made = create_backup(progress=delete_meanwhile, should_cancel=lambda: cancel and bool(deleted))
    except BackupError as exc:
        assert cancel and exc.code == "cancelled"
        made = None
    assert deleted, "the delete completed while the backup was being made"
    op = m.DeleteOperation.objects.get(pk=deleted[0].pk)
    named = [h["name"] for h in op.receipt["holders"] if h["kind"] == "backup"]
    if cancel:
        assert made is None and named == [] and not list(settings.LETHE_BACKUP_DIR.glob("lethe-*"))
    else:
        assert named == [made.name]
        if connection.vendor == "sqlite":  # the copy really holds it (pg_dump's snapshot time is its own)
            assert b"ZQXBKP" in made.path.read_bytes()


@pytest.mark.django_db(transaction=True)
def test_a_backup_a_killed_run_left_is_taken_off_the_receipts_once_it_is_cleared_away(settings, tmp_path):
    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR.mkdir(mode=0o700)
    from django.db import connection

    from retention.backups import EXTENSIONS

    # a run of this database's engine killed mid-copy (one of another engine's is not this content)
    left = f"lethe-{connection.vendor}-20200101T000000Z-abcdef{EXTENSIONS[connection.vendor]}"
    (settings.LETHE_BACKUP_DIR / f".tmp-{left}").write_bytes(b"half a copy")
    target = factories.make_conversation()
    op = delete(target)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert left in [h["name"] for h in op.receipt["holders"] if h["kind"] == "backup"]  # it may hold it
    made = create_backup()  # the next backup clears what the killed run left
    op.refresh_from_db()
    assert [h["name"] for h in op.receipt["holders"] if h["kind"] == "backup"] == []
    assert made.path.exists() and not (settings.LETHE_BACKUP_DIR / f".tmp-{left}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_backup_discarded_while_the_delete_was_completing_is_not_left_on_its_receipt(settings, tmp_path,
                                                                                      monkeypatch):
    """The discard's forget ran before the delete's receipt was committed (it saw no completed
    delete); the delete looks again once its receipt is in."""
    from lifecycle.deletion import physical

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR.mkdir(mode=0o700)
    name = "lethe-sqlite-20200101T000000Z-abcdef.sqlite3"
    (settings.LETHE_BACKUP_DIR / ".lock").touch()  # the run making it holds the folder's lock file
    temp = settings.LETHE_BACKUP_DIR / f".tmp-{name}"
    temp.write_bytes(b"being made")
    holders = physical.holders

    def then_discarded(*args, **kwargs):  # listed while being made, then discarded before the commit
        found = holders(*args, **kwargs)
        temp.unlink()
        assert physical.forget_backup(name) == 0  # no completed delete names it yet
        return found

    monkeypatch.setattr(physical, "holders", then_discarded)
    op = delete(factories.make_conversation())
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert [h["name"] for h in op.receipt["holders"] if h["kind"] == "backup"] == []


def test_unrelated_conversations_jobs_and_drafts_survive():
    from django_q.tasks import async_task

    target = factories.make_conversation()
    factories.fill_every_store(target)
    other = factories.make_conversation(title="Someone else's")
    job = m.RuntimeClaim.objects.create(conversation=other, kind=m.ClaimKind.SHELL_JOB, label="npm test")
    draft = m.SessionDocument.objects.create(conversation=other, name="draft", document={"text": "half-written"})
    message = factories.add_message(other, content="still here")
    async_task("retention.tasks.measure_engine_folder")  # a job of the queue, not of the delete
    queued = OrmQ.objects.count()
    op = delete(target)
    executor.run_erasure(op.pk)
    assert m.RuntimeClaim.objects.open().filter(pk=job.pk).exists()
    assert m.SessionDocument.objects.get(pk=draft.pk).document == {"text": "half-written"}
    assert m.Item.objects.get(pk=message.pk).content == "still here"
    assert OrmQ.objects.count() == queued + 1  # the delete's own job was queued beside it
    other.refresh_from_db()
    assert (other.state, other.title) == ("live", "Someone else's")


def _rewrites_events_after(monkeypatch, target, *, times: int):
    """An engine writer outside Lethe's fence writes the conversation's event log again, just
    after the erasure removed a folder (at most `times` times)."""
    from lifecycle.deletion import files

    original = files.remove_folder
    home = EngineHome()
    written = []

    def remove_then_write(home_, path):
        result = original(home_, path)
        if len(written) < times:
            home.thread_dir(target.storage_key).mkdir(parents=True, exist_ok=True)
            (home.thread_dir(target.storage_key) / "events.jsonl").write_bytes(b'{"text": "written again"}\n')
            written.append(path)
        return result

    monkeypatch.setattr(files, "remove_folder", remove_then_write)
    return written


def test_content_written_again_after_its_step_is_erased_again_before_the_delete_completes(monkeypatch):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    written = _rewrites_events_after(monkeypatch, target, times=1)
    op = delete(target)
    assert executor.run_erasure(op.pk) == "completed"
    assert written, "the late writer wrote"
    assert not EngineHome().thread_dir(target.storage_key).exists()
    op.refresh_from_db()
    events = next(e for e in op.receipt["stores"] if e["store"] == "events")
    assert events["erased_again"] is True and events["records"] >= 2  # its own file and the one written again
    assert op.receipt["verification"]["logical"] == "clean" and op.verified_at is not None


@pytest.mark.parametrize("crash", ["after-the-erase", "before-the-erase"])
def test_a_crash_while_residue_is_erased_again_loses_none_of_its_figures_and_counts_none_twice(monkeypatch, crash):
    """r21: killed after erasing a store again and before adding its figures, the resumed delete
    completed with the store's own figures only and no "erased once more" note: a file was
    erased with no record of it. Its figures are recorded as pending before the erase, and
    added once by whichever run finds the store empty."""
    from lifecycle import faults

    target = factories.make_conversation()
    factories.fill_every_store(target)
    written = _rewrites_events_after(monkeypatch, target, times=1)
    op = delete(target)

    class Killed(BaseException):
        pass

    def kill_at(name: str) -> None:
        if name == "residue-erased":
            raise Killed(name)

    if crash == "before-the-erase":
        from lifecycle.deletion import stores

        erase = stores.erase

        def erase_or_die(store, *args, **kwargs):
            if store.key == "events" and m.DeleteStep.objects.filter(operation=op, key="events",
                                                                      detail__has_key="again_pending").exists():
                raise Killed("before the erase")
            return erase(store, *args, **kwargs)

        monkeypatch.setattr(stores, "erase", erase_or_die)
    else:
        monkeypatch.setattr(faults, "kill_point", kill_at)
    with pytest.raises(Killed):
        executor.run_erasure(op.pk)
    assert written
    size = len(b'{"text": "written again"}\n')
    step = m.DeleteStep.objects.get(operation=op, key="events")
    assert step.detail["again_pending"] == {"records": 1, "bytes": size} and "again" not in step.detail
    monkeypatch.undo()
    m.DeleteOperation.objects.filter(pk=op.pk).update(lease_expires_at=None)
    assert executor.run_erasure(op.pk, force=True) == "completed"
    step.refresh_from_db()
    assert step.detail["again"] == {"records": 1, "bytes": size} and "again_pending" not in step.detail
    op.refresh_from_db()
    events = next(e for e in op.receipt["stores"] if e["store"] == "events")
    assert events["erased_again"] is True
    assert (events["records"], events["bytes"]) == (step.records + 1, step.bytes + size)
    assert not EngineHome().thread_dir(target.storage_key).exists()


def test_content_written_again_and_again_keeps_the_delete_pending_never_completed(monkeypatch, admin_client):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    written = _rewrites_events_after(monkeypatch, target, times=100)
    op = delete(target)
    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    target.refresh_from_db()
    assert (op.state, op.last_error, target.state) == ("pending", "residue_found", "pending_delete")
    assert op.completed_at is None and op.receipt is None
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "was still there after a second erasure" in page and "Deleted on" not in page
    written.extend([None] * 100)  # the writer stops: the next run completes
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert not EngineHome().thread_dir(target.storage_key).exists()
    # Each round's figures are kept: the file erased again in the first run, and the one the
    # writer left while it was erased, erased by the second
    size = len(b'{"text": "written again"}\n')
    step = m.DeleteStep.objects.get(operation=op, key="events")
    assert step.detail["again"] == {"records": 2, "bytes": 2 * size}
    op.refresh_from_db()
    events = next(e for e in op.receipt["stores"] if e["store"] == "events")
    assert (events["records"], events["bytes"]) == (step.records + 2, step.bytes + 2 * size)


@pytest.mark.django_db(transaction=True)
def test_a_file_in_place_of_the_backup_folder_keeps_the_delete_pending_naming_that_folder(settings, tmp_path):
    """The receipt names the backups that hold the content; a file where the backup folder
    should be cannot be listed, so the delete waits, saying that folder is what to fix (not
    the engine folder), and completes once it is a folder again."""
    from django.utils import translation

    from lifecycle.deletion.errors import error_message

    folder = tmp_path / "backups"
    folder.write_text("a file where the backup folder should be")
    settings.LETHE_BACKUP_DIR = folder
    target = factories.make_conversation()
    op = delete(target)

    assert executor.run_erasure(op.pk) == m.DeleteState.PENDING
    op.refresh_from_db()
    assert (op.state, op.last_error) == (m.DeleteState.PENDING, "backup_folder_unreadable")
    said = error_message(op.last_error)
    assert f"The backup folder {folder} cannot be read" in said and "engine folder" not in said
    with translation.override("es"):
        assert f"La carpeta de copias de seguridad {folder} no se puede leer" in error_message(op.last_error)
    assert folder.read_text() == "a file where the backup folder should be"

    folder.unlink()
    folder.mkdir()
    m.DeleteOperation.objects.filter(pk=op.pk).update(next_attempt_at=None)
    assert executor.run_erasure(op.pk, force=True) == m.DeleteState.COMPLETED
    op.refresh_from_db()
    assert (op.state, op.last_error) == (m.DeleteState.COMPLETED, "")


def _bind(source, at) -> bool:
    """A real bind mount (root only); False where this machine does not allow one."""
    import subprocess

    return subprocess.run(["mount", "--bind", str(source), str(at)], capture_output=True).returncode == 0


def _unbind(at) -> None:
    import subprocess

    subprocess.run(["umount", str(at)], check=True)


def _outside(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_bytes(b"not the conversation's")
    (outside / "sub" / "keep2.txt").write_bytes(b"nor this")
    return outside


def _untouched(outside) -> bool:
    return ((outside / "keep.txt").read_bytes(), (outside / "sub" / "keep2.txt").read_bytes()) == (
        b"not the conversation's", b"nor this")


@pytest.mark.parametrize("where", ["inside", "at"])
def test_a_folder_bound_in_a_conversations_folder_is_never_entered_and_keeps_the_delete_pending(tmp_path, where):
    """r143: a folder bound (mount --bind) in a conversation's folder, or at it, keeps its device
    number, and the delete emptied it: everything outside the engine folder under it was erased
    and counted as the conversation's. The mount table tells it; the delete stays pending with
    unsafe_path and removes nothing there, the preview counts nothing there."""
    from lifecycle.deletion.preview import preview

    target = factories.make_conversation()
    factories.fill_every_store(target)
    home = EngineHome()
    outside = _outside(tmp_path)
    folder = home.artifacts_dir(target.storage_key)
    point = folder / "mnt" if where == "inside" else folder
    if where == "inside":
        point.mkdir()
    if not _bind(outside, point):
        pytest.skip("a bind mount needs root")
    try:
        assert next(s for s in preview(target)["stores"] if s["store"] == "artifacts")["records"] is None
        op = delete(target)
        assert executor.run_erasure(op.pk) == "pending"
        op.refresh_from_db()
        assert (op.state, op.step, op.last_error) == ("pending", "artifacts", "unsafe_path")
        assert _untouched(outside)
    finally:
        _unbind(point)
    assert _untouched(outside)
    assert executor.run_erasure(op.pk, force=True) == "completed"  # the operator took the mount away
    assert _untouched(outside) and not folder.exists()


def test_a_mount_the_table_names_keeps_the_delete_pending_wherever_proc_is(tmp_path, monkeypatch):
    """The same rule read from the mount table alone (a machine whose tests may not mount): a
    mount point in the folder, written as the kernel escapes it (a space as \\040)."""
    from lifecycle import enginefs

    target = factories.make_conversation()
    factories.fill_every_store(target)
    home = EngineHome()
    folder = home.artifacts_dir(target.storage_key)
    (folder / "a disk").mkdir()
    (folder / "a disk" / "theirs.txt").write_bytes(b"another file system's")
    table = tmp_path / "mountinfo"
    escaped = str(folder / "a disk").replace(" ", "\\040")
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n97 22 8:1 /x {escaped} rw - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(enginefs, "MOUNT_TABLE", table)
    op = delete(target)
    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    assert (op.state, op.last_error) == ("pending", "unsafe_path")
    assert (folder / "a disk" / "theirs.txt").read_bytes() == b"another file system's"
    monkeypatch.setattr(enginefs, "MOUNT_TABLE", tmp_path / "none")  # unmounted
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert not folder.exists()


def test_the_mount_table_is_read_by_lines_a_carriage_return_in_a_mount_point_included(tmp_path, monkeypatch):
    """r145: the kernel escapes space, tab, newline and backslash in a mount point, not a
    carriage return; the table was split at it too, and a mount below such a folder was missed."""
    from lifecycle import enginefs

    folder = tmp_path / "odd\rname" / "c_1"
    folder.mkdir(parents=True)
    table = tmp_path / "mountinfo"
    point = str(folder / "a disk").replace(" ", "\\040").encode()
    table.write_bytes(b"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n97 22 8:1 /x " + point + b" rw - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(enginefs, "MOUNT_TABLE", table)
    assert enginefs.mounts_within(folder) == [folder / "a disk"]
    assert enginefs.mounts_within(tmp_path / "elsewhere") == []
