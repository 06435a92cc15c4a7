"""Every migration step that rebuilds a fenced table on SQLite leaves the fence triggers on,
forwards and backwards (SQLite drops a table's triggers when it rebuilds it)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from lifecycle import fence
from lifecycle.models import Conversation, DeletionFence
from tests import factories


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _lost(name: str) -> set[tuple[str, str]]:
    """Triggers the code installs that are not in the database at migration `name` (the
    re-insert trigger came with 0013)."""
    expected = fence.trigger_names(connection)
    if name < "0013":
        expected = {(trigger, table) for trigger, table in expected if not trigger.endswith("_reinsert")}
    return expected - fence.installed_triggers(connection)


def _lifecycle_steps() -> list[str]:
    """Lifecycle's migrations from the one that installs the fence to the newest."""
    graph = MigrationExecutor(connection).loader.graph
    leaf = next(name for app, name in graph.leaf_nodes() if app == "lifecycle")
    names = [name for app, name in graph.forwards_plan(("lifecycle", leaf)) if app == "lifecycle"]
    return names[names.index("0005_fence_triggers"):]


@pytest.mark.django_db(transaction=True)
def test_every_step_back_and_forth_keeps_every_fence_trigger():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    steps = _lifecycle_steps()
    missing = {}
    try:
        for name in reversed(steps):
            _migrate([("lifecycle", name)])
            if lost := _lost(name):
                missing[f"back to {name}"] = sorted(lost)
        for name in steps[1:]:
            _migrate([("lifecycle", name)])
            if lost := _lost(name):
                missing[f"forward to {name}"] = sorted(lost)
    finally:
        _migrate(latest)
    assert missing == {}
    assert fence.installed_triggers(connection) == fence.trigger_names(connection)


@pytest.mark.django_db(transaction=True)
def test_migrating_back_to_0017_still_refuses_bringing_a_deleted_conversation_back():
    """Reversing 0018 removes an indexed column, which rebuilds the conversation table on
    SQLite: the tombstone's triggers go back on after it."""
    target = factories.make_conversation(title="")
    DeletionFence.objects.create(conversation_id=target.pk, operation_id=0)
    Conversation.objects.filter(pk=target.pk).update(state="deleted")
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    _migrate([("lifecycle", "0017_delete_op_requester_idx")])
    try:
        on_conversation = {name for name, table in fence.installed_triggers(connection)
                           if table == "lifecycle_conversation"}
        with pytest.raises(IntegrityError) as refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE lifecycle_conversation SET state = 'live' WHERE id = %s", [target.pk])
    finally:
        _migrate(latest)
    assert len(on_conversation) == 2
    assert fence.is_fence_error(refused.value)
    assert Conversation.objects.get(pk=target.pk).state == "deleted"


@pytest.mark.django_db(transaction=True)
def test_tombstones_from_before_view_changed_at_get_their_deletion_moment():
    """0023: the Deleted tab lists newest deletion first; a tombstone made before 0018 had no
    view_changed_at and sorted by its last activity (r18). Its delete's completion fills it
    (its last activity when no completed delete is recorded); a set one is left alone."""
    from datetime import timedelta

    from django.utils import timezone

    from lifecycle.models import DeleteOperation

    now = timezone.now()
    with_op, without_op, recent = (factories.make_conversation(thread_id=f"t-{n}", days_idle=300) for n in range(3))
    for conversation in (with_op, without_op, recent):
        DeletionFence.objects.create(conversation_id=conversation.pk, operation_id=0)
    DeleteOperation.objects.create(conversation=with_op, state="completed", completed_at=now - timedelta(days=2))
    Conversation.objects.filter(pk__in=[with_op.pk, without_op.pk]).update(state="deleted", view_changed_at=None)
    Conversation.objects.filter(pk=recent.pk).update(state="deleted", view_changed_at=now - timedelta(hours=1))
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    _migrate([("lifecycle", "0022_step_detail_without_agent_ids")])
    try:
        _migrate([("lifecycle", "0023_deleted_order")])
    finally:
        _migrate(latest)
    moments = dict(Conversation.objects.values_list("pk", "view_changed_at"))
    assert moments[with_op.pk] == now - timedelta(days=2)
    assert moments[without_op.pk] == Conversation.objects.get(pk=without_op.pk).last_activity_at
    assert moments[recent.pk] == now - timedelta(hours=1)
    assert fence.installed_triggers(connection) == fence.trigger_names(connection)
