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
