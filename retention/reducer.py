"""The tool payload reducer: which parts of a tool payload cleanup removes, and their size.

Kept always: the item's content, title, status and tool_call_id, and every payload field
not named below. Removed, by kind: the bulky details (output, file contents, diffs,
responses). A reduced payload carries a marker under MARKER_KEY with the version, the
time, the removed field names and the removed byte count; never the removed text or a
hash of it. One function, `plan`, serves both the write path (to store `removable_bytes`
when an item is written, so analysis is a sum) and the cleanup (to rewrite the payload).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MARKER_KEY = "retention"
MARKER_VERSION = 1
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

PROTECTED_KINDS = frozenset({"plan", "todo", "subagent_task", "background_work", "monitor"})

# kind -> top-level fields removed
REMOVED_FIELDS: dict[str, tuple[str, ...]] = {
    "shell": ("stdout", "stderr"),
    "read_file": ("content",),
    "edit_file": ("content",),
    "search": ("matches",),
    "http": ("response",),
    "generic": ("input", "output"),
}
# edit_file: per entry of "changes"
EDIT_CHANGE_FIELDS = ("old_content", "new_content", "diff")


class Skip:
    OVERSIZE = "oversize"
    MALFORMED = "malformed"
    ALREADY_REMOVED = "already_removed"
    UNSUPPORTED = "unsupported"
    NO_PAYLOAD = "no_payload"
    PROTECTED = "protected"

    ALL = (OVERSIZE, MALFORMED, ALREADY_REMOVED, UNSUPPORTED, NO_PAYLOAD, PROTECTED)


def encode(value: Any) -> str:
    """The canonical JSON form sizes are measured in."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def encoded_size(value: Any) -> int:
    return len(encode(value).encode())


@dataclass(frozen=True)
class Plan:
    removed_fields: tuple[str, ...] = ()
    removed_bytes: int = 0
    skip: str | None = None


def plan(kind: str, payload: Any, *, size: int | None = None) -> Plan:
    if payload is None or payload == {}:
        return Plan(skip=Skip.NO_PAYLOAD)
    if not isinstance(payload, dict):
        return Plan(skip=Skip.MALFORMED)
    if MARKER_KEY in payload:
        return Plan(skip=Skip.ALREADY_REMOVED)
    if kind in PROTECTED_KINDS:
        return Plan(skip=Skip.PROTECTED)
    if kind not in REMOVED_FIELDS:
        return Plan(skip=Skip.UNSUPPORTED)
    if (size if size is not None else encoded_size(payload)) > MAX_PAYLOAD_BYTES:
        return Plan(skip=Skip.OVERSIZE)
    if kind == "generic" and isinstance(payload.get("output"), dict | list):
        return Plan(skip=Skip.PROTECTED)

    removed: list[str] = []
    total = 0
    for name in REMOVED_FIELDS[kind]:
        if name in payload and payload[name] not in (None, ""):
            removed.append(name)
            total += encoded_size(payload[name])
    if kind == "edit_file":
        changes = payload.get("changes")
        if changes is not None and not isinstance(changes, list):
            return Plan(skip=Skip.MALFORMED)
        for index, change in enumerate(changes or []):
            if not isinstance(change, dict):
                return Plan(skip=Skip.MALFORMED)
            for name in EDIT_CHANGE_FIELDS:
                if change.get(name) not in (None, ""):
                    removed.append(f"changes[{index}].{name}")
                    total += encoded_size(change[name])
    if not removed:
        return Plan(skip=Skip.NO_PAYLOAD)
    return Plan(removed_fields=tuple(removed), removed_bytes=total)


def apply(kind: str, payload: dict[str, Any], *, removed_at: datetime) -> tuple[dict[str, Any], Plan]:
    """The reduced payload. Raises ValueError when the plan says to skip."""
    result = plan(kind, payload)
    if result.skip:
        raise ValueError(result.skip)
    reduced = {k: v for k, v in payload.items() if k not in REMOVED_FIELDS[kind]}
    if kind == "edit_file" and isinstance(payload.get("changes"), list):
        reduced["changes"] = [
            {k: v for k, v in change.items() if k not in EDIT_CHANGE_FIELDS} for change in payload["changes"]
        ]
    reduced[MARKER_KEY] = {
        "version": MARKER_VERSION,
        "removed_at": removed_at.isoformat(),
        "removed_fields": list(result.removed_fields),
        "removed_bytes": result.removed_bytes,
    }
    return reduced, result


def measure(kind: str, payload: Any, *, encoded: str | None = None) -> tuple[int, int]:
    """(payload_bytes, removable_bytes) for an item about to be written.

    `encoded` is the payload's `encode()` form when the caller already has it.
    """
    if payload is None:
        return 0, 0
    size = len((encoded if encoded is not None else encode(payload)).encode())
    return size, plan(kind, payload, size=size).removed_bytes
