"""What the receipt and the operation page claim after a delete is true: PostgreSQL's planner
statistics are rewritten with the tables, its write-ahead log files are named as a holder,
and a raw-byte check is claimed only where one looked at something."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from lifecycle.actions.append_item import append_item
from lifecycle.actions.record_compaction import record_compaction
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, verify
from lifecycle.deletion.rewrite import finish_waiting_erasures
from lifecycle.enginefs import EngineHome
from lifecycle.models import DeleteOperation
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)
HOST = {"HTTP_HOST": "127.0.0.1"}
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's statistics and WAL")


def _sampled(needles: dict[str, str]) -> list[tuple[str, str, str]]:
    """Which needles the planner statistics (most common values, histogram bounds) hold."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename, attname, COALESCE(most_common_vals::text, '') || ' ' || "
                       "COALESCE(histogram_bounds::text, '') FROM pg_stats WHERE schemaname = 'public'")
        rows = cursor.fetchall()
    return [(key, table, column) for table, column, values in rows for key, value in needles.items()
            if value in values]


def _deleted(conversation, key: str) -> DeleteOperation:
    op = request_deletion(conversation, key=key, acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    return op


@postgresql_only
def test_finish_erasure_rewrites_the_statistics_that_sampled_the_deleted_values(admin_client):
    title = factories.marker("title")
    target = factories.make_conversation(title=title)
    markers = {**factories.fill_every_store(target), "title": title}
    for n in range(5):  # others, so the columns have values enough for a histogram
        factories.fill_every_store(factories.make_conversation(title=f"bystander {n}"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # what autovacuum does by itself
    wanted = {k: markers[k] for k in ("title", "lifecycle.Item", "lifecycle.Goal", "lifecycle.MailEnvelope")}
    assert _sampled(wanted), "the statistics sampled the content first"
    op = _deleted(target, "claims-stats")
    assert {h["kind"] for h in op.receipt["holders"]} >= {"database_files", "server_wal"}
    result = finish_waiting_erasures()
    assert result.held_by == 0 and result.erased == 1
    assert _sampled(wanted) == []
    with connection.cursor() as cursor:  # nor do the statistics catalog's old rows, in its files
        cursor.execute("SHOW data_directory")
        data = cursor.fetchone()[0]
        cursor.execute("SELECT pg_relation_filepath('pg_statistic'), pg_relation_filepath(reltoastrelid)"
                       " FROM pg_class WHERE oid = 'pg_statistic'::regclass")
        files = [Path(data) / relative for relative in cursor.fetchone()]
        cursor.execute("CHECKPOINT")  # the rewritten catalog's pages on disk
    if all(os.access(f, os.R_OK) for f in files):
        raw = b"".join(f.read_bytes() for f in files)
        assert [k for k, v in wanted.items() if v.encode() in raw] == []
    op.refresh_from_db()
    assert op.physical_state == "erased"
    assert [h["kind"] for h in op.receipt["holders"]] == ["server_wal"]  # the superuser rewrote the catalog
    page = admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode()
    assert "the touched tables were rewritten without the deleted bytes" in page
    assert "the database no longer holds the deleted bytes" not in page
    assert "write-ahead log files: until the server reuses them" in page
    api = admin_client.get(f"/v1/operations/{op.public_id}", **HOST).json()
    assert [h["kind"] for h in api["receipt"]["holders"]] == ["server_wal"]


def test_a_compaction_that_could_not_rewrite_the_statistics_names_them(admin_client):
    op = _deleted(factories.make_conversation(title="stats"), "claims-no-stats")
    DeleteOperation.objects.filter(pk=op.pk).update(physical_state="pending")  # as on PostgreSQL before it
    started = timezone.now()
    assert record_compaction(started_at=started, finished_at=timezone.now(), tables=op.touched_tables,
                             statistics_rewritten=False) == 1
    op.refresh_from_db()
    kinds = [h["kind"] for h in op.receipt["holders"]]
    assert "statistics" in kinds and "database_files" not in kinds and "wal" not in kinds
    page = admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode()
    assert "planner statistics catalog (pg_statistic)" in page


def test_short_content_is_not_called_clean_in_the_raw_bytes(admin_client):
    # Chat lines under the sampling size leave nothing to look for: a verbatim copy left in the
    # engine folder cannot be found by the raw scan, so the scan must not say "clean".
    secret = "wire 40k to acct 7733-1902 on Fri"
    target = factories.make_conversation(title="Payroll change")
    append_item(target, role="user", content=secret)
    append_item(target, role="assistant", content="Done, scheduled for Friday.")
    op = _deleted(target, "claims-short")
    (EngineHome().root / "stray-copy.txt").write_bytes(((secret + "\n") * 50).encode())
    report = verify.verify(op, physical=True)
    assert (report.windows, report.physical, report.logical) == (0, "no_samples", [])
    op.refresh_from_db()
    assert op.verified_at is not None and op.verified_physical_at is None
    assert op.receipt["verification"]["physical"] == "no_samples"
    page = admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode()
    assert "raw bytes" not in page and "Every store re-checked on" in page


@postgresql_only
def test_on_postgresql_a_raw_byte_check_claims_the_engine_folder_only(admin_client):
    target = factories.make_conversation(title="verify pg")
    factories.fill_every_store(target)
    op = _deleted(target, "claims-pg-verify")
    assert finish_waiting_erasures().held_by == 0
    op.refresh_from_db()
    report = verify.verify(op, physical=True)
    assert report.windows > 0 and report.physical == "clean"
    page = admin_client.get(f"/operations/{op.public_id}/", **HOST).content.decode()
    assert "the raw bytes of the engine folder's files hold none of the samples" in page
    assert "the raw bytes of the database and" not in page
