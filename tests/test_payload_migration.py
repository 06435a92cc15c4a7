"""Migration 0007 stores existing payloads in the canonical form and recomputes their figures."""

from __future__ import annotations

import json

import pytest
from django.db import IntegrityError, connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from lifecycle.fence import is_fence_error
from lifecycle.models import DeletionFence, Item
from retention.reducer import Skip, encode, encoded_size, plan, plan_text
from tests import factories

BEFORE = [("lifecycle", "0006_item_cleanup_fields")]
CJK = "漢字" * 500


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _insert(conversation_id: int, seq: int, kind: str, text: str | None, *, size: int = 1, removable: int = 1,
            skip: str = "") -> int:
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lifecycle_item (conversation_id, seq, role, tool_kind, tool_call_id, status, title, "
            "content, payload, payload_bytes, removable_bytes, payload_skip, revision, created_at, updated_at) "
            "VALUES (%s, %s, 'tool', %s, '', 'completed', '', '', %s, %s, %s, %s, 1, %s, %s)",
            [conversation_id, seq, kind, text, size, removable, skip, now, now],
        )
        # raw: the model has columns later migrations add
        cursor.execute("SELECT id FROM lifecycle_item WHERE conversation_id = %s AND seq = %s", [conversation_id, seq])
        return cursor.fetchone()[0]


def _raw(item_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM lifecycle_item WHERE id = %s", [item_id])
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


@pytest.mark.django_db(transaction=True)
def test_the_migration_rewrites_payloads_and_figures_in_batches():
    live = factories.make_conversation(title="Live")
    fenced = factories.make_conversation(title="Being deleted")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    _migrate(BEFORE)
    try:
        escaped = json.dumps({"command": "cat", "stdout": CJK, "stderr": ""})  # \uXXXX escapes, spaces
        cjk_id = _insert(live.pk, 1, "shell", escaped)
        numbers_id = _insert(live.pk, 2, "shell", '{"stdout": "' + "o" * 300 + '", "took": 1e16}')
        tiny_id = _insert(live.pk, 3, "shell", '{"command": "true", "stdout": "y"}')
        fenced_id = _insert(fenced.pk, 1, "shell", escaped)
        DeletionFence.objects.create(conversation_id=fenced.pk, operation_id=1)
    finally:
        _migrate(latest)

    cjk = Item.objects.get(pk=cjk_id)
    assert cjk.payload == {"command": "cat", "stdout": CJK, "stderr": ""}
    assert cjk.payload_bytes == encoded_size(cjk.payload) and cjk.payload_skip == ""
    assert cjk.removable_bytes == plan("shell", cjk.payload).removed_bytes > 0
    # 0008 stores the removal plan cleanup rewrites from in SQL
    assert cjk.removal_plan == plan_text("shell", plan("shell", cjk.payload))
    assert json.loads(cjk.removal_plan) == {"removed_bytes": encoded_size(CJK) + 2, "removed_fields": ["stderr", "stdout"]}
    if connection.vendor == "sqlite":
        assert _raw(cjk_id) == encode(cjk.payload)
        assert len(_raw(cjk_id).encode()) == cjk.payload_bytes
    numbers = Item.objects.get(pk=numbers_id)
    assert numbers.payload_bytes == encoded_size(numbers.payload)
    assert numbers.payload["took"] == (10**16 if connection.vendor == "postgresql" else 1e16)
    tiny = Item.objects.get(pk=tiny_id)
    assert (tiny.payload_skip, tiny.removable_bytes, tiny.removal_plan) == (Skip.TOO_SMALL, 0, None)
    # The fence refuses writes to a conversation being deleted: its rows are left to erasure.
    untouched = Item.objects.get(pk=fenced_id)
    assert (untouched.payload_bytes, untouched.removable_bytes, untouched.payload_skip) == (1, 1, "")
    assert untouched.removal_plan is None
    # The fence triggers are back after the table rebuild.
    with pytest.raises(IntegrityError) as refused:
        Item.objects.filter(pk=fenced_id).update(title="late")
    assert is_fence_error(refused.value)


@pytest.mark.django_db(transaction=True)
def test_the_migration_passes_over_items_whose_figures_are_already_right():
    """An item 0007 has nothing to change for (a tool item without a payload, its figures
    already stored) is compared on the columns 0007's model has: the write path's columns
    include ones later migrations add."""
    conversation = factories.make_conversation(title="Settled")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    _migrate(BEFORE)
    try:
        _insert(conversation.pk, 1, "shell", None, size=0, removable=0, skip=Skip.NO_PAYLOAD)
    finally:
        _migrate(latest)
    item = Item.objects.get(conversation=conversation)
    assert (item.payload, item.payload_bytes, item.removable_bytes, item.payload_skip, item.removal_plan) == (
        None, 0, 0, Skip.NO_PAYLOAD, None)


def _upgrade_one(text: str) -> int:
    conversation = factories.make_conversation(title="Old data")
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    _migrate(BEFORE)
    try:
        item_id = _insert(conversation.pk, 1, "shell", text)
    finally:
        _migrate(latest)
    return item_id


@pytest.mark.django_db(transaction=True)
def test_a_payload_the_write_path_cannot_measure_is_kept_as_stored_and_skipped():
    """Rows written before writes refused them: a lone surrogate (SQLite's old JSONField wrote
    it escaped; PostgreSQL's jsonb never held one) or nesting deeper than the write path
    measures. The upgrade finishes; the payload stays as stored, cleanup skips it."""
    deep = '{"command": "x", "stdout": "' + "o" * 300 + '", "meta": ' + '{"a": ' * 990 + "1" + "}" * 990 + "}"
    texts = [deep]
    if connection.vendor == "sqlite":
        texts.append('{"command": "cat", "stdout": "\\ud800' + "x" * 200 + '"}')
    for text in texts:
        item_id = _upgrade_one(text)
        item = Item.objects.only("payload_bytes", "removable_bytes", "payload_skip", "removal_plan").get(pk=item_id)
        assert (item.removable_bytes, item.payload_skip, item.removal_plan) == (0, Skip.MALFORMED, None)
        stored = _raw(item_id)
        assert item.payload_bytes == len(stored.encode("utf-8", "surrogatepass")) > 0
        if connection.vendor == "sqlite":
            assert stored == text  # not rewritten
        Item.objects.filter(pk=item_id).delete()


@pytest.mark.django_db
def test_data_migrations_read_payloads_in_batches_bounded_by_bytes():
    from lifecycle.item_payload import payload_batch

    conversation = factories.make_conversation(title="Big outputs")
    ids = [factories.add_tool(conversation, "shell", {"stdout": "o" * size}, tool_call_id=f"b{n}").pk
           for n, size in enumerate([10, 5000, 5000, 5000, 10, 10])]
    rows = Item.objects.filter(conversation=conversation)
    # stored sizes: about 23, 5,013, 5,013, 5,013, 23, 23 bytes
    assert payload_batch(rows, 0, max_items=100, max_bytes=11_000) == ids[:3]  # the fourth would pass 11,000
    assert payload_batch(rows, ids[2], max_items=100, max_bytes=11_000) == ids[3:]
    assert payload_batch(rows, 0, max_items=100, max_bytes=1) == ids[:1]  # always at least one
    assert payload_batch(rows, 0, max_items=3, max_bytes=10**9) == ids[:3]
    assert payload_batch(rows, ids[-1], max_items=100, max_bytes=10**9) == []


@pytest.mark.parametrize("target", ["0005_fence_triggers", "0006_item_cleanup_fields", "0007_canonical_payloads"])
@pytest.mark.django_db(transaction=True)
def test_migrating_back_keeps_the_delete_fence_on_items(target):
    """Reversing 0006 or 0007 rebuilds the item table on SQLite, which drops its triggers:
    the fence goes back on after the rebuild, so a release rolled back to still refuses writes
    to a conversation being deleted."""
    from lifecycle.fence import installed_triggers

    conversation = factories.make_conversation(title="Being deleted")
    DeletionFence.objects.create(conversation_id=conversation.pk, operation_id=1)
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    _migrate([("lifecycle", target)])
    try:
        on_items = {name for name, table in installed_triggers(connection) if table == "lifecycle_item"}
        now = timezone.now()
        with pytest.raises(IntegrityError) as refused, connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO lifecycle_item (conversation_id, seq, role, tool_kind, tool_call_id, status, title, "
                "content, payload, payload_bytes, removable_bytes, revision, created_at, updated_at) "
                "VALUES (%s, 1, 'user', '', '', '', '', 'late write', NULL, 0, 0, 1, %s, %s)",
                [conversation.pk, now, now],
            )
    finally:
        _migrate(latest)
    assert on_items and is_fence_error(refused.value)
    assert not Item.objects.filter(conversation=conversation).exists()
