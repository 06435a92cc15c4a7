"""Compacting the configured engine after many rows are deleted: real files, real VACUUM."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from django.db import connection, transaction

from lifecycle.models import Item
from retention.compact import CompactError, compact_database
from retention.storage import database_size
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def fill(messages: int, size: int) -> None:
    conversation = factories.make_conversation(title="Compacted")
    factories.add_message(conversation, content="kept")
    Item.objects.bulk_create(
        (Item(conversation=conversation, seq=seq, role="assistant", content=secrets.token_hex(size // 2))
         for seq in range(2, messages + 1)),
        batch_size=500,
    )


def sqlite_bytes_on_disk() -> int:
    name = str(connection.settings_dict["NAME"])
    return sum(os.path.getsize(name + suffix) for suffix in ("", "-wal") if Path(name + suffix).exists())


def test_it_shrinks_the_database_after_many_rows_are_deleted():
    fill(messages=3000, size=3000)
    # Rows spread over the whole table go, as a cleanup of old conversations would leave it.
    Item.objects.filter(seq__gt=1).exclude(seq__gt=2900).delete()
    assert Item.objects.count() == 101

    result = compact_database()

    assert not connection.in_atomic_block
    assert result.seconds >= 0
    assert result.before_reusable_bytes > 3_000_000, "the deleted rows were counted as reusable"
    if connection.vendor == "sqlite":
        assert result.after_file_bytes < result.before_file_bytes - 3_000_000
        assert result.after_reusable_bytes == 0
        assert sqlite_bytes_on_disk() == result.after_file_bytes
        assert not Path(str(connection.settings_dict["NAME"]) + "-wal").exists() or \
            os.path.getsize(str(connection.settings_dict["NAME"]) + "-wal") == 0
    else:
        # Plain VACUUM makes the space reusable inside the files; they keep their size (it adds
        # free-space and visibility maps), so only the reusable figure is promised to drop.
        assert result.after_reusable_bytes < result.before_reusable_bytes // 10
    assert Item.objects.count() == 101
    now = database_size()
    assert (now.file_bytes, now.reusable_bytes) == (result.after_file_bytes, result.after_reusable_bytes)


def test_a_second_compact_finds_nothing_more_to_reclaim():
    fill(messages=500, size=2000)
    Item.objects.filter(seq__gt=100).delete()
    first = compact_database()
    second = compact_database()
    assert first.before_reusable_bytes > 0
    assert second.before_reusable_bytes == first.after_reusable_bytes
    if connection.vendor == "sqlite":
        assert second.after_file_bytes == first.after_file_bytes
    assert Item.objects.count() == 100


def test_it_refuses_inside_a_transaction_and_changes_nothing():
    fill(messages=200, size=2000)
    Item.objects.filter(seq__gt=10).delete()
    before = database_size()
    with transaction.atomic(), pytest.raises(CompactError) as caught:
        compact_database()
    assert caught.value.code == "in_transaction"
    assert caught.value.message
    after = database_size()
    assert after.reusable_bytes == before.reusable_bytes > 0
    assert Item.objects.count() == 10
