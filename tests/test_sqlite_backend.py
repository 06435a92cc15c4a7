"""console/sqlite: a transaction waiting for SQLite's write lock tries again every half
millisecond instead of on the busy handler's schedule, gives up after the connection's timeout
with SQLite's own error, and leaves the busy handler as it was for statements outside a
transaction; a write outside any transaction takes the lock the same way, in a
transaction of its own. Real files, a second real connection holding the lock."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from console.sqlite import base
from lifecycle.models import Account

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's write lock")]


def hold_write_lock(seconds: float, taken: threading.Event) -> threading.Thread:
    """Another connection takes the write lock for `seconds`, then commits."""
    def run():
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(seconds)
            other.execute("COMMIT")
        finally:
            other.close()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def begins_while(run) -> int:
    """How many times BEGIN IMMEDIATE was sent while `run` ran."""
    sent = []

    def count(execute, sql, params, many, context):
        if sql == "BEGIN IMMEDIATE":
            sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        run()
    return len(sent)


def test_a_waiting_writer_tries_again_often_and_gets_in_once_the_lock_is_free():
    connection.ensure_connection()
    taken = threading.Event()
    holder = hold_write_lock(0.2, taken)
    assert taken.wait(10)

    def write():
        with transaction.atomic():
            Account.objects.create(name="after the lock")

    tries = begins_while(write)
    holder.join()
    assert Account.objects.filter(name="after the lock").count() == 1
    # SQLite's busy handler would have tried about 8 times in 200 ms; polling, many more
    assert tries > 20
    # the busy handler is back for statements outside a transaction
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 20000


def test_a_writer_gives_up_after_the_timeout_with_sqlites_error_and_writes_nothing(monkeypatch):
    connection.ensure_connection()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.1)
    monkeypatch.setattr(base, "FAST_SECONDS", 0.05)  # the slower tries after a while are taken too
    taken = threading.Event()
    holder = hold_write_lock(1.0, taken)
    assert taken.wait(10)
    with pytest.raises(OperationalError, match="database is locked"), transaction.atomic():
        Account.objects.create(name="never")
    holder.join()
    assert not Account.objects.filter(name="never").exists()
    assert not connection.in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 20000
    with transaction.atomic():  # the connection is usable after
        Account.objects.create(name="later")
    assert Account.objects.filter(name="later").exists()


def test_an_error_other_than_a_busy_lock_is_not_retried(monkeypatch):
    connection.ensure_connection()
    calls = []

    def broken(execute, sql, params, many, context):
        if sql == "BEGIN IMMEDIATE":
            calls.append(sql)
            raise OperationalError("disk I/O error")
        return execute(sql, params, many, context)

    with (connection.execute_wrapper(broken), pytest.raises(OperationalError, match="disk I/O error"),
          transaction.atomic()):
        pass
    assert calls == ["BEGIN IMMEDIATE"]


def test_a_write_outside_a_transaction_polls_for_the_lock_too_and_commits():
    connection.ensure_connection()
    account = Account.objects.create(name="before")  # INSERT ... RETURNING: the busy handler's way
    raw = connection.connection
    begins = []
    raw.set_trace_callback(lambda sql: begins.append(sql) if sql == "BEGIN IMMEDIATE" else None)
    taken = threading.Event()
    holder = hold_write_lock(0.2, taken)
    assert taken.wait(10)
    try:
        assert Account.objects.filter(pk=account.pk).update(name="after") == 1  # autocommit UPDATE
    finally:
        raw.set_trace_callback(None)
        holder.join()
    assert len(begins) > 20  # tried often while the other connection held the lock
    assert not raw.in_transaction  # committed, nothing left open
    other = sqlite3.connect(connection.settings_dict["NAME"])
    try:
        assert other.execute("SELECT name FROM lifecycle_account WHERE id = ?", (account.pk,)).fetchone() == ("after",)
    finally:
        other.close()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 20000


def test_a_write_outside_a_transaction_that_fails_changes_nothing_and_leaves_no_transaction():
    first = Account.objects.create(name="one")
    second = Account.objects.create(name="two")
    with pytest.raises(IntegrityError):
        Account.objects.filter(pk=second.pk).update(id=first.pk)  # the key is taken
    assert not connection.connection.in_transaction
    assert sorted(Account.objects.values_list("name", flat=True)) == ["one", "two"]


def test_asking_whether_sqlite_has_json_takes_no_write_lock():
    """r30: Django's question ran in a transaction (BEGIN IMMEDIATE here): while another
    connection held the write lock, every command waited for it, took the failure for "no
    JSON" and stopped on false system-check errors ("SQLite does not support JSONFields")."""
    connection.ensure_connection()
    connection.features.__dict__.pop("supports_json_field", None)  # asked again, as a new process does
    taken = threading.Event()
    holder = hold_write_lock(3, taken)
    assert taken.wait(10)
    connection.lock_wait = 0.5  # without the change: waits this long, then answers False
    try:
        assert begins_while(lambda: connection.features.supports_json_field) == 0
        assert connection.features.supports_json_field is True
    finally:
        connection.lock_wait = None
        holder.join()
