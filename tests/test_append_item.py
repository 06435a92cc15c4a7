"""Appending reads the next seq from one index entry, however long the conversation."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.utils import timezone

from lifecycle.actions.append_item import append_item, last_seq
from lifecycle.models import Item
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

LONG = 20_000


def _index_scans(plan: dict) -> list[dict]:
    found = [plan] if "Index" in plan.get("Node Type", "") else []
    for child in plan.get("Plans", []):
        found += _index_scans(child)
    return found


def test_the_next_seq_of_a_conversation_grown_since_its_statistics_reads_one_index_entry():
    conversation = factories.make_conversation()
    now = timezone.now()
    # Written in one go, with no statistics taken since: what a conversation that grew fast looks like
    Item.objects.bulk_create(
        [Item(conversation=conversation, seq=n, role="user", content="x", created_at=now, updated_at=now)
         for n in range(1, LONG + 1)],
        batch_size=5000,
    )
    query = last_seq(conversation.pk)
    if connection.vendor == "postgresql":
        plan = json.loads(query.explain(format="json", analyze=True))[0]["Plan"]
        scans = _index_scans(plan)
        assert [(s["Index Name"], s["Scan Direction"], s["Actual Rows"]) for s in scans] == [
            ("item_unique_seq", "Backward", 1)
        ]
    else:
        detail = query.explain()
        assert "COVERING INDEX" in detail and "conversation_id=?" in detail, detail
        index = detail.split("COVERING INDEX ", 1)[1].split(" ", 1)[0]
        with connection.cursor() as cursor:
            cursor.execute(f'PRAGMA index_info("{index}")')
            assert [row[2] for row in cursor.fetchall()] == ["conversation_id", "seq"]
    # No index on the conversation alone is left for a planner to prefer
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Item._meta.db_table)
    assert not [name for name, c in constraints.items() if c["index"] and c["columns"] == ["conversation_id"]]

    item = append_item(conversation, role="assistant", content="next")
    assert item.seq == LONG + 1
    assert Item.objects.filter(conversation=conversation).count() == LONG + 1


def test_an_append_marks_its_conversation_active_at_the_items_time():
    conversation = factories.make_conversation(days_idle=30)
    first = append_item(conversation, role="user", content="hello")
    second = append_item(conversation, role="assistant", content="hi")
    conversation.refresh_from_db()
    assert (first.seq, second.seq) == (1, 2)
    assert Item.objects.get(pk=second.pk).seq == 2  # the seq the INSERT returned is the stored one
    assert conversation.last_activity_at == second.created_at


@pytest.mark.parametrize("state", ["pending_delete", "deleted"])
def test_an_append_to_a_conversation_that_is_not_live_writes_nothing(state):
    from lifecycle.errors import ActionRefused
    from lifecycle.models import Conversation

    conversation = factories.make_conversation(days_idle=30)
    Conversation.objects.filter(pk=conversation.pk).update(state=state)
    before = Conversation.objects.get(pk=conversation.pk).last_activity_at
    with pytest.raises(ActionRefused) as refused:
        append_item(conversation, role="user", content="late")  # the caller's copy still says live
    assert refused.value.code == "conversation_deletion_pending"
    assert refused.value.message == {"pending_delete": "This conversation is being deleted; it accepts no more writes.",
                                     "deleted": "This conversation was deleted; it accepts no more writes."}[state]
    assert not Item.objects.filter(conversation=conversation).exists()
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == before


def test_an_append_to_a_conversation_that_is_gone_writes_nothing():
    from lifecycle.models import Conversation

    conversation = factories.make_conversation()
    Conversation.objects.filter(pk=conversation.pk).delete()
    with pytest.raises(Conversation.DoesNotExist):
        append_item(conversation, role="user", content="late")
    assert not Item.objects.filter(conversation_id=conversation.pk).exists()


BAD_TEXTS = ["a\x00b", "lone \ud800 surrogate"]


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize("where", ["content", "title", "tool_call_id", "payload value", "payload key", "nested"])
def test_an_append_with_a_nul_or_a_lone_surrogate_is_refused_alike_on_both_engines(where, bad):
    """PostgreSQL cannot store either (a DataError deep in the INSERT); SQLite would store them.
    The action refuses them first, the same on both, and writes nothing."""
    from lifecycle.errors import ActionRefused
    from lifecycle.models import Conversation

    conversation = factories.make_conversation(days_idle=30)
    before = Conversation.objects.get(pk=conversation.pk).last_activity_at
    fields = {"role": "tool", "tool_kind": "shell", "payload": {"command": "ls", "stdout": "ok"}}
    if where == "payload value":
        fields["payload"] = {"command": "ls", "stdout": bad}
    elif where == "payload key":
        fields["payload"] = {"command": "ls", bad: "x"}
    elif where == "nested":
        fields["payload"] = {"command": "ls", "stdout": "ok", "extra": [{"deep": [bad]}]}
    else:
        fields[where] = bad
    with pytest.raises(ActionRefused) as refused:
        append_item(conversation, **fields)
    assert (refused.value.code, refused.value.status) == ("invalid_text", 400)
    assert not Item.objects.filter(conversation=conversation).exists()
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == before


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize("where", ["status", "title", "payload"])
def test_an_update_with_a_nul_or_a_lone_surrogate_is_refused_and_changes_nothing(where, bad):
    from lifecycle.actions.update_item import update_item
    from lifecycle.errors import ActionRefused

    conversation = factories.make_conversation()
    item = append_item(conversation, role="tool", tool_kind="shell", status="running", title="ls",
                       payload={"command": "ls", "stdout": "ok"})
    change = {"payload": {"command": "ls", "stdout": bad}} if where == "payload" else {where: bad}
    with pytest.raises(ActionRefused) as refused:
        update_item(item, **change)
    assert (refused.value.code, refused.value.status) == ("invalid_text", 400)
    stored = Item.objects.get(pk=item.pk)
    assert (stored.status, stored.title, stored.payload, stored.revision) == (
        "running", "ls", {"command": "ls", "stdout": "ok"}, item.revision)
