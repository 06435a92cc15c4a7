"""Backups on the configured engine: real copies in a temporary folder, restored and counted."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
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
from tests.test_jobs import database_url

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


def dump_other_database(path: Path) -> None:
    """PostgreSQL: an archive at `path` of another database (OTHER_DB, one small table), made
    as a backup is, the database dropped after."""
    with pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{OTHER_DB}"')
        admin.execute(f'CREATE DATABASE "{OTHER_DB}"')
    try:
        with pg_admin(OTHER_DB) as other:
            other.execute("CREATE TABLE lifecycle_item (id int)")
            other.execute("INSERT INTO lifecycle_item VALUES (1)")
        dump, _ = backups._pg_tools()
        subprocess.run([dump, "--format=custom", f"--file={path}", OTHER_DB], check=True,
                       env=pg_cli_env(), capture_output=True)
    finally:
        with pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{OTHER_DB}"')


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


def damage_where_checks_reach(receipt) -> bytes:
    """Flip bytes where the engine's own check must notice: SQLite verifies structure, not
    content, so the header of the item table's root page; a PostgreSQL archive starts with
    its table of contents (plain text to pg_restore), so inside the compressed item data."""
    data = bytearray(receipt.path.read_bytes())
    if receipt.vendor == "sqlite":
        db = sqlite3.connect(f"file:{receipt.path}?mode=ro", uri=True)
        try:
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'lifecycle_item'").fetchone()[0]
        finally:
            db.close()
        at = (root - 1) * page_size
        data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
    else:
        assert len(data) > 1_000_000, "item data is most of the archive"
        at = len(data) * 3 // 4
        data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
    receipt.path.write_bytes(bytes(data))
    return bytes(data)


def test_it_detects_a_corrupted_backup(folder):
    conversation = factories.make_conversation(title="Random")
    Item.objects.bulk_create(
        Item(conversation=conversation, seq=seq, role="assistant", content=secrets.token_hex(2000))
        for seq in range(1, 601)
    )
    receipt = create_backup()
    damaged = damage_where_checks_reach(receipt)
    with pytest.raises(BackupError) as caught:
        verify_backup(receipt.name)
    assert caught.value.code == "checksum_mismatch"
    # Damage before the receipt was written (what create checks): the hash matches, the
    # content does not read back.
    write_receipt(receipt, sha256=hashlib.sha256(damaged).hexdigest())
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
        dump_other_database(receipt.path)
        foreign = receipt.path.read_bytes()
        write_receipt(receipt, sha256=hashlib.sha256(foreign).hexdigest(), size=len(foreign))
        with pytest.raises(BackupError) as caught:
            verify_backup(receipt.name)
        assert caught.value.code == "wrong_database"
        assert OTHER_DB in caught.value.message

        # An archive of our database without the data of one table is not a backup.
        partial = folder / "partial.dump"
        dump, _ = backups._pg_tools()
        subprocess.run([dump, "--format=custom", f"--file={partial}", "--exclude-table-data=lifecycle_item",
                        connection.settings_dict["NAME"]], check=True, env=pg_cli_env(), capture_output=True)
        with pytest.raises(BackupError) as caught:
            backups._check_postgresql(partial, connection.settings_dict["NAME"], lambda: False)
        assert caught.value.code == "verify_failed"
        assert "lifecycle_item" in caught.value.message


def wait_until_pg_dump_gone() -> None:
    """pg_dump was killed: its session ends."""
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump'")
            if cursor.fetchone()[0] == 0:
                return
        assert time.monotonic() < deadline, "pg_dump still connected"
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
def test_a_dump_whose_session_is_ended_says_the_database_could_not_be_reached(folder):
    """pg_dump's session ends mid-dump (a server restart, a failover, an ended session): the
    backup keeps nothing and says so in the reader's words, not pg_dump's English (r97)."""
    if connection.vendor != "postgresql":
        pytest.skip("pg_dump's session; SQLite copies in this process")
    import threading

    from django.db import connections

    fill(messages=5)
    holder = connections.create_connection("default")
    outcome = []
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("LOCK TABLE lifecycle_item IN ACCESS EXCLUSIVE MODE")  # pg_dump waits for it

            def backup():
                try:
                    create_backup()
                except BackupError as exc:
                    outcome.append(exc)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=backup)
            thread.start()
            deadline = time.monotonic() + 30
            ended = 0
            while not ended and time.monotonic() < deadline:
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # read afresh inside this transaction
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                               "'pg_dump' AND wait_event_type = 'Lock'")
                ended = len(cursor.fetchall())
                time.sleep(0.05)
            cursor.execute("ROLLBACK")
            thread.join(60)
    finally:
        holder.close()
    assert ended == 1
    [caught] = outcome
    assert caught.code == "database_unavailable"
    assert caught.text.msgid.startswith("The database could not be reached during the backup")
    assert files_in(folder) == [] and list_backups() == []


@pytest.mark.parametrize("stop", ["cancelled", "no_space"])
def test_it_stops_mid_way_and_keeps_nothing(folder, settings, monkeypatch, stop):
    """Cancelled, or the disk fills up (something else wrote), while the copy or dump is
    under way: nothing is kept."""
    fill(messages=300, size=4000)
    monkeypatch.setattr(backups, "SQLITE_STEP_PAGES", 16)
    progress = []
    checks = []

    def should_cancel():
        checks.append(1)
        if stop == "no_space" and len(checks) == 2:
            settings.DISK_RESERVE_BYTES = 2**62
        return stop == "cancelled" and len(checks) >= 3

    with pytest.raises(BackupError) as caught:
        create_backup(should_cancel=should_cancel, progress=lambda done, total: progress.append((done, total)))
    assert caught.value.code == stop
    if connection.vendor == "sqlite":
        assert progress and progress[-1][0] < progress[-1][1], "stopped before the copy finished"
    else:
        wait_until_pg_dump_gone()
    assert files_in(folder) == []
    assert list_backups() == []


def test_it_does_not_start_without_room_for_the_copy_and_keeps_nothing(folder, settings):
    """The backup folder's disk often holds the database too: a backup never takes it below
    DISK_RESERVE_BYTES free (a database that cannot write its log stops)."""
    fill(messages=50)
    settings.DISK_RESERVE_BYTES = 2**62  # more than any disk here holds
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "no_space"
    assert "not enough free disk space for the backup" in caught.value.message
    assert "Nothing was kept." in caught.value.message and str(folder) in caught.value.message
    # The copy's size is said as what it is, not as what is missing (r93)
    assert "still to write" in caught.value.message and "more needed" not in caught.value.message
    assert files_in(folder) == [] and list_backups() == []
    settings.DISK_RESERVE_BYTES = 0
    assert create_backup().size > 0


@pytest.fixture
def small_disk(folder, monkeypatch):
    """The backup folder on a disk of its own (the reviewer's idea): `small_disk(capacity)`
    makes its free space `capacity` less what the folder's files hold, as a real disk would
    show it while a copy grows there."""
    import shutil

    real = shutil.disk_usage

    def disk_usage(path):
        if Path(path).resolve().is_relative_to(folder):
            used = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
            return real(path)._replace(free=max(0, capacity[0] - used))
        return real(path)

    capacity = [0]
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    return lambda size: capacity.__setitem__(0, size)


def test_a_dump_written_whole_between_two_checks_is_not_published_below_the_reserve(folder, settings, small_disk,
                                                                                    monkeypatch):
    """r7-5a: pg_dump's room is checked while it runs (every POLL_SECONDS); a small database is
    dumped whole between two checks, and the disk was then below the reserve. Checked once more
    once it has exited: nothing kept, no_space with the disk's figures without the copy."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite checks the pages left to copy before it starts and at every step")
    fill(messages=200, size=2000)
    folder.mkdir(mode=0o700)
    small_disk(10_000_000)
    settings.DISK_RESERVE_BYTES = 10_000_000 - 4096  # 4 KB to spare above it: the archive is larger
    real_run = backups._run
    # pg_dump exits before its first check (no check at all while it runs)
    monkeypatch.setattr(backups, "_run", lambda args, env, should_cancel, on_tick=None: real_run(
        args, env, should_cancel))
    verified = []
    monkeypatch.setattr(backups, "_check_postgresql", lambda *args, **kwargs: verified.append(1))
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "no_space"
    assert caught.value.text.msgid.startswith("There is not enough free disk space for the backup in")
    params = caught.value.text.params
    # (less the note of whose backup is being made, written beside it before the copy)
    owner = len(json.dumps({"name": "lethe-postgresql-20261205T000000Z-000000.dump", "database_key": "0" * 32}))
    assert params["free"].bytes == 10_000_000 - owner and params["reserve"].bytes == 10_000_000 - 4096
    assert params["needed"].bytes > 4096
    assert verified == [], "refused once pg_dump exited, before the archive is read back"
    assert files_in(folder) == [] and list_backups() == []


def test_a_disk_that_fills_up_while_the_copy_is_verified_keeps_nothing(folder, settings, monkeypatch):
    """r7-5a: something else fills the disk while the copy is read back (a whole database can
    take a while): checked again before it is published, the copy is discarded."""
    fill(messages=50)
    name = "_check_sqlite" if connection.vendor == "sqlite" else "_check_postgresql"
    check = getattr(backups, name)

    def check_then_fill(*args, **kwargs):
        check(*args, **kwargs)
        settings.DISK_RESERVE_BYTES = 2**62  # more than any disk here holds

    monkeypatch.setattr(backups, name, check_then_fill)
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "no_space"
    assert "Nothing was kept." in caught.value.message
    assert files_in(folder) == [] and list_backups() == []


def sqlite_copy_fails_on_a_full_disk(monkeypatch) -> None:
    """What a real full disk did to a SQLite copy (reviewer r7, a tmpfs with a few KB to spare
    and a reserve of 0): the pages fit, then `PRAGMA journal_mode=DELETE` opens the copy's WAL
    and fails with SQLITE_IOERR_SHMSIZE, "disk I/O error"; closing the copy could not fold
    its WAL back either, so its empty -wal and its -shm stayed beside it."""

    class FullDiskConnection(sqlite3.Connection):
        failed = False

        def execute(self, sql, *args):
            if sql.startswith("PRAGMA journal_mode"):
                self.failed = True
                error = sqlite3.OperationalError("disk I/O error")
                error.sqlite_errorcode, error.sqlite_errorname = 4874, "SQLITE_IOERR_SHMSIZE"
                raise error
            return super().execute(sql, *args)

        def close(self):
            name = self.execute("PRAGMA database_list").fetchone()[2]
            super().close()
            if self.failed:  # as the tmpfs left them
                Path(name + "-wal").write_bytes(b"")
                Path(name + "-shm").write_bytes(b"\0" * 4096)

    connect = sqlite3.connect

    def copy_on_a_full_disk(database, *args, **kwargs):
        if Path(str(database)).name.startswith(backups.TEMP_PREFIX):
            kwargs["factory"] = FullDiskConnection
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(backups.sqlite3, "connect", copy_on_a_full_disk)


def pg_dump_fails(settings, tmp_path, error: str) -> None:
    """pg_dump writes part of the archive, then fails with `error` on its stderr."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("pg_dump", "pg_restore"):
        script = tools / tool
        script.write_text(
            "#!/bin/sh\n"
            f'if [ "$1" = --version ]; then echo "{tool} (PostgreSQL) {connection.pg_version // 10000}"; exit 0; fi\n'
            'for a in "$@"; do case "$a" in --file=*) head -c 65536 /dev/zero > "${a#--file=}";; esac; done\n'
            f"echo '{error}' >&2\nexit 1\n")
        script.chmod(0o755)
    settings.LETHE_PG_BIN_DIR = tools


def sqlite_database_bytes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        return pages * cursor.fetchone()[0]


@pytest.mark.parametrize("disk", ["full", "roomy"])
def test_a_sqlite_copy_that_fails_leaves_no_side_files_and_a_full_disk_says_no_space(folder, settings, small_disk,
                                                                                     monkeypatch, disk):
    """r7-5b: the copy's -wal and -shm files went only after a copy that worked, so a failed one
    left them until the next backup; and a full backup disk read "The database could not be
    copied: disk I/O error", as if the database were failing."""
    if connection.vendor != "sqlite":
        pytest.skip("pg_dump's failures: test_a_dump_that_fills_its_disk_says_no_space_in_the_readers_words")
    fill(messages=50)
    folder.mkdir(mode=0o700)
    settings.DISK_RESERVE_BYTES = 0
    small_disk(sqlite_database_bytes() + 8192 if disk == "full" else 2**40)
    sqlite_copy_fails_on_a_full_disk(monkeypatch)
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert files_in(folder) == [] and list_backups() == []
    if disk == "full":
        assert caught.value.code == "no_space"
        assert caught.value.message == (
            f"The disk that holds {folder} filled up while the backup was being written. Nothing was kept. Free "
            "some space, or set LETHE_BACKUP_DIR to a folder on another disk.")
    else:  # room enough: an I/O error is the database's or the disk's, not a lack of room
        assert caught.value.code == "copy_failed"


@pytest.mark.parametrize(("error", "disk", "code"), [
    ("pg_dump: error: could not write to output file: No space left on device", "roomy", "no_space"),
    # the system's words in the server's language: the disk, measured before the archive goes, tells
    ("pg_dump: error: no se pudo escribir al archivo de salida: No queda espacio en el dispositivo", "full",
     "no_space"),
    ("pg_dump: error: connection to server failed", "roomy", "dump_failed"),
])
def test_a_dump_that_fills_its_disk_says_no_space_in_the_readers_words(folder, settings, tmp_path, small_disk,
                                                                        error, disk, code):
    """r7-6: with a reserve of 0, a dump that filled the disk failed with pg_dump's English text
    ("pg_dump failed: ... No space left on device"), in any reader's language."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite: test_a_sqlite_copy_that_fails_leaves_no_side_files_and_a_full_disk_says_no_space")
    fill(messages=5)
    folder.mkdir(mode=0o700)
    settings.DISK_RESERVE_BYTES = 0
    small_disk(65536 + 1000 if disk == "full" else 2**40)
    pg_dump_fails(settings, tmp_path, error)
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == code
    assert files_in(folder) == [] and list_backups() == []
    if code == "no_space":
        assert caught.value.text.msgid == backups.FILLED_UP and "pg_dump" not in caught.value.message
        with translation.override("es"):
            assert caught.value.message.startswith(f"El disco que contiene {folder} se llenó")


def test_a_backup_job_on_a_full_disk_stores_no_space_and_keeps_nothing(admin_user, folder, settings, tmp_path,
                                                                      small_disk, monkeypatch):
    """The preparation's backup job on a full backup disk (a reserve of 0): the operation and
    the preparation store no_space, said in the reader's language, and the folder holds nothing
    of the copy."""
    from retention import service
    from retention.errors import said
    from retention.models import ToolPayloadOperation, ToolPayloadPolicy
    from tests.test_tool_payload_jobs import enable, run

    fill(messages=20)
    folder.mkdir(mode=0o700)
    settings.DISK_RESERVE_BYTES = 0
    if connection.vendor == "sqlite":
        small_disk(sqlite_database_bytes() + 8192)
        sqlite_copy_fails_on_a_full_disk(monkeypatch)
    else:
        small_disk(2**40)
        pg_dump_fails(settings, tmp_path, "pg_dump: error: could not write to output file: No space left on device")
    enable(admin_user, choice="create")
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (op.kind, op.state, op.error_code) == ("backup", "failed", "no_space")
    assert json.loads(op.error_message)["msgid"] == backups.FILLED_UP
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and policy.preparation_error == op.error_message
    with translation.override("es"):
        assert said(op.error_message) == (
            f"El disco que contiene {folder} se llenó mientras se escribía la copia de seguridad. No se conservó "
            "nada. Libere espacio o defina LETHE_BACKUP_DIR con una carpeta en otro disco.")
    assert files_in(folder) == [] and list_backups() == []
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()


def test_a_folder_that_cannot_be_created_fails_with_io_error_naming_it_and_lists_no_backups(settings, tmp_path):
    """Its parent is a file: NotADirectoryError for every user (chmod stops nobody running as
    root). Creating the folder is part of the backup: the same io_error as a failed write."""
    (tmp_path / "afile").write_text("not a folder")
    folder = tmp_path / "afile" / "backups"
    settings.LETHE_BACKUP_DIR = folder
    fill(messages=5)
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "io_error"
    assert caught.value.message == (
        f"The backup could not be written in {folder}: a part of that path is not a folder. Nothing was kept. "
        "Check that Lethe can create that folder and write in it, or set LETHE_BACKUP_DIR to another folder.")
    assert list_backups() == []  # read by the status every second: no backups, no error
    with pytest.raises(BackupError) as caught:
        verify_backup("lethe-sqlite-20260101T000000Z-abcdef.sqlite3")
    assert caught.value.code == "not_found"
    from lifecycle.deletion.physical import backups_before

    assert backups_before(datetime.now(UTC)) == []  # deletion receipts: nothing held there


def test_a_folder_it_cannot_write_in_fails_with_io_error_naming_it(folder, monkeypatch):
    folder.mkdir(mode=0o700)
    real_open = os.open

    def refused(path, *args, **kwargs):
        if Path(path).parent == folder:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(backups.os, "open", refused)
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "io_error"
    assert caught.value.message.startswith(f"The backup could not be written in {folder}: permission denied.")


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
    if connection.vendor == "postgresql":
        # The tool dies with the job process instead of writing on as an orphan.
        wait_until_pg_dump_gone()

    receipt = create_backup()
    assert files_in(folder) == [receipt.name, receipt.name + ".json"]
    assert list_backups() == [receipt]
    assert verify_backup(receipt.name) == receipt


def test_it_lists_only_backups_with_a_valid_receipt_newest_first(folder):
    fill(messages=3)
    first = create_backup()
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


def test_it_makes_one_backup_at_a_time(folder):
    fill(messages=3)
    directory = backups.backup_dir()
    fd = os.open(directory / backups.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    (directory / ".tmp-lethe-sqlite-20260103T000000Z-abcdef.sqlite3").write_bytes(b"a live run's copy")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BackupError) as caught:
            create_backup()
        assert caught.value.code == "busy"
        # The other run's temp file is left alone while it holds the lock.
        assert files_in(folder) == [".tmp-lethe-sqlite-20260103T000000Z-abcdef.sqlite3"]
    finally:
        os.close(fd)
    receipt = create_backup()
    assert files_in(folder) == [receipt.name, receipt.name + ".json"]


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


def test_it_refuses_dump_tools_older_than_the_server(folder, settings, tmp_path):
    fill(messages=3)
    old_tools = tmp_path / "old-tools"
    old_tools.mkdir()
    for tool in ("pg_dump", "pg_restore"):
        script = old_tools / tool
        script.write_text(f"#!/bin/sh\necho '{tool} (PostgreSQL) 9.6.24'\n")
        script.chmod(0o755)
    settings.LETHE_PG_BIN_DIR = old_tools
    if connection.vendor == "sqlite":
        assert verify_backup(create_backup().name)
        return
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "tool_too_old"
    assert f"version {connection.pg_version // 10000}" in caught.value.message and "9" in caught.value.message
    assert files_in(folder) == []


def test_it_explains_how_to_restore_in_both_languages():
    for vendor in ("sqlite", "postgresql"):
        english = restore_instructions(vendor)
        assert "replaces the whole database" in english
        with translation.override("es"):
            spanish = restore_instructions(vendor)
        assert spanish != english and "base de datos" in spanish
    assert "pg_restore" in restore_instructions("postgresql")
    # r30: a restore into a new database is a copy, which must take the engine folder over
    assert "manage.py engine_folder --adopt --take-from-other-database" in restore_instructions("postgresql")
    assert "engine_folder" not in restore_instructions("sqlite")  # restored at its own path: nothing to do
    assert "-wal" in restore_instructions("sqlite")
    for vendor in ("sqlite", "postgresql"):  # r50: what comes back besides conversations, and what to remove
        said = restore_instructions(vendor)
        assert "API tokens revoked, users deactivated and passwords changed since" in said
        assert "The database you set aside still holds every conversation as it was" in said


def test_a_backup_changed_after_it_was_made_is_listed_as_changed(folder):
    fill(messages=3)
    grown, touched, kept = create_backup(), create_backup(), create_backup()
    assert not any(r.changed for r in list_backups())
    assert all(r.mtime_ns == r.path.stat().st_mtime_ns for r in (grown, touched, kept))
    with open(grown.path, "ab") as handle:  # one byte more
        handle.write(b"X")
    data = touched.path.read_bytes()  # the same size, other bytes, written later
    touched.path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    os.utime(touched.path, ns=(touched.mtime_ns + 10**9, touched.mtime_ns + 10**9))
    listed = {r.name: r.changed for r in list_backups()}
    assert listed == {grown.name: True, touched.name: True, kept.name: False}
    for receipt in (grown, touched):
        with pytest.raises(BackupError) as caught:
            verify_backup(receipt.name)
        assert caught.value.code in ("checksum_mismatch", "size_mismatch")
    # A receipt from before modification times were recorded: the size still tells.
    old = json.loads(Path(str(kept.path) + ".json").read_text())
    old.pop("mtime_ns")
    Path(str(kept.path) + ".json").write_text(json.dumps(old))
    assert {r.name: r.changed for r in list_backups()}[kept.name] is False


def test_a_folder_that_exists_keeps_its_mode_and_the_files_are_owner_only(folder):
    """The operator's folder (shared with a group, or with the sticky bit) is theirs: reading
    the status or making a backup changes no mode of it."""
    folder.mkdir()
    folder.chmod(0o1770)
    fill(messages=3)
    assert list_backups() == []
    receipt = create_backup()
    assert list_backups() == [receipt]
    assert folder.stat().st_mode & 0o7777 == 0o1770
    assert receipt.path.stat().st_mode & 0o777 == 0o600
    assert (folder / (receipt.name + ".json")).stat().st_mode & 0o777 == 0o600


def test_the_status_lists_the_newest_backups_and_counts_the_older_ones(folder, admin_client, api, monkeypatch):
    from retention import service

    monkeypatch.setattr(service, "BACKUPS_SHOWN", 2)
    fill(messages=3)
    made = [create_backup() for _ in range(3)]
    doc = service.status_document(with_database=False)
    assert [b["name"] for b in doc["backups"]] == [made[2].name, made[1].name] and doc["older_backups"] == 1
    page = admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").content.decode()
    assert made[0].name not in page and made[2].name in page
    assert f"1 older backup is not listed here; it is in the backup folder, {folder}." in page
    answer = api.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()
    assert len(answer["backups"]) == 2 and answer["older_backups"] == 1


def postgresql_without_tls() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("PostgreSQL's connection parameters (SQLite takes none)")
    with connection.cursor() as cursor:
        cursor.execute("SHOW ssl")
        if cursor.fetchone()[0] != "off":
            pytest.skip("the server here speaks TLS")


@pytest.mark.parametrize(("options", "said"), [
    ({"sslmode": "require"}, "server does not support SSL, but SSL was required"),
    ({"target_session_attrs": "standby"}, "server is not in hot standby mode"),
])
def test_pg_dump_connects_with_the_parameters_of_database_url(folder, monkeypatch, options, said):
    """r12: DATABASE_URL's parameters (`?sslmode=require`) were dropped, the driver's and pg_dump's
    alike; now pg_dump gets them too (in its environment), so it refuses what the driver would."""
    postgresql_without_tls()
    fill(messages=3)
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {**connection.settings_dict["OPTIONS"], **options})
    with pytest.raises(BackupError) as caught:
        create_backup()
    assert caught.value.code == "dump_failed" and said in caught.value.message
    assert files_in(folder) == [] and list_backups() == []


def test_pg_dump_connects_under_the_application_name_of_database_url(folder, monkeypatch):
    """pg_dump's session is named as DATABASE_URL says (seen in pg_stat_activity while it waits for
    a lock another session holds), and the password is never on its command line."""
    postgresql_without_tls()
    fill(messages=3)
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"application_name": "lethe-backup-probe",
                                                              "sslmode": "disable", "connect_timeout": 5})
    args, env = backups._connection_args("pg_dump", ["--no-password"])
    assert env["PGAPPNAME"] == "lethe-backup-probe" and env["PGSSLMODE"] == "disable"
    assert env["PGCONNECT_TIMEOUT"] == "5"
    assert not connection.settings_dict["PASSWORD"] or connection.settings_dict["PASSWORD"] not in " ".join(args)
    seen = []
    with pg_admin(connection.settings_dict["NAME"]) as holder, pg_admin() as watcher, holder.transaction():
        holder.execute("LOCK TABLE lifecycle_item IN ACCESS EXCLUSIVE MODE")  # pg_dump waits for it

        def should_cancel() -> bool:
            seen.extend(watcher.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = %s AND application_name "
                "IN ('pg_dump', 'lethe-backup-probe')", [connection.settings_dict["NAME"]]).fetchall())
            return bool(seen)

        with pytest.raises(BackupError) as caught:
            create_backup(should_cancel=should_cancel)
    assert caught.value.code == "cancelled"
    assert seen == [("lethe-backup-probe",)]
    assert files_in(folder) == []


def test_only_this_databases_backups_are_listed_and_named_as_holders_of_its_deletes(folder):
    """r26: two installations sharing one backup folder (the same var/, or one LETHE_BACKUP_DIR)
    each listed the other's backups with their restore steps, and named them on delete receipts
    as holding content they never held. Only this database's are its own: by the key on the
    receipt (where the database is), or, for a receipt from before the key, by its engine and
    database name."""
    from dataclasses import replace

    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor
    from retention import service

    conversation = fill(5)
    ours = create_backup()
    extension = backups.EXTENSIONS[connection.vendor]

    def planted(hexpart: str, **fields) -> str:
        name = f"lethe-{connection.vendor}-20261201T000000Z-{hexpart}{extension}"
        (folder / name).write_bytes(ours.path.read_bytes())
        receipt = replace(ours, name=name, path=folder / name, mtime_ns=(folder / name).stat().st_mtime_ns, **fields)
        backups._write_receipt(receipt)
        return name

    other = planted("0000aa", database_key="f" * 32)  # another installation's
    older_other = planted("0000bb", database_key=None, database="another.sqlite3")  # from before the key
    older_ours = planted("0000cc", database_key=None)  # this database's, from before the key
    assert [r.name for r in list_backups()] == [ours.name, older_ours]
    assert backups.foreign_backups() == {other, older_other}
    assert [b["name"] for b in service.status_document()["backups"]] == [ours.name, older_ours]

    # Backups being made meanwhile (r28): another database's (its key written beside its copy
    # when it started), one of another engine, and this database's own
    other_vendor = "postgresql" if connection.vendor == "sqlite" else "sqlite"
    making = {hexpart: f"lethe-{vendor}-20261202T000000Z-{hexpart}{backups.EXTENSIONS[vendor]}"
              for hexpart, vendor in (("0000dd", connection.vendor), ("0000ee", other_vendor),
                                      ("0000ff", connection.vendor))}
    for name in making.values():
        (folder / (backups.TEMP_PREFIX + name)).write_bytes(b"part of a copy")
    (folder / (backups.TEMP_PREFIX + making["0000dd"] + ".json")).write_text(json.dumps({"database_key": "e" * 32}))
    backups._write_owner(folder, making["0000ff"])
    # Sidecars anyone who can write in the folder may put there (r29: a size of Infinity, or deep
    # nesting, raised out of every listing and stopped every delete): not receipts, never errors
    deep = "[" * 200_000 + "]" * 200_000
    for hexpart, text, temp in (("0000a1", '{"size": Infinity, "name": "x"}', ""), ("0000a2", deep, ""),
                                ("0000a3", deep, backups.TEMP_PREFIX)):
        name = f"lethe-{connection.vendor}-20261203T000000Z-{hexpart}{extension}"
        (folder / (temp + name)).write_bytes(b"a file of the folder")
        (folder / (temp + name + ".json")).write_text(text)
    assert [r.name for r in list_backups()] == [ours.name, older_ours]

    op = request_deletion(conversation, key="shared-folder", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    named = sorted(h["name"] for h in op.receipt["holders"] if h.get("kind") == "backup")
    # (those with broken sidecars, and those sidecars, are files of the folder that may hold it:
    # named, as any file there is)
    broken = [f"lethe-{connection.vendor}-20261203T000000Z-{h}{extension}" for h in ("0000a1", "0000a2", "0000a3")]
    assert named == sorted([ours.name, older_ours, making["0000ff"], *broken, broken[0] + ".json",
                            broken[1] + ".json"])
    # The key is where the database is: computed, never stored (a restore keeps it)
    assert ours.database_key == backups.database_key() and len(ours.database_key) == 32


def test_a_copy_of_the_database_counts_its_originals_backups_as_holding_its_content(folder):
    """r30: restored from its backup into another database (PostgreSQL's restore steps), the
    copy has another key, and neither listed the original's backups nor named them on its delete
    receipts, though every one of them holds what the copy held. The key of the database the
    copy came from is recorded with the engine folder's mark (which the copy carries), and kept
    once the copy takes the folder over."""
    from dataclasses import replace

    from lifecycle import engine_folder
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor
    from lifecycle.enginefs import EngineHome
    from lifecycle.models import EngineFolderMark

    conversation = fill(5)
    original = "a" * 32  # where the original is: the key its mark was recorded with
    earlier = "b" * 32  # the original's key in an earlier release (r32: PostgreSQL's host and port)
    made = create_backup()

    def planted(hexpart: str, key: str) -> str:
        name = f"lethe-{connection.vendor}-20261201T000000Z-{hexpart}{backups.EXTENSIONS[connection.vendor]}"
        (folder / name).write_bytes(made.path.read_bytes())
        backups._write_receipt(replace(made, name=name, path=folder / name,
                                       mtime_ns=(folder / name).stat().st_mtime_ns, database_key=key))
        return name

    names = {planted("0000ab", original), planted("0000bc", earlier)}
    assert backups.foreign_backups() == names  # this database's own key only
    # the row as the copy has it, from the original
    EngineFolderMark.objects.filter(pk=1).update(database_key=original, origin_keys=[earlier])
    assert engine_folder.is_copy() and engine_folder.problem() == "not_this_folder"
    assert {r.name for r in list_backups()} == {made.name, *names} and backups.foreign_backups() == set()
    engine_folder.adopt(EngineHome(), force=True, take_from_other=True)  # the copy takes the folder over
    assert not engine_folder.is_copy() and engine_folder.problem() is None
    assert {original, earlier} <= set(EngineFolderMark.objects.get().origin_keys)
    assert {r.name for r in list_backups()} == {made.name, *names}
    op = request_deletion(conversation, key="copy", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert sorted(h["name"] for h in op.receipt["holders"] if h.get("kind") == "backup") == sorted([made.name, *names])


def test_a_copy_verifies_its_originals_backups_and_refuses_another_databases(folder):
    """A PostgreSQL backup restored into a new database (the restore steps) has another database
    name: the copy listed its original's backups as its own, yet verify_backup refused them as
    another database's (it compared the receipt's database name with the configured one). The
    archive still names the database it was made from, and is checked against its receipt."""
    from dataclasses import replace

    from lifecycle.models import EngineFolderMark

    fill(5)
    made = create_backup()
    original_key, stranger_key = "c" * 32, "d" * 32
    if connection.vendor == "postgresql":  # a real archive of a database with another name
        dump_other_database(made.path)
        original_name = OTHER_DB
    else:
        original_name = "original.sqlite3"
    content = made.path.read_bytes()
    original = replace(made, database=original_name, database_key=original_key, sha256=hashlib.sha256(content).hexdigest(),
                       size=len(content), mtime_ns=made.path.stat().st_mtime_ns)
    backups._write_receipt(original)
    # Not (yet) a copy of that database: the backup is another database's, listed nowhere
    with pytest.raises(BackupError) as caught:
        verify_backup(made.name)
    assert caught.value.code == "wrong_database"
    assert made.name in backups.foreign_backups()
    # The copy: the engine folder's mark names the original's key
    EngineFolderMark.objects.filter(pk=1).update(database_key=original_key, origin_keys=[])
    assert made.name in {r.name for r in list_backups()}
    assert verify_backup(made.name).database == original_name
    # A receipt claiming the original's key over another database's archive is still refused
    if connection.vendor == "postgresql":
        backups._write_receipt(replace(original, database="someone_else"))
        with pytest.raises(BackupError) as caught:
            verify_backup(made.name)
        assert caught.value.code == "wrong_database" and OTHER_DB in caught.value.message
    # Another key than the original's: refused as before
    backups._write_receipt(replace(original, database_key=stranger_key))
    with pytest.raises(BackupError) as caught:
        verify_backup(made.name)
    assert caught.value.code == "wrong_database"


def test_a_delete_receipt_names_only_the_backups_made_after_its_conversation_was(folder):
    """r35: every backup made before a delete completed was named as still holding the deleted
    content, those made before the conversation existed too (they cannot hold it). A receipt
    says how far the database had given out conversation ids when the copy was made."""
    from dataclasses import replace

    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor

    older = fill(5)
    before = create_backup()
    assert before.conversations_up_to is not None and before.conversations_up_to >= older.pk
    newer = fill(5)
    assert newer.pk > before.conversations_up_to
    after = create_backup()
    assert after.conversations_up_to >= newer.pk
    # a receipt from before this change says nothing about ids: it is named for every delete
    name = f"lethe-{connection.vendor}-20261201T000000Z-0000cd{backups.EXTENSIONS[connection.vendor]}"
    (folder / name).write_bytes(before.path.read_bytes())
    backups._write_receipt(replace(before, name=name, path=folder / name, conversations_up_to=None,
                                   mtime_ns=(folder / name).stat().st_mtime_ns))

    def backups_named(conversation) -> list[dict]:
        op = request_deletion(conversation, key=f"ids-{conversation.pk}", acting_user=None)
        assert executor.run_erasure(op.pk) == "completed"
        op.refresh_from_db()
        return [h for h in op.receipt["holders"] if h.get("kind") == "backup"]

    def named(conversation) -> set[str]:
        return {h["name"] for h in backups_named(conversation)}

    assert named(newer) == {after.name, name}  # not the backup made before it existed
    assert named(older) == {before.name, after.name, name}

    # A receipt whose figure is not a whole number Lethe wrote says nothing: named for every delete
    newest = fill(5)
    assert newest.pk > after.conversations_up_to
    receipt_path = folder / (after.name + ".json")
    for broken in (True, 1.5, -1, "1", None, float("nan")):
        data = json.loads(receipt_path.read_text())
        receipt_path.write_text(json.dumps({**data, "conversations_up_to": broken}))
        assert backups._read_receipt(after.path).conversations_up_to is None
    assert after.name in {h["name"] for h in backups_named(newest)}


@pytest.mark.parametrize(("created_at", "zone"), [("0001-01-01T00:00:00+00:00", "Etc/GMT+12"),
                                                  ("9999-12-31T23:00:00+00:00", "Pacific/Kiritimati")])
def test_a_receipt_at_the_calendars_end_is_no_receipt_and_the_page_stands_in_every_zone(folder, admin_client,
                                                                                      created_at, zone):
    """The backup folder is the operator's: a receipt dated year 1 or 9999 failed Data & storage
    with a 500 in far time zones (r46). Such a receipt does not describe its backup."""
    fill(messages=3)
    receipt = create_backup()
    path = folder / (receipt.name + ".json")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "created_at": created_at}))
    assert [b.name for b in list_backups() if b.created_at is not None and b.sha256 == receipt.sha256] == []
    admin_client.cookies["lethe_timezone"] = zone
    assert admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").status_code == 200
