"""The database fence: triggers refuse raw writes of a fenced conversation's content."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from lifecycle import fence
from lifecycle.models import Conversation, DeletionFence, Goal, Item, OperationBinding, Turn
from lifecycle.registry import STORES, fenced_tables
from tests import factories

pytestmark = pytest.mark.django_db


def raw(sql: str, params=()) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def fence_up(conversation: Conversation) -> None:
    """The database half of an intent, alone, so the triggers are tested without the app."""
    DeletionFence.objects.create(conversation_id=conversation.pk, operation_id=0)
    Conversation.objects.filter(pk=conversation.pk).update(state="pending_delete")


def test_it_lists_every_fence_trigger_after_all_migrations():
    expected = fence.trigger_names(connection)
    tables = {s.db_table for s in fenced_tables()}
    assert {table for _name, table in expected} == tables | {"lifecycle_conversation"}
    assert fence.installed_triggers(connection) == expected
    # Every erase and compact table of the registry is fenced, except the tombstone row's own.
    for s in STORES:
        if s.kind == "table" and s.retention in ("erase", "compact") and not s.tombstone:
            assert s.db_table in tables


def test_it_reinstalls_the_triggers_idempotently():
    fence.install_fence_triggers(connection)
    fence.install_fence_triggers(connection)
    assert fence.installed_triggers(connection) == fence.trigger_names(connection)


def test_it_refuses_a_raw_insert_and_update_of_a_fenced_conversations_rows():
    target, other = factories.make_conversation(), factories.make_conversation()
    item = factories.add_message(target, content="before the fence")
    turn = Turn.objects.create(conversation=target, seq=1)
    fence_up(target)
    now = "2026-01-01 00:00:00"
    with pytest.raises(IntegrityError) as caught:
        raw("INSERT INTO lifecycle_goal (conversation_id, text, status, created_at) VALUES (%s, %s, %s, %s)",
            [target.pk, "late goal", "open", now])
    assert fence.is_fence_error(caught.value)
    with pytest.raises(IntegrityError) as caught:
        raw("UPDATE lifecycle_item SET content = %s WHERE id = %s", ["rewritten", item.pk])
    assert fence.is_fence_error(caught.value)
    # Moving a row out of (or into) the fenced conversation is an update of it too.
    with pytest.raises(IntegrityError):
        raw("UPDATE lifecycle_turn SET conversation_id = %s WHERE id = %s", [other.pk, turn.pk])
    assert Item.objects.get(pk=item.pk).content == "before the fence"
    assert not Goal.objects.filter(conversation=target).exists()
    # The ORM's paths are refused the same way.
    with pytest.raises(IntegrityError), transaction.atomic():
        Goal.objects.bulk_create([Goal(conversation=target, text="bulk")])
    with pytest.raises(IntegrityError), transaction.atomic():
        Item.objects.filter(pk=item.pk).update(title="late")
    # Others are untouched by the fence, and deleting the fenced rows is allowed.
    raw("INSERT INTO lifecycle_goal (conversation_id, text, status, created_at) VALUES (%s, %s, %s, %s)",
        [other.pk, "fine", "open", now])
    raw("DELETE FROM lifecycle_item WHERE conversation_id = %s", [target.pk])
    assert not Item.objects.filter(conversation=target).exists()


def test_it_tells_a_fence_refusal_from_a_unique_violation():
    conversation = factories.make_conversation()
    Turn.objects.create(conversation=conversation, seq=1)
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        Turn.objects.create(conversation=conversation, seq=1)
    assert not fence.is_fence_error(caught.value)


def test_it_allows_only_clearing_content_on_a_compact_table():
    target = factories.make_conversation()
    binding = OperationBinding.objects.create(conversation=target, operation_id="op_1", target_id="turn_1",
                                              outcome="applied", request={"prompt": "secret"})
    fence_up(target)
    with pytest.raises(IntegrityError):
        raw("UPDATE lifecycle_operationbinding SET request = %s WHERE id = %s", ['{"prompt": "new"}', binding.pk])
    with pytest.raises(IntegrityError):  # clearing, but also changing the outcome
        raw("UPDATE lifecycle_operationbinding SET request = NULL, outcome = 'rejected' WHERE id = %s", [binding.pk])
    raw("UPDATE lifecycle_operationbinding SET request = NULL WHERE id = %s", [binding.pk])
    binding.refresh_from_db()
    assert (binding.request, binding.outcome, binding.operation_id) == (None, "applied", "op_1")


def test_it_never_lets_a_tombstone_get_its_title_back_or_go_live():
    target = factories.make_conversation(title="Private plans")
    fence_up(target)
    with pytest.raises(IntegrityError):
        raw("UPDATE lifecycle_conversation SET title = %s WHERE id = %s", ["Other title", target.pk])
    with pytest.raises(IntegrityError):
        raw("UPDATE lifecycle_conversation SET state = 'live' WHERE id = %s", [target.pk])
    raw("UPDATE lifecycle_conversation SET state = 'deleted', title = '', search_title = '' WHERE id = %s", [target.pk])
    with pytest.raises(IntegrityError):
        raw("UPDATE lifecycle_conversation SET title = %s WHERE id = %s", ["Private plans", target.pk])
    with pytest.raises(IntegrityError):  # nor its search fold
        raw("UPDATE lifecycle_conversation SET search_title = %s WHERE id = %s", ["private plans", target.pk])
    raw("UPDATE lifecycle_conversation SET last_activity_at = %s WHERE id = %s", ["2026-01-01 00:00:00", target.pk])
    target.refresh_from_db()
    assert (target.state, target.title) == ("deleted", "")


def test_it_turns_a_database_refusal_into_the_fence_code():
    target = factories.make_conversation()
    fence_up(target)
    with pytest.raises(fence.ActionRefused) as caught, fence.fenced_write():
        Goal.objects.create(conversation=target, text="late")
    assert caught.value.code == "conversation_deletion_pending"
    assert Goal.objects.count() == 0  # and the outer transaction is still usable


def test_a_tombstone_cannot_come_back_by_being_deleted_and_inserted_again():
    target = factories.make_conversation(title="Private plans")
    fence_up(target)
    raw("UPDATE lifecycle_conversation SET state = 'deleted', title = '', search_title = '' WHERE id = %s", [target.pk])
    columns = [c.column for c in Conversation._meta.concrete_fields]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM lifecycle_conversation WHERE id = %s", [target.pk])
        row = dict(zip(columns, cursor.fetchone(), strict=True))
    row.update(state="live", title="Private plans", search_title="private plans")
    values = ", ".join(["%s"] * len(columns))
    insert = f"INTO lifecycle_conversation ({', '.join(columns)}) VALUES ({values})"
    with pytest.raises(IntegrityError) as caught:
        if connection.vendor == "sqlite":  # REPLACE deletes and inserts, firing no UPDATE trigger
            raw("INSERT OR REPLACE " + insert, list(row.values()))
        else:  # the fence's foreign key is checked at commit, after the insert
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("DELETE FROM lifecycle_conversation WHERE id = %s", [target.pk])
                cursor.execute("INSERT " + insert, list(row.values()))
    assert fence.is_fence_error(caught.value)
    target.refresh_from_db()
    assert (target.state, target.title) == ("deleted", "")
    # A conversation that is not fenced is inserted as ever.
    assert factories.make_conversation(title="new").state == "live"
