"""A delete's receipt names the backups made before it as holding its content. Each surface
that shows the receipt reads the backup folder again: a backup the operator removed since no
longer holds the content and is not listed as holding it (the operation page, the API, `manage.py
conversations status`, `verify_erasure`, which dates the removal on the stored receipt); one
still there is; the stored receipt keeps every backup it named at completion."""

from __future__ import annotations

import io
import json
import os
import shutil
import time

import pytest
from django.core.management import call_command

from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)
HOST = {"HTTP_HOST": "127.0.0.1"}
GONE = "made before the delete: removed from the backup folder"
NOT_THERE = "made before the delete: no longer in the backup folder"


def _completed_with_backups(settings, tmp_path):
    """A delete completed after a verified backup and an operator's copy were made."""
    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    target = factories.make_conversation(title="Held by a backup")
    made = create_backup()
    kept = settings.LETHE_BACKUP_DIR / "operator-copy.sqlite3"
    kept.write_bytes(b"a copy")
    os.utime(kept, (time.time() - 3600, time.time() - 3600))
    time.sleep(0.01)
    op = request_deletion(target, key="held", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert sorted(h["name"] for h in op.receipt["holders"] if h["kind"] == "backup") == sorted(
        [made.name, kept.name])
    return op, made, kept


def _status(op) -> str:
    out = io.StringIO()
    call_command("conversations", "status", op.conversation.public_id, stdout=out)
    return out.getvalue()


def _holders_section(page: str) -> str:
    start = page.index('data-testid="physical"')
    return page[start:page.index("<h3>", start)]


def test_a_removed_backup_is_no_longer_listed_as_holding_the_content(settings, tmp_path, admin_client):
    op, made, kept = _completed_with_backups(settings, tmp_path)
    made.path.unlink()  # what docs/operations.md tells the operator to do with old backups
    made.path.with_name(made.name + ".json").unlink(missing_ok=True)

    api = admin_client.get(f"/v1/operations/{op.public_id}", **HOST).json()["receipt"]
    assert [h["name"] for h in api["holders"] if h["kind"] == "backup"] == [kept.name]
    assert [(b["name"], b["removed_at"]) for b in api["removed_backups"]] == [(made.name, None)]

    page = _holders_section(admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode())
    held = page[page.index('data-testid="holders"'):page.index('data-testid="removed-backups"')]
    assert kept.name in held and made.name not in held
    assert f"Backup {made.name}, {NOT_THERE}" in page

    status = _status(op)
    assert f"still held by: Backup {kept.name}" in status
    assert f"still held by: Backup {made.name}" not in status
    assert f"not in the backup folder any more: Backup {made.name}, {NOT_THERE}" in status

    # verify_erasure looks too, and dates the removal on the stored receipt
    out = io.StringIO()
    call_command("verify_erasure", "--all", "--json", stdout=out)
    backups = json.loads(out.getvalue())["reports"][0]["backups"]
    assert [b["name"] for b in backups["held"]] == [kept.name]
    assert [b["name"] for b in backups["removed"]] == [made.name] and backups["removed"][0]["removed_at"]
    op.refresh_from_db()
    stored = {h["name"]: h for h in op.receipt["holders"] if h["kind"] == "backup"}
    assert set(stored) == {made.name, kept.name}  # the receipt keeps what it named at completion
    assert stored[made.name]["removed_at"] == backups["removed"][0]["removed_at"]
    assert "removed_at" not in stored[kept.name]
    out = io.StringIO()
    call_command("verify_erasure", op.public_id, stdout=out)
    assert f"backup {made.name}: removed from the backup folder (found gone on " in out.getvalue()
    assert f"backup {kept.name}: made before the delete, still holds its content" in out.getvalue()

    page = _holders_section(admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode())
    assert f"Backup {made.name}, {GONE} (found gone on " in page
    status = _status(op)
    assert f"not in the backup folder any more: Backup {made.name}, {GONE} (found gone on " in status
    api = admin_client.get(f"/v1/operations/{op.public_id}", **HOST).json()["receipt"]
    assert api["removed_backups"] == [{"name": made.name, "made_at": stored[made.name]["made_at"],
                                       "removed_at": stored[made.name]["removed_at"]}]
    assert all("removed_at" not in h for h in api["holders"])

    # Every backup gone: nothing of the folder holds it any more
    kept.unlink()
    api = admin_client.get(f"/v1/operations/{op.public_id}", **HOST).json()["receipt"]
    assert [h for h in api["holders"] if h["kind"] == "backup"] == []
    assert "still held by: Backup" not in _status(op)


def test_a_backup_put_back_holds_the_content_again(settings, tmp_path, admin_client):
    op, made, kept = _completed_with_backups(settings, tmp_path)
    aside = tmp_path / "aside"
    shutil.move(kept, aside)
    call_command("verify_erasure", "--all", stdout=io.StringIO())
    op.refresh_from_db()
    assert [h.get("removed_at") is not None for h in op.receipt["holders"] if h.get("name") == kept.name] == [True]
    shutil.move(aside, kept)
    assert f"still held by: Backup {kept.name}" in _status(op)
    call_command("verify_erasure", "--all", stdout=io.StringIO())
    op.refresh_from_db()
    assert [h for h in op.receipt["holders"] if "removed_at" in h] == []


def test_a_backup_folder_that_is_not_there_removes_nothing_from_the_receipt(settings, tmp_path, admin_client):
    """A disk not mounted looks exactly like a folder emptied: the receipt keeps naming them."""
    op, made, kept = _completed_with_backups(settings, tmp_path)
    shutil.move(settings.LETHE_BACKUP_DIR, tmp_path / "unmounted")
    status = _status(op)
    assert f"still held by: Backup {made.name}" in status and f"still held by: Backup {kept.name}" in status
    api = admin_client.get(f"/v1/operations/{op.public_id}", **HOST).json()["receipt"]
    assert api["removed_backups"] == []
    out = io.StringIO()
    call_command("verify_erasure", "--all", stdout=out)
    op.refresh_from_db()
    assert [h for h in op.receipt["holders"] if "removed_at" in h] == []
    assert not settings.LETHE_BACKUP_DIR.exists()  # reading it created nothing
    # r149: the tool payload status (the Data & storage page, its API, the command) read the
    # folder by making it, empty; every receipt then said its backups were gone from it
    admin_client.get("/settings/system/data-storage/", **HOST)
    admin_client.get("/api/v1/system/tool-payload-retention", **HOST)
    call_command("tool_payloads", "status", stdout=io.StringIO())
    assert not settings.LETHE_BACKUP_DIR.exists()
    assert f"still held by: Backup {made.name}" in _status(op)


def test_the_confirmation_names_the_backups_that_hold_the_conversation_before_the_delete(settings, tmp_path,
                                                                                           admin_client, api):
    """r74: the confirmation said "Erased for good" and "cannot be undone" and named no backup,
    while the receipt, once the delete completed, named the backup made before it (restoring it
    brings the conversation back). The page and the API's preview name them before the delete;
    a backup made before the conversation existed holds nothing of it and is not named."""
    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    older = create_backup()  # before the conversation existed
    time.sleep(0.01)
    target = factories.make_conversation(title="Held by a backup")
    made = create_backup()
    url = f"/conversations/{target.public_id}/delete/"
    section = _preview_backups(admin_client.get(url, **HOST).content.decode())
    assert made.name in section and older.name not in section
    assert "restoring one brings it back" in section
    spanish = _preview_backups(admin_client.get(url, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode())
    assert "Todavía en copias de seguridad" in spanish and made.name in spanish
    preview = api.get(f"/v1/threads/{target.public_id}/deletion-preview").json()
    assert [(b["kind"], b["name"]) for b in preview["backups"]] == [("backup", made.name)]
    assert preview["backups"][0]["made_at"].endswith("Z")
    # The receipt then names the same backup
    op = request_deletion(target, key="held-preview", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert [h["name"] for h in op.receipt["holders"] if h["kind"] == "backup"] == [made.name]
    # r75: the receipt's times read as every other time the API gives (UTC, "Z")
    assert all(h["made_at"].endswith("Z") for h in op.receipt["holders"] if h["kind"] == "backup")
    assert op.receipt["verification"]["at"].endswith("Z")
    # No backup, nothing said
    other = factories.make_conversation(title="In no backup")
    made.path.unlink()
    assert 'data-testid="preview-backups"' not in admin_client.get(
        f"/conversations/{other.public_id}/delete/", **HOST).content.decode()
    assert api.get(f"/v1/threads/{other.public_id}/deletion-preview").json()["backups"] == []


def test_the_confirmation_names_every_backup_the_preview_names(settings, tmp_path, admin_client, api):
    """r77: names with a control character, and any past the 50th, were left off the page while
    the API's preview and the receipt named them."""
    settings.LETHE_BACKUP_DIR = folder = tmp_path / "backups"
    folder.mkdir()
    target = factories.make_conversation(title="Many copies")
    hour_ago = time.time() - 3600
    names = ["nightly\tcopy.sqlite3", *(f"copy-{n:02d}.sqlite3" for n in range(60))]
    for name in names:
        (folder / name).write_bytes(b"a copy")
        os.utime(folder / name, (hour_ago, hour_ago))
    preview = api.get(f"/v1/threads/{target.public_id}/deletion-preview").json()
    assert sorted(b["name"] for b in preview["backups"]) == sorted(names)
    section = _preview_backups(admin_client.get(f"/conversations/{target.public_id}/delete/", **HOST).content.decode())
    assert section.count("<li>") == 61 and "nightly\tcopy.sqlite3" in section and "copy-59.sqlite3" in section


def test_a_backup_folder_that_cannot_be_read_is_named_at_confirmation(settings, tmp_path, admin_client):
    if os.geteuid() == 0:
        folder = tmp_path / "backups"
        folder.write_bytes(b"a file where the folder should be")  # unreadable as a folder, even as root
    else:
        folder = tmp_path / "backups"
        folder.mkdir()
        folder.chmod(0)
    settings.LETHE_BACKUP_DIR = folder
    target = factories.make_conversation(title="Folder unreadable")
    page = admin_client.get(f"/conversations/{target.public_id}/delete/", **HOST).content.decode()
    assert "which cannot be read now" in _preview_backups(page)


def _preview_backups(page: str) -> str:
    start = page.index('data-testid="preview-backups"')
    return page[start:page.index("</section>", start)]


def test_a_receipt_stored_before_times_ended_in_z_is_served_with_them(settings, tmp_path, api):
    """r77: receipts written before r75 keep "+00:00" times in the database and were served so."""
    from lifecycle import models as m

    op, made, _kept = _completed_with_backups(settings, tmp_path)
    old = {**op.receipt, "verification": {**op.receipt.get("verification", {}), "at": "2026-12-06T20:36:07.395077+00:00"},
           "holders": [{**h, "made_at": "2026-12-06T19:36:07.293901+00:00"} if h.get("kind") == "backup" else h
                       for h in op.receipt["holders"]]}
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt=old)
    receipt = api.get(f"/v1/operations/{op.public_id}").json()["receipt"]
    assert receipt["verification"]["at"] == "2026-12-06T20:36:07.395077Z"
    assert {h["made_at"] for h in receipt["holders"] if h["kind"] == "backup"} == {"2026-12-06T19:36:07.293901Z"}
    assert "+00:00" not in str(receipt)
