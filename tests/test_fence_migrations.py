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
