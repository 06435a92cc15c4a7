"""Compacting the configured engine after many rows are deleted: real files, real VACUUM."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from django.db import connection, transaction

from lifecycle.models import Item
from retention.compact import CompactError, compact_database
from retention.storage import database_size
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def fill(messages: int, size: int) -> None:
    conversation = factories.make_conversation(title="Compacted")
    factories.add_message(conversation, content="kept")
    Item.objects.bulk_create(
        (Item(conversation=conversation, seq=seq, role="assistant", content=secrets.token_hex(size // 2))
         for seq in range(2, messages + 1)),
        batch_size=500,
    )


def sqlite_bytes_on_disk() -> int:
    name = str(connection.settings_dict["NAME"])
    return sum(os.path.getsize(name + suffix) for suffix in ("", "-wal") if Path(name + suffix).exists())


def test_it_shrinks_the_database_after_many_rows_are_deleted():
    fill(messages=3000, size=3000)
    # Rows spread over the whole table go, as a cleanup of old conversations would leave it.
    Item.objects.filter(seq__gt=1).exclude(seq__gt=2900).delete()
    assert Item.objects.count() == 101

    result = compact_database()

    assert not connection.in_atomic_block
    assert result.seconds >= 0
    assert result.before_reusable_bytes > 3_000_000, "the deleted rows were counted as reusable"
    if connection.vendor == "sqlite":
        assert result.after_file_bytes < result.before_file_bytes - 3_000_000
        assert result.after_reusable_bytes == 0
        assert sqlite_bytes_on_disk() == result.after_file_bytes
        assert not Path(str(connection.settings_dict["NAME"]) + "-wal").exists() or \
            os.path.getsize(str(connection.settings_dict["NAME"]) + "-wal") == 0
    else:
        # Plain VACUUM turns dead rows into free space inside the files, which keep their size
        # unless the freed pages sit at their end. Reusable space counts dead rows and free
        # space alike, so it stays (or became file shrinkage); what changed is that no dead
        # row is left.
        shrunk = max(result.before_file_bytes - result.after_file_bytes, 0)
        assert result.after_reusable_bytes + shrunk >= 0.9 * result.before_reusable_bytes
        with connection.cursor() as cursor:
            cursor.execute("SELECT dead_tuple_count FROM pgstattuple('lifecycle_item')")
            assert cursor.fetchone()[0] == 0
    assert Item.objects.count() == 101
    now = database_size()
    assert (now.file_bytes, now.reusable_bytes) == (result.after_file_bytes, result.after_reusable_bytes)


def test_a_second_compact_finds_nothing_more_to_reclaim():
    fill(messages=500, size=2000)
    Item.objects.filter(seq__gt=100).delete()
    first = compact_database()
    second = compact_database()
    assert first.before_reusable_bytes > 0
    if connection.vendor == "sqlite":
        assert second.before_reusable_bytes == first.after_reusable_bytes
    else:  # the first's measurement, kept for the page (StorageSnapshot), is a row version of its own
        assert abs(second.before_reusable_bytes - first.after_reusable_bytes) < 8192
    if connection.vendor == "sqlite":
        assert second.after_file_bytes == first.after_file_bytes
    assert Item.objects.count() == 100


def test_it_refuses_inside_a_transaction_and_changes_nothing():
    fill(messages=200, size=2000)
    Item.objects.filter(seq__gt=10).delete()
    before = database_size()
    with transaction.atomic(), pytest.raises(CompactError) as caught:
        compact_database()
    assert caught.value.code == "in_transaction"
    assert caught.value.message
    after = database_size()
    assert after.reusable_bytes == before.reusable_bytes > 0
    assert Item.objects.count() == 10


def test_it_does_not_start_without_room_for_its_copies_and_changes_nothing(settings):
    """SQLite's VACUUM writes two copies of the pages in use (its temporary database and the
    WAL); without room for both and the reserve on the disk, it does not start. PostgreSQL's
    plain VACUUM writes no copy: the reserve is SQLite's."""
    fill(messages=300, size=2000)
    Item.objects.filter(seq__gt=10).delete()
    before = database_size()
    settings.DISK_RESERVE_BYTES = 2**62  # more than any disk here holds
    if connection.vendor != "sqlite":
        assert compact_database().after_reusable_bytes < before.reusable_bytes
        return
    with pytest.raises(CompactError) as caught:
        compact_database()
    assert caught.value.code == "no_space"
    assert "Compacting needs about" in caught.value.message and "Nothing was changed." in caught.value.message
    after = database_size()
    assert (after.file_bytes, after.reusable_bytes) == (before.file_bytes, before.reusable_bytes)
    assert after.reusable_bytes > 0 and Item.objects.count() == 10
    settings.DISK_RESERVE_BYTES = 0
    assert compact_database().after_reusable_bytes == 0


def test_a_refusal_shows_every_byte_when_the_rounded_figures_would_read_alike(settings, monkeypatch):
    """r7-6: "Compacting needs about 1.0 MB ... 1.0 MB is free" showed no shortfall; figures that
    round alike are given to the byte, in the reader's language."""
    import shutil

    from retention import compact
    from retention.storage import sqlite_pages

    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's plain VACUUM writes no copy: no room is checked")
    fill(messages=60, size=2000)
    monkeypatch.setattr(compact, "sqlite_temp_dir", lambda: None)  # one copy: the WAL beside the database
    with connection.cursor() as cursor:
        page_size, pages, free_pages = sqlite_pages(cursor)
    in_use = (pages - free_pages) * page_size  # whole KB: 10 bytes less shows as the same KB
    settings.DISK_RESERVE_BYTES = 0
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=in_use - 10))
    with pytest.raises(CompactError) as caught:
        compact_database()
    assert caught.value.code == "no_space"
    home = Path(str(connection.settings_dict["NAME"])).resolve().parent
    assert caught.value.message == (
        f"Compacting needs about {in_use:,}\xa0bytes of free space in {home} and 0\xa0bytes to spare; "
        f"{in_use - 10:,}\xa0bytes is free. Nothing was changed.")
    from django.utils import translation

    with translation.override("es"):
        assert f"hay {in_use - 10:,}\xa0bytes libres".replace(",", "\xa0") in caught.value.message
    settings.DISK_RESERVE_BYTES = 10 * 2**20  # the reserve shows the shortfall: rounded as usual
    with pytest.raises(CompactError) as caught:
        compact_database()
    assert "10.0\xa0MB to spare" in caught.value.message and "bytes" not in caught.value.message


def test_sqlite_puts_its_temporary_copy_where_the_check_looks(tmp_path, monkeypatch):
    """The folder the check measures is the one SQLite writes VACUUM's temporary database to:
    SQLITE_TMPDIR first (read by SQLite once per process, so only the rule is checked here),
    and no folder when the connection keeps temporary databases in memory."""
    from retention.compact import sqlite_temp_dir

    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's VACUUM writes no temporary copy")
    monkeypatch.setenv("SQLITE_TMPDIR", str(tmp_path))
    assert sqlite_temp_dir() == tmp_path
    monkeypatch.setenv("SQLITE_TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert sqlite_temp_dir() == tmp_path
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA temp_store = MEMORY")
        try:
            assert sqlite_temp_dir() is None
        finally:
            cursor.execute("PRAGMA temp_store = DEFAULT")


def test_a_reader_holding_the_checkpoint_back_never_holds_the_consoles_writes_for_long():
    """SQLite: after VACUUM the WAL holds the whole database, and a reader's old snapshot (an
    operator's shell, a long report) keeps the TRUNCATE checkpoint busy; while a try waits it
    keeps every writer out. Each try waits briefly and backs off, so a writer willing to wait
    2 s gets in while the checkpoint keeps trying (each try waited the connection's 20 s)."""
    import sqlite3
    import threading
    import time

    if connection.vendor != "sqlite":
        pytest.skip("a SQLite checkpoint")
    fill(messages=400, size=2000)
    path = str(connection.settings_dict["NAME"])
    reader = sqlite3.connect(path, timeout=1, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM lifecycle_item").fetchone()  # a snapshot, held
    writer = sqlite3.connect(path, timeout=2, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE beside (n INTEGER)")
    done = threading.Event()
    outcome: dict = {"written": 0, "refused": []}

    def write() -> None:
        while not done.is_set():
            try:
                writer.execute("BEGIN IMMEDIATE")
                writer.execute("INSERT INTO beside VALUES (1)")
                writer.execute("COMMIT")
                outcome["written"] += 1
            except sqlite3.OperationalError as exc:
                outcome["refused"].append(str(exc))
            time.sleep(0.1)

    def release() -> None:
        time.sleep(6)
        reader.rollback()
        reader.close()

    threads = [threading.Thread(target=write), threading.Thread(target=release)]
    for thread in threads:
        thread.start()
    try:
        compact_database()
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert outcome["refused"] == []
    assert writer.execute("SELECT count(*) FROM beside").fetchone()[0] == outcome["written"] > 0
    writer.close()


def test_a_compaction_longer_than_the_clusters_job_limit_finishes_on_a_real_cluster(engine_home):
    """r21: a backup or a Compact database runs in one piece, under the cluster's limit of 10
    minutes: past it the worker was stopped and the run taken over, again and again, so a
    database too large to copy within the limit could never be backed up. Such runs get their
    own limit (LETHE_TOOL_JOB_LONG_TIMEOUT_SECONDS). Here the cluster's limit is 2 s, and the
    compaction takes 9 s (a pause where it has measured the sizes before)."""
    import time

    from retention import jobs, service
    from retention.models import ToolPayloadOperation
    from tests.test_jobs import database_url, running_cluster

    fill(messages=200, size=2000)
    op_id = service.start_compact(user=factories.make_user("compacting", admin=True))
    assert jobs.one_piece(op_id)
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home), "LOG_FORMAT": "text",
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1", "LETHE_JOB_TIMEOUT_SECONDS": "2",
           "LETHE_TEST_PAUSE_AT": "tool-compact-measured=9"}
    with running_cluster(env):
        deadline = time.monotonic() + 90
        while (ToolPayloadOperation.objects.get(pk=op_id).state in ("queued", "running")
               and time.monotonic() < deadline):
            time.sleep(0.2)
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert (op.state, op.attempts, op.error_code) == ("succeeded", 0, "")
    assert op.before_bytes and op.after_bytes is not None
    assert (op.finished_at - op.started_at).total_seconds() >= 9
