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
