"""How an erasure spends its transactions: empty stores settled together, a table small enough
erased in one transaction, PostgreSQL's relaxed commits restored, SQLite's pauses."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, stores
from lifecycle.deletion.plan import FINGERPRINTS, stores_by_key
from lifecycle.enginefs import EngineHome
from lifecycle.registry import RetentionClass
from tests import factories


def expected_figures(conversation: m.Conversation) -> dict[str, tuple[int, int]]:
    home = EngineHome()
    return {key: (f.records, f.bytes) for key, s in stores_by_key().items()
            for f in [stores.measure(s, conversation, home)]}


@pytest.mark.django_db
def test_stores_without_anything_of_the_conversation_are_settled_together_with_an_exact_receipt():
    target = factories.make_conversation(title="Sparse")
    for n in range(3):
        factories.add_message(target, content=f"message {n} é")
    factories.add_tool(target)
    expected = expected_figures(target)
    op = request_deletion(target, key="sparse", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    by_key = stores_by_key()
    empty = [s for s in op.steps.exclude(key=FINGERPRINTS)
             if by_key[s.key].kind == "table" and not by_key[s.key].tombstone and expected[s.key] == (0, 0)]
    assert len(empty) >= 8
    # Measured and marked done in one transaction: one moment for all of them.
    assert len({s.finished_at for s in empty}) == 1
    assert m.Item.objects.filter(conversation=target).count() == 0


@pytest.mark.django_db
def test_an_empty_stores_figures_are_what_its_measure_gives():
    nobody = factories.make_conversation(title="")
    home = EngineHome()
    tables = [s for s in stores_by_key().values() if s.kind == "table" and not s.tombstone]
    assert stores.tables_holding(tables, nobody) == set()
    for store in tables:
        assert stores.empty_measure(store) == stores.measure(store, nobody, home), store.key
    factories.add_message(nobody)
    assert stores.tables_holding(tables, nobody) == {"lifecycle.Item"}
    counted = stores.row_counts(tables, nobody.pk)
    assert counted == {s.key: s.rows(nobody).count() for s in tables} and counted["lifecycle.Item"] == 1


@pytest.mark.django_db
def test_a_table_within_one_transactions_rows_is_erased_in_one_statement(monkeypatch):
    target = factories.make_conversation()
    for n in range(7):
        factories.add_message(target, content=f"row {n}")
    monkeypatch.setattr(stores, "BATCH_ROWS", 3)
    monkeypatch.setattr(stores, "PG_MAX_BATCH_ROWS", 10)
    statements: list[str] = []

    def log(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    op = request_deletion(target, key="one", acting_user=None)
    with connection.execute_wrapper(log):
        assert executor.run_erasure(op.pk) == "completed"
    item_deletes = [s for s in statements if s.startswith('DELETE FROM "lifecycle_item"')]
    if connection.vendor == "postgresql":
        assert item_deletes == ['DELETE FROM "lifecycle_item" WHERE "conversation_id" = %s']
    else:
        # SQLite keeps its lock short: a first batch of 3, then the rest (at least 500 a batch).
        assert len(item_deletes) == 2 and all("LIMIT" in s for s in item_deletes)
    assert m.Item.objects.filter(conversation=target).count() == 0


@pytest.mark.django_db(transaction=True)
def test_relaxed_commits_end_with_the_run_and_the_completion_commits_durably():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation()
    factories.add_message(target)
    op = request_deletion(target, key="relaxed", acting_user=None)
    seen: list[str] = []

    def log(execute, sql, params, many, context):
        if "set_config" in sql:
            seen.append(f"{sql} {params}")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(log):
        assert executor.run_erasure(op.pk) == "completed"
    assert any(", true)" in s and "'on'" in s for s in seen)  # the completion's own transaction
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    assert getattr(connection, stores.RELAXED, None) is None


@pytest.mark.django_db
def test_sqlite_pauses_only_after_holding_the_lock_for_a_while(monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    target = factories.make_conversation()
    m.Item.objects.bulk_create([m.Item(conversation=target, seq=n, role="user", content=f"row {n}")
                                for n in range(1, 1101)])
    monkeypatch.setattr(stores, "BATCH_ROWS", 2)
    pauses: list[float] = []
    monkeypatch.setattr(stores.time, "sleep", pauses.append)
    clock = iter(range(10**6))
    # Every batch "takes" 30 ms. Batches of 2, 500, 500 (full) and 98: a pause only once 50 ms
    # of holding the lock has added up (after the second), none after the first, short one.
    monkeypatch.setattr(stores.time, "monotonic", lambda: next(clock) * 0.03)
    table = stores._q(m.Item._meta.db_table)
    changed = stores._batches(
        f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE conversation_id = %s LIMIT %s)",
        [target.pk], renew=lambda: None,
    )
    assert changed == 1100
    assert pauses == [stores.SQLITE_PAUSE]


def _other_connections() -> int:
    """Connections to this database other than this thread's own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def _settled_connections() -> int:
    deadline = time.monotonic() + 5
    while (n := _other_connections()) and time.monotonic() < deadline:
        time.sleep(0.05)  # a closed connection's server process takes a moment to leave
    return n


def _measuring_thread() -> bool:
    return threading.current_thread().name.startswith("lethe-measure")


@pytest.mark.django_db(transaction=True)
def test_postgresql_measures_beside_the_delete_and_the_receipt_stays_exact(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation(title="Beside")
    factories.fill_every_store(target)
    for n in range(40):
        factories.add_message(target, content=f"message {n} é ü " * (n % 7 + 1))
    twin = factories.make_conversation(factories.make_computer(), thread_id=target.thread_id)
    factories.fill_every_store(twin)
    expected = expected_figures(target)
    items = m.Item.objects.filter(conversation=target)
    assert expected["lifecycle.Item"][0] == items.count() == 42
    assert _settled_connections() == 0
    # The measurement of each erased table starts only once the step's DELETE has run (not yet
    # committed): the worst order. It must still see every row the delete removes.
    monkeypatch.setattr(stores, "BESIDE_ROWS", 0)  # every table with content, however small
    deleted = threading.Event()
    measured_beside: list[tuple[str, int]] = []
    statements: list[str] = []
    measure = stores.measure

    def late_measure(store, conversation, home):
        if not _measuring_thread():
            return measure(store, conversation, home)
        assert deleted.wait(10)
        deleted.clear()
        figures = measure(store, conversation, home)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            measured_beside.append((store.key, cursor.fetchone()[0]))
        return figures

    def note_delete(execute, sql, params, many, context):
        statements.append(sql)
        result = execute(sql, params, many, context)
        if sql.startswith("DELETE FROM"):
            deleted.set()
        return result

    monkeypatch.setattr(stores, "measure", late_measure)
    op = request_deletion(target, key="beside", acting_user=None)
    with connection.execute_wrapper(note_delete):
        assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    assert items.count() == 0 and m.Item.objects.filter(conversation=twin).count() == 2
    by_key = stores_by_key()
    erased_tables = {key for key, (records, _bytes) in expected.items() if records and by_key[key].kind == "table"
                     and by_key[key].retention == RetentionClass.ERASE and not by_key[key].tombstone}
    assert {key for key, _pid in measured_beside} == {key for key in erased_tables if by_key[key].content_columns()}
    assert "lifecycle.Item" in {key for key, _pid in measured_beside}
    # Turns have no content: the rows their delete removed are their figures, with no read first.
    assert "lifecycle.Turn" in erased_tables and not by_key["lifecycle.Turn"].content_columns()
    assert not [s for s in statements if s.startswith("SELECT COUNT(*), COALESCE(SUM") and '"lifecycle_turn"' in s]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    assert len({pid for _key, pid in measured_beside}) == 1 and own not in {pid for _key, pid in measured_beside}
    # The measuring connection was closed with the run.
    assert _settled_connections() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failure", ["database_error", "wrong_count"])
def test_postgresql_an_error_in_the_measuring_thread_fails_the_step_and_keeps_the_rows(failure, monkeypatch, settings):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    settings.DEBUG = False
    monkeypatch.setattr(stores, "BESIDE_ROWS", 0)
    target = factories.make_conversation(title="Measure fails")
    factories.fill_every_store(target)
    expected = expected_figures(target)
    measure = stores.measure

    def failing_measure(store, conversation, home):
        figures = measure(store, conversation, home)
        if store.key == "lifecycle.Item" and _measuring_thread():
            if failure == "database_error":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1 / 0")  # a real database error, on the measuring connection
            figures.records += 1  # figures that are not what the delete removed
        return figures

    monkeypatch.setattr(stores, "measure", failing_measure)
    op = request_deletion(target, key="fails", acting_user=None)
    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    item_step = op.steps.get(key="lifecycle.Item")
    code = "database_error" if failure == "database_error" else "internal_error"
    assert (op.state, op.last_error, op.step) == ("pending", code, "lifecycle.Item")
    assert (item_step.state, item_step.records, item_step.bytes) == ("pending", 0, 0)
    # The delete went back with the step: every row is still there.
    assert m.Item.objects.filter(conversation=target).count() == 2
    assert _settled_connections() == 0
    monkeypatch.setattr(stores, "measure", measure)
    assert executor.run_erasure(op.pk, force=True) == "completed"
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    assert m.Item.objects.filter(conversation=target).count() == 0


@pytest.mark.django_db(transaction=True)
def test_postgresql_a_table_larger_than_one_transaction_is_undone_and_erased_in_batches(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation()
    for n in range(7):
        factories.add_message(target, content=f"row {n}")
    expected = expected_figures(target)
    monkeypatch.setattr(stores, "BESIDE_ROWS", 0)
    monkeypatch.setattr(stores, "BATCH_ROWS", 3)
    monkeypatch.setattr(stores, "PG_MAX_BATCH_ROWS", 5)
    statements: list[str] = []

    def log(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    op = request_deletion(target, key="large", acting_user=None)
    with connection.execute_wrapper(log):
        assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    item_deletes = [s for s in statements if s.startswith('DELETE FROM "lifecycle_item"')]
    # The plain statement (undone: 7 rows are more than 5), then batches of 3 and at least 500.
    assert item_deletes[0] == 'DELETE FROM "lifecycle_item" WHERE "conversation_id" = %s'
    assert len(item_deletes) == 3 and all("ctid" in s for s in item_deletes[1:])
    assert m.Item.objects.filter(conversation=target).count() == 0


@pytest.mark.django_db(transaction=True)
def test_postgresql_a_small_table_is_measured_on_the_runs_own_connection(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation()
    for n in range(3):
        factories.add_message(target, content=f"small {n}")
    expected = expected_figures(target)
    opened: list[str] = []
    monkeypatch.setattr(stores.Beside, "measure", lambda self, store, *args: opened.append(store.key))
    op = request_deletion(target, key="small", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    assert opened == [] and _settled_connections() == 0
