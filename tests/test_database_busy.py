"""A database too busy to answer in time (another writer holds what a request needs for longer
than the request waits) is a 503 with Retry-After on screens and in the API, never the 500 of
an unexpected error, and the request changed nothing. Real locks held by a second connection."""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest
from django.db import connection
from django.test import Client

from console.models import ApiToken
from lifecycle import models as m
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def held(conversation):
    """Another connection holds what a write to `conversation` needs, and this one waits briefly
    for it: SQLite's write lock with a 0.3 s wait; PostgreSQL the conversation's row lock with a
    0.3 s lock_timeout."""
    if connection.vendor == "sqlite":
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        options = connection.settings_dict["OPTIONS"]
        saved = options["timeout"]
        options["timeout"] = 0.3
        try:
            yield
        finally:
            options["timeout"] = saved
            other.execute("ROLLBACK")
            other.close()
    else:
        s = connection.settings_dict
        other = psycopg.connect(host=s["HOST"], port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"],
                                password=s["PASSWORD"] or None)
        other.execute("SELECT 1 FROM lifecycle_conversation WHERE id = %s FOR UPDATE", [conversation.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
            other.rollback()
            other.close()


def test_an_api_write_that_waits_too_long_is_a_503_and_changes_nothing(admin_user):
    conversation = factories.make_conversation()
    factories.add_message(conversation, content="first")
    _token, raw = ApiToken.issue(admin_user, name="busy")
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_ACCEPT_LANGUAGE="es")
    with held(conversation):
        answer = client.post(f"/v1/threads/{conversation.public_id}/items", {"role": "user", "content": "second"},
                             content_type="application/json")
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "database_busy"
    assert answer.json()["message"].startswith("La base de datos")
    assert answer["Retry-After"] == "5"
    assert list(m.Item.objects.filter(conversation=conversation).values_list("content", flat=True)) == ["first"]
    # Once the lock is gone the same request goes through.
    again = client.post(f"/v1/threads/{conversation.public_id}/items", {"role": "user", "content": "second"},
                        content_type="application/json")
    assert again.status_code == 201


def test_a_screen_action_that_waits_too_long_is_a_503_page_and_changes_nothing(admin_client):
    conversation = factories.make_conversation()
    with held(conversation):
        answer = admin_client.post(f"/conversations/{conversation.public_id}/archive/", {"archived": "1"},
                                   HTTP_ACCEPT_LANGUAGE="en")
    assert answer.status_code == 503
    assert b"The database is busy" in answer.content
    assert answer["Retry-After"] == "5"
    conversation.refresh_from_db()
    assert conversation.archived_at is None
    assert not m.AuditFact.objects.filter(conversation=conversation).exists()


@contextlib.contextmanager
def full_sqlite():
    """Every connection may not grow the database past the pages it has now (PRAGMA
    max_page_count, set on each connection as it opens), and the room left in them is filled: a
    write that needs any room fails with SQLITE_FULL, as on a full disk."""
    from django.db import OperationalError

    options = connection.settings_dict["OPTIONS"]
    saved = options["init_command"]
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE filler (b BLOB)")
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0] + 1
    options["init_command"] = saved + f"PRAGMA max_page_count={pages};"
    connection.close()
    with connection.cursor() as cursor:
        for size in (4000, 500, 50, 1):
            while True:
                try:
                    cursor.execute("INSERT INTO filler VALUES (zeroblob(%s))", [size])
                except OperationalError:
                    break
    try:
        yield
    finally:
        options["init_command"] = saved
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE filler")


def test_a_full_database_is_a_503_database_full_and_a_token_read_still_answers(admin_user):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's page limit stands in for a full disk")
    conversation = factories.make_conversation()
    factories.add_message(conversation, content="first")
    token, raw = ApiToken.issue(admin_user, name="full")
    m.Item.objects.filter(conversation=conversation).update(content="x")  # (nothing to read back)
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_ACCEPT_LANGUAGE="es")
    with full_sqlite():
        # A read through the token: its last-use bookkeeping cannot be written, and is skipped.
        read = client.get(f"/v1/threads/{conversation.public_id}")
        bulky = "y" * 200_000
        write = client.post(f"/v1/threads/{conversation.public_id}/items", {"role": "user", "content": bulky},
                            content_type="application/json")
        screen = Client(HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="en")
        screen.force_login(admin_user)
    assert read.status_code == 200
    assert write.status_code == 503 and write.json()["code"] == "database_full", write.content
    assert write.json()["message"].startswith("El disco de la base de datos")
    assert write["Retry-After"] == "60"
    assert not m.Item.objects.filter(conversation=conversation, content=bulky).exists()


def test_a_page_whose_write_found_the_database_full_is_a_503_page():
    """(Screens write small rows that usually fit the pages the database has: the error a
    write raises once nothing fits is taken from a real write, and answered as a page would.)"""
    from django.db import OperationalError
    from django.test import RequestFactory

    from console.middleware import trouble_response

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's page limit stands in for a full disk")
    with full_sqlite(), pytest.raises(OperationalError) as raised, connection.cursor() as cursor:
        cursor.execute("INSERT INTO filler VALUES (zeroblob(100000))")
    answer = trouble_response(RequestFactory().post("/conversations/c_x/archive/"), raised.value)
    assert answer.status_code == 503 and answer["Retry-After"] == "60"
    assert "The database's disk is full" in answer.content.decode().replace("&#x27;", "'")
    assert trouble_response(RequestFactory().get("/conversations/"), ValueError("x")) is None
