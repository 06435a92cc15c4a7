"""The stored form of a tool item's payload and the figures written with it.

Every write path (the item actions, seeding, benchmarks, the data migration) stores the
payload as the database will give it back, and with it `payload_bytes` (its canonical size),
`removable_bytes` (the exact reduction cleanup would make now), `payload_skip` (the
reducer's skip reason) and `removal_plan` (the marker's figure and field names), so analysis
is a sum over an index and equals what cleanup removes, and cleanup rewrites most rows in SQL
without reading their payloads.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import connection

from retention import reducer

# A NUL character or a lone surrogate: PostgreSQL cannot store either in text or jsonb, and
# neither encodes as UTF-8, so every write path refuses them on both engines alike.
BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def has_bad_text(*values: Any) -> bool:
    """Whether any string in the values (nested lists and dicts, keys included) holds a NUL
    character or a lone surrogate."""
    stack = list(values)
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if BAD_TEXT.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


def payload_columns(role: str, kind: str, payload: Any, *, vendor: str | None = None) -> dict[str, Any]:
    """Column values for an item's payload: payload, payload_bytes, removable_bytes,
    payload_skip, removal_plan."""
    if role != "tool":
        return {"payload": payload, "payload_bytes": 0, "removable_bytes": 0, "payload_skip": "",
                "removal_plan": None}
    stored = reducer.normalize(payload, vendor=vendor or connection.vendor)
    size, removable, skip, removal_plan = reducer.item_figures(kind, stored)
    return {"payload": stored, "payload_bytes": size, "removable_bytes": removable, "payload_skip": skip,
            "removal_plan": removal_plan}


def stored_payload_size():
    """The expression for a payload's stored text in bytes (works with historical models)."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    from lifecycle.functions import OctetLength

    return OctetLength(Cast("payload", output_field=TextField()))


def payload_batch(queryset, last: int, *, max_items: int, max_bytes: int) -> list[int]:
    """The ids of the next batch of `queryset` after id `last`, in id order: at most
    `max_items`, and after the first, as many as keep their payloads' stored text within
    `max_bytes` (the data migrations that read payloads hold a batch in memory several times
    over). Works with historical models."""
    rows = (queryset.filter(pk__gt=last).order_by("pk").annotate(stored_size=stored_payload_size())
            .values_list("pk", "stored_size")[:max_items])
    ids: list[int] = []
    total = 0
    for pk, size in rows:
        if ids and total + (size or 0) > max_bytes:
            break
        ids.append(pk)
        total += size or 0
    return ids
