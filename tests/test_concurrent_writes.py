from __future__ import annotations

import threading

import pytest
from django.db import connection

from lifecycle.actions.append_item import append_item
from lifecycle.models import Item
from tests import factories


@pytest.mark.django_db(transaction=True)
def test_it_lets_concurrent_writers_append_without_losing_or_repeating_a_message():
    conversation = factories.make_conversation()
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def writer(name: str) -> None:
        try:
            start.wait()
            for n in range(40):
                append_item(conversation, role="user", content=f"{name}-{n}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    seqs = sorted(Item.objects.filter(conversation=conversation).values_list("seq", flat=True))
    assert seqs == list(range(1, 121))
    contents = set(Item.objects.filter(conversation=conversation).values_list("content", flat=True))
    assert contents == {f"w{i}-{n}" for i in range(3) for n in range(40)}


@pytest.mark.django_db(transaction=True)
def test_appends_racing_with_one_idempotency_key_make_one_item():
    """A runtime's retries of one append, racing: one item, and every retry answers with it."""
    conversation = factories.make_conversation()
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer() -> None:
        try:
            start.wait()
            item = append_item(conversation, role="assistant", content="Once.", client_key="turn-7-reply")
            results.append(item.pk)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    stored = list(Item.objects.filter(conversation=conversation).values_list("pk", "content", "client_key"))
    assert stored == [(results[0], "Once.", "turn-7-reply")] and set(results) == {results[0]} and len(results) == 4
