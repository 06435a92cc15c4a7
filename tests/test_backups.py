"""Backups on the configured engine: real copies in a temporary folder, restored and counted."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import translation

from lifecycle.models import Conversation, Item
from retention import backups
from retention.backups import (
    BackupError,
    create_backup,
    list_backups,
    restore_instructions,
    verify_backup,
)
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent
RESTORE_DB = "lethe_backup_restore"
OTHER_DB = "lethe_backup_other"


@pytest.fixture
def folder(settings, tmp_path):
    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    return settings.LETHE_BACKUP_DIR


def fill(messages: int = 40, size: int = 2000) -> Conversation:
    conversation = factories.make_conversation(title="Backed up")
    factories.add_message(conversation, content="first")
    Item.objects.bulk_create(
        Item(conversation=conversation, seq=seq, role="assistant", content=f"{seq:06d}" + "b" * size)
        for seq in range(2, messages + 1)
    )
    return conversation


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != backups.LOCK_NAME)


def pg_admin(dbname: str = "postgres") -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(dbname=dbname, user=s["USER"] or None, host=s["HOST"] or None,
                           port=s["PORT"] or None, password=s["PASSWORD"] or None, autocommit=True)


def pg_cli_env() -> dict:
    s = connection.settings_dict
    return {**os.environ, "PGUSER": s["USER"], "PGHOST": s["HOST"], "PGPORT": str(s["PORT"]),
            "PGPASSWORD": s["PASSWORD"]}


def restored_counts(receipt) -> tuple[int, int]:
    """Restore the backup the way docs/operations.md says and count conversations and items."""
    if receipt.vendor == "sqlite":
        db = sqlite3.connect(receipt.path)
        try:
            return (db.execute("SELECT count(*) FROM lifecycle_conversation").fetchone()[0],
                    db.execute("SELECT count(*) FROM lifecycle_item").fetchone()[0])
        finally:
            db.close()
    with pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{RESTORE_DB}"')
        admin.execute(f'CREATE DATABASE "{RESTORE_DB}"')
    try:
        dump, restore = backups._pg_tools()
        subprocess.run([restore, "--no-owner", f"--dbname={RESTORE_DB}", str(receipt.path)],
                       check=True, env=pg_cli_env(), capture_output=True)
        with pg_admin(RESTORE_DB) as db:
            return (db.execute("SELECT count(*) FROM lifecycle_conversation").fetchone()[0],
                    db.execute("SELECT count(*) FROM lifecycle_item").fetchone()[0])
    finally:
        with pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{RESTORE_DB}"')


def test_it_creates_lists_verifies_and_restores_a_backup(folder):
    fill(messages=40)
    seen = []
    receipt = create_backup(progress=lambda done, total: seen.append((done, total)))

    assert receipt.vendor == connection.vendor
    assert backups.NAME_PATTERN.match(receipt.name)
    assert receipt.path == folder / receipt.name
    assert receipt.size == receipt.path.stat().st_size > 0
    assert receipt.sha256 == hashlib.sha256(receipt.path.read_bytes()).hexdigest()
    assert receipt.created_at.utcoffset().total_seconds() == 0
    assert receipt.database == backups._configured_database()
    assert seen, "progress was reported"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert receipt.path.stat().st_mode & 0o777 == 0o600
    sidecar = folder / (receipt.name + ".json")
    assert sidecar.stat().st_mode & 0o777 == 0o600
    assert json.loads(sidecar.read_text())["sha256"] == receipt.sha256
    assert files_in(folder) == [receipt.name, receipt.name + ".json"]

    assert list_backups() == [receipt]
    assert verify_backup(receipt.name) == receipt
    assert restored_counts(receipt) == (1, 40)


def test_it_copies_committed_rows_while_another_connection_writes(folder):
    """The copy is one snapshot: rows committed during it are not half in."""
    conversation = fill(messages=200, size=4000)
    before = Item.objects.count()
    if connection.vendor == "sqlite":
        writer = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=20)
        writes = []

        def progress(done, total):
            writer.execute("INSERT INTO lifecycle_item (conversation_id, seq, role, tool_kind, tool_call_id, status, "
                           "title, content, payload_bytes, removable_bytes, payload_skip, revision, created_at, "
                           "updated_at) VALUES (?, ?, 'user', '', '', '', '', 'late', 0, 0, '', 1, '2026-01-01', "
                           "'2026-01-01')", (conversation.id, 10_000 + len(writes)))
            writes.append(done)

        original = backups.SQLITE_STEP_PAGES
        backups.SQLITE_STEP_PAGES = 16
        try:
            receipt = create_backup(progress=progress)
        finally:
            backups.SQLITE_STEP_PAGES = original
            writer.close()
        assert len(writes) > 5, "the copy took several steps, each followed by a commit elsewhere"
        assert Item.objects.count() == before + len(writes)
        assert restored_counts(receipt) == (1, before)
    else:
        receipt = create_backup()
        assert restored_counts(receipt) == (1, before)
    assert verify_backup(receipt.name) == receipt


def write_receipt(receipt, **changes) -> None:
    data = {**receipt.as_json(), **changes}
    (receipt.path.parent / (receipt.name + ".json")).write_text(json.dumps(data))


def test_it_detects_a_truncated_backup(folder):
    fill(messages=300)
    receipt = create_backup()
    data = receipt.path.read_bytes()
    receipt.path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "checksum_mismatch"

    # Damage before the receipt was written (what create checks): the hash matches, the
    # content does not read back.
    truncated = receipt.path.read_bytes()
    write_receipt(receipt, sha256=hashlib.sha256(truncated).hexdigest(), size=len(truncated))
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "verify_failed"
    assert caught.value.message


def test_it_detects_a_corrupted_backup(folder):
    fill(messages=300)
    receipt = create_backup()
    data = bytearray(receipt.path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    receipt.path.write_bytes(bytes(data))
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "checksum_mismatch"
    write_receipt(receipt, sha256=hashlib.sha256(bytes(data)).hexdigest())
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "verify_failed"


def test_it_refuses_a_backup_of_another_database(folder):
    fill(messages=5)
    receipt = create_backup()
    write_receipt(receipt, database="someone-else")
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "wrong_database"

    if connection.vendor == "postgresql":
        # A real archive of another database, with a receipt that claims it is ours.
        with pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{OTHER_DB}"')
            admin.execute(f'CREATE DATABASE "{OTHER_DB}"')
        try:
            with pg_admin(OTHER_DB) as other:
                other.execute("CREATE TABLE lifecycle_item (id int)")
            dump, _ = backups._pg_tools()
            subprocess.run([dump, "--format=custom", f"--file={receipt.path}", OTHER_DB], check=True,
                           env=pg_cli_env(), capture_output=True)
        finally:
            with pg_admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{OTHER_DB}"')
        foreign = receipt.path.read_bytes()
        write_receipt(receipt, sha256=hashlib.sha256(foreign).hexdigest(), size=len(foreign))
        with pytest.raises(BackupError) as caught:
            verify_backup(receipt.name)
        assert caught.value.code == "wrong_database"
        assert OTHER_DB in caught.value.message


def test_it_cancels_mid_way_and_keeps_nothing(folder, monkeypatch):
    fill(messages=300, size=4000)
    monkeypatch.setattr(backups, "SQLITE_STEP_PAGES", 16)
    progress = []
    checks = []

    def should_cancel():
        checks.append(1)
        # Start, then cancel while the copy or dump is under way.
        return len(checks) >= 3

    with pytest.raises(BackupError) as caught:
        create_backup(should_cancel=should_cancel, progress=lambda done, total: progress.append((done, total)))
    assert caught.value.code == "cancelled"
    if connection.vendor == "sqlite":
        assert progress and progress[-1][0] < progress[-1][1], "cancelled before the copy finished"
    else:
        # pg_dump was killed: its session ends.
        deadline = time.monotonic() + 10
        while True:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump'")
                if cursor.fetchone()[0] == 0:
                    break
            assert time.monotonic() < deadline, "pg_dump still connected after cancel"
            time.sleep(0.1)
    assert files_in(folder) == []
    assert list_backups() == []


KILLED_RUN = """
import os, signal, sys
import django
django.setup()
from django.conf import settings
settings.LETHE_BACKUP_DIR = sys.argv[1]
from retention import backups
backups.SQLITE_STEP_PAGES = 16
calls = []
def should_cancel():
    calls.append(1)
    if len(calls) >= 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return False
backups.create_backup(should_cancel=should_cancel)
"""


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def test_it_cleans_up_after_a_killed_run_and_never_lists_it(folder):
    fill(messages=300, size=4000)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "DATABASE_URL": database_url()}
    run = subprocess.run([sys.executable, "-c", KILLED_RUN, str(folder)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = files_in(folder)
    # The partial copy (and on SQLite its journal) under temp names only.
    assert left and all(name.startswith(backups.TEMP_PREFIX) for name in left), left
    assert list_backups() == []

    receipt = create_backup()
    assert files_in(folder) == [receipt.name, receipt.name + ".json"]
    assert list_backups() == [receipt]
    assert verify_backup(receipt.name) == receipt


def test_it_lists_only_backups_with_a_valid_receipt_newest_first(folder):
    fill(messages=3)
    first = create_backup()
    time.sleep(1.1)
    second = create_backup()
    assert list_backups() == [second, first]
    ext = backups.EXTENSIONS[connection.vendor]
    vendor = connection.vendor
    (folder / f"lethe-{vendor}-20260101T000000Z-abcdef{ext}").write_bytes(b"no receipt")
    (folder / f"lethe-{vendor}-20260102T000000Z-abcdef{ext}").write_bytes(b"bad receipt")
    (folder / f"lethe-{vendor}-20260102T000000Z-abcdef{ext}.json").write_text("{not json")
    (folder / f".tmp-lethe-{vendor}-20260103T000000Z-abcdef{ext}").write_bytes(b"partial")
    (folder / "notes.txt").write_text("the operator's own file")
    assert list_backups() == [second, first]
    with pytest.raises(BackupError) as caught:
        verify_backup(f"lethe-{vendor}-20260101T000000Z-abcdef{ext}")
    assert caught.value.code == "not_found"
    for name in ("../etc/passwd", "notes.txt", ""):
        with pytest.raises(BackupError) as caught:
            verify_backup(name)
        assert caught.value.code == "not_found"

    third = create_backup()
    # The next run removed the leftovers of killed runs, and nothing else.
    assert files_in(folder) == sorted([r.name for r in (first, second, third)]
                                      + [r.name + ".json" for r in (first, second, third)]
                                      + [f"lethe-{vendor}-20260102T000000Z-abcdef{ext}",
                                         f"lethe-{vendor}-20260102T000000Z-abcdef{ext}.json", "notes.txt"])
    assert list_backups() == [third, second, first]


def test_it_refuses_to_start_inside_a_transaction(folder):
    with transaction.atomic(), pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "in_transaction"
    assert not folder.exists() or files_in(folder) == []


def test_it_names_the_missing_dump_tool(folder, settings, tmp_path, monkeypatch):
    fill(messages=3)
    empty = tmp_path / "no-tools"
    empty.mkdir()
    settings.LETHE_PG_BIN_DIR = empty
    if connection.vendor == "sqlite":
        # SQLite backups need no client tools.
        assert verify_backup(create_backup().name)
        return
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "tool_missing"
    assert "pg_dump" in caught.value.message and str(empty) in caught.value.message
    assert files_in(folder) == []

    settings.LETHE_PG_BIN_DIR = None
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(backups, "PG_BIN_GLOB", str(tmp_path / "nowhere" / "*" / "bin"))
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "tool_missing"
    assert "LETHE_PG_BIN_DIR" in caught.value.message
    assert files_in(folder) == []


def test_it_explains_how_to_restore_in_both_languages():
    for vendor in ("sqlite", "postgresql"):
        english = restore_instructions(vendor)
        assert "replaces the whole database" in english
        with translation.override("es"):
            spanish = restore_instructions(vendor)
        assert spanish != english and "base de datos" in spanish
    assert "pg_restore" in restore_instructions("postgresql")
    assert "-wal" in restore_instructions("sqlite")
