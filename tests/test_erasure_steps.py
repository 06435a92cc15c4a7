"""How an erasure spends its transactions: empty stores settled together, a table small enough
erased in one transaction, PostgreSQL's relaxed commits restored, SQLite's pauses."""

from __future__ import annotations

import pytest
from django.db import connection

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, files, stores
from lifecycle.deletion.plan import FINGERPRINTS, stores_by_key
from lifecycle.enginefs import EngineHome
from lifecycle.registry import STORES
from tests import factories


def erase_recording(op: m.DeleteOperation) -> list[tuple[str, object]]:
    """Run the erasure to completion; the (sql, params) of every statement it ran."""
    statements: list[tuple[str, object]] = []

    def log(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(log):
        assert executor.run_erasure(op.pk) == "completed"
    return statements


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
    op = request_deletion(target, key="one", acting_user=None)
    statements = [sql for sql, _params in erase_recording(op)]
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
    seen = [f"{sql} {params}" for sql, params in erase_recording(op) if "set_config" in sql]
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


@pytest.mark.django_db
def test_postgresql_counts_a_table_without_content_by_its_delete_and_the_receipt_stays_exact():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation(title="Counted")
    factories.fill_every_store(target)
    for n in range(2, 9):
        m.Turn.objects.create(conversation=target, seq=n)
    twin = factories.make_conversation(factories.make_computer(), thread_id=target.thread_id)
    factories.fill_every_store(twin)
    expected = expected_figures(target)
    assert expected["lifecycle.Turn"] == (8, 0) and not stores_by_key()["lifecycle.Turn"].content_columns()
    op = request_deletion(target, key="counted", acting_user=None)
    statements = [sql for sql, _params in erase_recording(op)]
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    # The turns' figures are the rows their delete removed: no read of the turns before it
    # (the residue check reads the table again once the delete has completed).
    deleting = statements.index('DELETE FROM "lifecycle_turn" WHERE "conversation_id" = %s')
    assert not [s for s in statements[:deleting] if s.startswith("SELECT COUNT(*)") and '"lifecycle_turn"' in s]
    assert not m.Turn.objects.filter(conversation=target).exists()
    assert m.Turn.objects.filter(conversation=twin).count() == 1


@pytest.mark.django_db
def test_postgresql_a_counted_table_larger_than_one_transaction_is_undone_and_erased_in_batches(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    target = factories.make_conversation()
    m.Turn.objects.bulk_create([m.Turn(conversation=target, seq=n) for n in range(1, 8)])
    factories.add_message(target)
    expected = expected_figures(target)
    monkeypatch.setattr(stores, "BATCH_ROWS", 3)
    monkeypatch.setattr(stores, "PG_MAX_BATCH_ROWS", 5)
    op = request_deletion(target, key="large", acting_user=None)
    statements = [sql for sql, _params in erase_recording(op)]
    op.refresh_from_db()
    assert {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]} == expected
    assert expected["lifecycle.Turn"] == (7, 0)
    turn_deletes = [s for s in statements if s.startswith('DELETE FROM "lifecycle_turn"')]
    # The plain statement (undone: 7 rows are more than 5), then batches of 3 and of the rest.
    assert turn_deletes[0] == 'DELETE FROM "lifecycle_turn" WHERE "conversation_id" = %s'
    assert len(turn_deletes) == 3 and all("ctid" in s for s in turn_deletes[1:])
    assert op.steps.get(key="lifecycle.Turn").records == 7
    assert not m.Turn.objects.filter(conversation=target).exists()


def _commit_is_durable(cursor) -> bool:
    if connection.vendor == "postgresql":
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0] not in ("off", "local")
    cursor.execute("PRAGMA synchronous")
    return cursor.fetchone()[0] >= 2  # FULL or EXTRA: the commit syncs the write-ahead log


@pytest.mark.django_db(transaction=True)
def test_a_file_steps_figures_commit_durably_before_its_folder_is_removed(monkeypatch):
    # A folder's removal survives any crash; figures lost in one (an unsynced commit) would
    # leave the rerun measuring an empty folder and the receipt counting nothing for it.
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = request_deletion(target, key="durable-files", acting_user=None)
    file_steps = {s.key for s in STORES if s.kind != "table"}
    measured: dict[str, bool] = {}
    removed: list[str] = []
    looking = []

    def watch(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not looking and sql.startswith('UPDATE "lifecycle_deletestep"') and "measured" in (params or ()):
            looking.append(True)
            try:
                key = m.DeleteStep.objects.filter(operation=op, state="measured").exclude(
                    key__in=measured).values_list("key", flat=True).first()
                with connection.cursor() as cursor:
                    measured[key] = _commit_is_durable(cursor)
            finally:
                looking.clear()
        return result

    real_remove = files.remove_folder

    def remove(home, path):
        removed.append(path.name)
        return real_remove(home, path)

    monkeypatch.setattr(files, "remove_folder", remove)
    with connection.execute_wrapper(watch):
        assert executor.run_erasure(op.pk) == "completed"
    assert removed, "the filled stores have folders to remove"
    files_measured = {k: durable for k, durable in measured.items() if k in file_steps}
    assert files_measured and all(files_measured.values()), measured
    with connection.cursor() as cursor:  # and the connection is back to its own setting
        cursor.execute("PRAGMA synchronous" if connection.vendor == "sqlite" else "SHOW synchronous_commit")
        assert str(cursor.fetchone()[0]) in ("1", "on")


@pytest.mark.django_db
def test_a_conversation_folder_nested_thousands_of_levels_deep_is_erased_whole():
    """The removal recursed once per folder: 2,500 levels (a tool that unpacked a hostile archive)
    raised RecursionError and the delete stayed Pending. It completes now; the receipt counts
    the bottom file and the folder is gone."""
    from tests.test_enginefs import nested_deep

    target = factories.make_conversation(title="Deep")
    factories.fill_every_store(target)
    home = EngineHome()
    folder = home.artifacts_dir(target.public_id)
    with nested_deep(folder, 2500, b"at the bottom"):
        expected = expected_figures(target)["artifacts"]
        op = request_deletion(target, key="deep-folder", acting_user=None)
        assert executor.run_erasure(op.pk) == "completed"
        assert not folder.exists()
    step = m.DeleteStep.objects.get(operation=op, key="artifacts")
    assert (step.records, step.bytes) == expected and expected[0] >= 2
