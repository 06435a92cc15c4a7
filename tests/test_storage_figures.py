"""Reusable space counts what the database can really reuse (issue 10 part 3): large tool
output lives in PostgreSQL's TOAST tables, and space a VACUUM freed is still reusable."""

from __future__ import annotations

import base64
import os

import pytest
from django.db import connection

from lifecycle.models import Item, Role
from retention.storage import database_size, estimated_reusable, pgstattuple_installed
from tests import factories

MB = 1024 * 1024


def _store_then_drop_output(total_mb: int = 12) -> int:
    conversation = factories.make_conversation(title="Large outputs")
    # Random text compresses little, so the stored size stays near the raw size.
    outputs = [base64.b64encode(os.urandom(150 * 1024)).decode() for _ in range(total_mb * MB // (200 * 1024))]
    Item.objects.bulk_create(
        Item(conversation=conversation, seq=index + 1, role=Role.TOOL, tool_kind="shell",
             payload={"command": "cat big.log", "stdout": text})
        for index, text in enumerate(outputs)
    )
    # A row written after them keeps the freed pages in the middle of the files, where VACUUM
    # cannot hand them back to the file system by truncation (the case the review measured).
    keeper = factories.make_conversation(title="Kept")
    Item.objects.create(conversation=keeper, seq=1, role=Role.TOOL, tool_kind="shell",
                        payload={"stdout": base64.b64encode(os.urandom(64 * 1024)).decode()})
    dropped = sum(len(text) for text in outputs)
    Item.objects.filter(conversation=conversation).delete()
    return dropped


def _vacuum() -> None:
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")
        if connection.vendor == "sqlite":
            # On disk the rewritten file is in the -wal file until a checkpoint copies it back
            # and truncates it, as Compact database does (retention/compact.py)
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@pytest.mark.django_db(transaction=True)
def test_dropped_tool_output_is_reported_reusable_before_and_after_vacuum():
    dropped = _store_then_drop_output()
    assert dropped > 11 * MB
    before = database_size(measure=True)
    assert before.reusable_bytes >= 0.9 * dropped, (before, dropped)
    _vacuum()
    after = database_size(measure=True)
    if connection.vendor == "sqlite":
        # VACUUM rebuilt the file: the free pages went back to the file system.
        assert after.reusable_bytes < MB and after.file_bytes <= before.file_bytes - 0.9 * dropped
        assert before.reusable_is_estimate is False
    else:
        # VACUUM made the space reusable inside the files; it is still there to reuse.
        assert pgstattuple_installed(connection.cursor())
        assert after.reusable_bytes >= 0.9 * dropped and after.reusable_is_estimate is False


@pytest.mark.django_db(transaction=True)
def test_without_the_extension_the_estimate_still_counts_toast():
    if connection.vendor != "postgresql":
        pytest.skip("the statistics estimate exists on PostgreSQL only; SQLite's figure is exact")
    dropped = _store_then_drop_output()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    # A fresh transaction sees the flushed counters.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        assert estimated_reusable(cursor) >= 0.8 * dropped


@pytest.mark.django_db
def test_pages_and_status_reads_show_the_last_measurement_and_never_measure(admin_client, api, monkeypatch):
    from retention import storage
    from retention.api import BASE

    if connection.vendor != "postgresql" or not pgstattuple_installed(connection.cursor()):
        pytest.skip("only PostgreSQL measures reusable space from the pages")
    measured: list[int] = []
    measure = storage.measured_reusable
    monkeypatch.setattr(storage, "measured_reusable", lambda cursor: measured.append(1) or measure(cursor))
    page = "/settings/system/data-storage/"
    html = admin_client.get(page, HTTP_HOST="127.0.0.1").content.decode()
    assert "Reusable space (estimated)" in html and measured == []  # nothing measured yet: the estimate
    reusable = storage.measure_database()  # the job
    assert measured == [1] and reusable is not None
    assert admin_client.get(page, HTTP_HOST="127.0.0.1").status_code == 200
    assert admin_client.get(page + "status/", HTTP_HOST="127.0.0.1", HTTP_HX_REQUEST="true").status_code == 200
    answer = api.get(BASE, HTTP_HOST="127.0.0.1")
    assert answer.status_code == 200 and answer.json()["database"]["reusable_measured_at"] is not None
    assert measured == [1]  # the pages and status reads did not measure again
    html = admin_client.get(page, HTTP_HOST="127.0.0.1").content.decode()
    assert "Reusable space (estimated)" not in html and "(measured " in html
    size = database_size()
    assert (size.reusable_bytes, size.reusable_is_estimate) == (reusable, False)
    assert size.reusable_measured_at is not None


@pytest.mark.django_db
def test_a_kept_measurement_larger_than_the_database_is_never_shown(admin_client):
    """A measurement made before a rewrite Lethe did not see (VACUUM FULL run by hand) is larger
    than the database after it: the page and the API never show it beside the smaller size."""
    from django.utils import timezone

    from retention.models import StorageSnapshot

    if connection.vendor != "postgresql" or not pgstattuple_installed(connection.cursor()):
        pytest.skip("only PostgreSQL keeps a measurement of reusable space; SQLite reads its free pages live")
    total = database_size().file_bytes
    StorageSnapshot.objects.update_or_create(
        id=1, defaults={"reusable_bytes": 30 * total, "reusable_measured_at": timezone.now()})
    size = database_size()
    assert size.reusable_bytes <= size.file_bytes and size.reusable_is_estimate
    assert size.reusable_measured_at is None
    html = admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").content.decode()
    assert "Reusable space (estimated)" in html
    answer = admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()["database"]
    assert answer["reusable_bytes"] <= answer["file_bytes"] and answer["reusable_is_estimate"] is True
    # A figure within the database's size is the measurement, shown as measured.
    StorageSnapshot.objects.filter(id=1).update(reusable_bytes=total // 2)
    assert (database_size().reusable_bytes, database_size().reusable_is_estimate) == (total // 2, False)



@pytest.mark.django_db(transaction=True)
def test_sqlite_size_on_disk_is_the_files_not_pages_counted_twice():
    """r53: page_count counts the pages that are only in the -wal file yet, and the -wal's size
    was added on top: 21.6 MB shown for 14.9 MB on disk, and a compaction said it went from
    14.4 MB where about 9.5 MB was there."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's size is pg_database_size")
    conversation = factories.make_conversation(title="Written, not checkpointed")
    for n in range(40):  # committed one by one: in the -wal file, below the autocheckpoint
        factories.add_tool(conversation, payload={"command": "x", "stdout": base64.b64encode(os.urandom(60_000)).decode()},
                           tool_call_id=f"w-{n}")
    name = str(connection.settings_dict["NAME"])
    on_disk = os.path.getsize(name) + os.path.getsize(name + "-wal")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        page_size = cursor.fetchone()[0]
    assert pages * page_size > os.path.getsize(name) + MB  # pages that are in the -wal only
    size = database_size()
    assert size.file_bytes == on_disk
    assert size.reusable_bytes <= size.file_bytes
