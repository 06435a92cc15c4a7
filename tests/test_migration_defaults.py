"""Columns added after the first release have a database default, so a server still running
older code (a rolling upgrade: it does not know the column) can insert rows."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests import factories

pytestmark = pytest.mark.django_db


def _columns(table: str) -> dict:
    with connection.cursor() as cursor:
        return {c.name: c for c in connection.introspection.get_table_description(cursor, table)}


def test_an_operation_inserted_without_the_later_columns_is_stored_with_their_defaults():
    known = [f.column for f in ToolPayloadOperation._meta.concrete_fields
             if f.column not in ("id", "started_by_name", "error_message", "counted_at", "last_item")]
    operation = ToolPayloadOperation(kind="analyze")
    values = [f.get_db_prep_save(f.pre_save(operation, True), connection) for f in ToolPayloadOperation._meta.concrete_fields
              if f.column in known]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO retention_toolpayloadoperation ({', '.join(known)}) VALUES ({', '.join(['%s'] * len(known))})",
            values,
        )
    stored = ToolPayloadOperation.objects.get()
    assert (stored.started_by_name, stored.error_message) == ("", "")


def test_a_policy_and_an_item_inserted_without_the_later_columns_get_their_defaults():
    conversation = factories.make_conversation()
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lifecycle_item (conversation_id, seq, role, tool_kind, tool_call_id, status, title, "
            "content, payload, payload_bytes, removable_bytes, revision, created_at, updated_at) "
            "VALUES (%s, 1, 'user', '', '', '', '', 'hello', NULL, 0, 0, 1, %s, %s)",
            [conversation.pk, now, now],
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload_skip FROM lifecycle_item WHERE conversation_id = %s", [conversation.pk])
        assert cursor.fetchone() == ("",)
    later = {"backup_choice", "backup_receipt_name", "preparation_error", "preparation_state"}
    columns = [c for c in _columns("retention_toolpayloadpolicy") if c not in later]
    assert later <= set(_columns("retention_toolpayloadpolicy"))
    ToolPayloadPolicy.objects.all().delete()
    policy = ToolPayloadPolicy(pk=1)
    fields = {f.column: f for f in ToolPayloadPolicy._meta.concrete_fields}
    values = [fields[c].get_db_prep_save(fields[c].pre_save(policy, True), connection) for c in columns]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO retention_toolpayloadpolicy ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
            values,
        )
    stored = ToolPayloadPolicy.objects.get()
    assert (stored.backup_choice, stored.backup_receipt_name, stored.preparation_error, stored.preparation_state) == (
        "", "", "", "none")


def test_a_measurement_inserted_without_the_engine_problem_columns_gets_their_defaults():
    from insight.models import Measurement

    later = {"engine_missing", "engine_unreadable"}
    fields = [f for f in Measurement._meta.concrete_fields if f.column not in later and f.column != "id"]
    measurement = Measurement()
    values = [f.get_db_prep_save(f.pre_save(measurement, True), connection) for f in fields]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Measurement._meta.db_table} ({', '.join(f.column for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})",
            values,
        )
    stored = Measurement.objects.get()
    assert (stored.engine_missing, stored.engine_unreadable) == (False, 0)


def test_a_bound_delete_inserted_without_its_physical_columns_gets_their_defaults():
    """remote 0004 added physical_state (NOT NULL) and physically_erased_at: a server still
    running older code inserts a bound delete without them."""
    from remote.models import BoundDelete

    later = {"physical_state", "physically_erased_at"}
    assert later <= set(_columns(BoundDelete._meta.db_table))
    op = BoundDelete(key="older-code", binding_ref="b_" + "1" * 20, engine_id="c_" + "1" * 20,
                     owner_kind="account", owner_id=1, scope="bound", thread_id="t-older", state="pending")
    fields = [f for f in BoundDelete._meta.concrete_fields if f.column not in later and f.column != "id"]
    values = [f.get_db_prep_save(f.pre_save(op, True), connection) for f in fields]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {BoundDelete._meta.db_table} ({', '.join(f.column for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})",
            values,
        )
    stored = BoundDelete.objects.get(key="older-code")
    assert (stored.physical_state, stored.physically_erased_at) == ("", None)
