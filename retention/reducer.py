"""The tool payload reducer: which parts of a tool payload cleanup removes, and their size.

Kept always: the item's content, title, status and tool_call_id, and every payload field
not named below (unknown fields too). Removed, by kind: the bulky details (output, file
contents, diffs, responses), every one of them that is present, empty or not. A reduced
payload carries a marker under MARKER_KEY with the version, the removal time (fixed-width
UTC, seconds), every removed field name (in key order) and the byte size of the removed values; never the
removed text or a hash of it.

Sizes are the canonical form (`encode`: compact, sorted keys, UTF-8, no escapes), which is
also what the database stores (see `lifecycle.models.CanonicalJSONField`), but for one
order: on SQLite cleanup writes the marker as the reduced payload's last key (as json_set
adds a key; r34), the same bytes, so every size holds, and the next write sorts it. A reduction is
the canonical size before minus the canonical size after, marker included; when that is not
positive the item is skipped as `too_small`. One function, `plan`, serves the write path (to
store `removable_bytes` and `payload_skip` when an item is written, so analysis is a sum)
and the cleanup (`apply`, `reduce_item_row`), so the estimate equals the removal to the byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

MARKER_KEY = "retention"
MARKER_VERSION = 1
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
REMOVED_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # fixed width: the marker's size is known at write time

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
# Any time gives the marker's size: every removed_at renders to the same width.
_SIZING_TIME = datetime(2000, 1, 1, tzinfo=UTC)


class Skip:
    OVERSIZE = "oversize"
    MALFORMED = "malformed"
    ALREADY_REMOVED = "already_removed"
    UNSUPPORTED = "unsupported"
    NO_PAYLOAD = "no_payload"
    PROTECTED = "protected"
    TOO_SMALL = "too_small"
    # A payload with a field of its own under MARKER_KEY: kept whole (its marker would replace it).
    RESERVED_FIELD = "reserved_field"

    ALL = (OVERSIZE, MALFORMED, ALREADY_REMOVED, UNSUPPORTED, NO_PAYLOAD, PROTECTED, TOO_SMALL, RESERVED_FIELD)


_MARKER_FIELDS = frozenset({"version", "removed_at", "removed_fields", "removed_bytes"})


def is_marker(value: Any) -> bool:
    """Whether `value`, found under MARKER_KEY, is a removal marker (its four fields, of their
    types), not a payload field of the same name that a tool reported. A runtime may send the
    latter (it is kept, and the item is skipped as `reserved_field`), never the former."""
    return (
        isinstance(value, dict)
        and value.keys() == _MARKER_FIELDS
        and type(value["version"]) is int
        and isinstance(value["removed_at"], str)
        and isinstance(value["removed_fields"], list)
        and type(value["removed_bytes"]) is int
    )


def encode(value: Any) -> str:
    """The canonical JSON form sizes are measured in, and the form the database stores."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def encoded_size(value: Any) -> int:
    return len(encode(value).encode())


class CanonicalEncoder(json.JSONEncoder):
    """A JSON encoder that always writes the canonical form, whatever json.dumps asks for."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.update(ensure_ascii=False, separators=(",", ":"), sort_keys=True, indent=None)
        super().__init__(**kwargs)


def _numeric_float(value: float) -> Any:
    # PostgreSQL's jsonb keeps a number as `numeric` and prints it in fixed point with the
    # scale of its input: 1e+16 comes back as the integer 10000000000000000, 1.5e-07 as
    # 0.00000015 (a float again), -0.0 as 0.0. Python's repr is what json.dumps sends.
    text = format(Decimal(repr(value)), "f")
    if text.startswith("-") and Decimal(text) == 0:
        text = text[1:]
    return json.loads(text)


def normalize(value: Any, *, vendor: str = "") -> Any:
    """The value stored for `value`, and given back (sizes are measured on it): the same on
    every engine, so the same payload is stored alike on SQLite and PostgreSQL.

    PostgreSQL's jsonb changes only numbers written with a fraction or an exponent (floats);
    integers of any size keep every digit. SQLite would keep the text as sent (-0.0, 1e16),
    so it gets the form PostgreSQL gives back. (`vendor` is kept for callers; it changes
    nothing.)
    """
    if isinstance(value, float):
        return _numeric_float(value)
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def removed_at_text(removed_at: datetime) -> str:
    return removed_at.astimezone(UTC).strftime(REMOVED_AT_FORMAT)


@dataclass(frozen=True)
class Plan:
    removed_fields: tuple[str, ...] = ()
    removed_bytes: int = 0  # the reduction: canonical size before minus after, marker included
    detail_bytes: int = 0  # the canonical size of the removed values alone (the marker's figure)
    skip: str | None = None


def _strip(kind: str, payload: dict[str, Any]) -> tuple[dict[str, Any], list[str], int] | str:
    """The payload without its details, the removed field names and their size; or a skip."""
    removed: list[str] = []
    detail = 0
    drop = REMOVED_FIELDS[kind]
    reduced = {}
    # In key order, as stored: the marker lists the same names whatever order a writer sent.
    for name, value in sorted(payload.items()):
        if name in drop:
            removed.append(name)
            detail += encoded_size(value)
        else:
            reduced[name] = value
    if kind == "edit_file" and "changes" in payload:
        changes = payload["changes"]
        if changes is None:
            return reduced, removed, detail
        if not isinstance(changes, list):
            return Skip.MALFORMED
        kept_changes = []
        for index, change in enumerate(changes):
            if not isinstance(change, dict):
                return Skip.MALFORMED
            kept = {}
            for name, value in sorted(change.items()):
                if name in EDIT_CHANGE_FIELDS:
                    removed.append(f"changes[{index}].{name}")
                    detail += encoded_size(value)
                else:
                    kept[name] = value
            kept_changes.append(kept)
        reduced["changes"] = kept_changes
    return reduced, removed, detail


def _marker(removed_at: datetime, removed: list[str], detail: int) -> dict[str, Any]:
    return {
        "version": MARKER_VERSION,
        "removed_at": removed_at_text(removed_at),
        "removed_fields": removed,
        "removed_bytes": detail,
    }


def _reduce(kind: str, payload: Any, size: int | None, removed_at: datetime) -> tuple[Plan, dict[str, Any] | None]:
    if payload is None or payload == {}:
        return Plan(skip=Skip.NO_PAYLOAD), None
    if not isinstance(payload, dict):
        return Plan(skip=Skip.MALFORMED), None
    if MARKER_KEY in payload:
        return Plan(skip=Skip.ALREADY_REMOVED if is_marker(payload[MARKER_KEY]) else Skip.RESERVED_FIELD), None
    if kind in PROTECTED_KINDS:
        return Plan(skip=Skip.PROTECTED), None
    if kind not in REMOVED_FIELDS:
        return Plan(skip=Skip.UNSUPPORTED), None
    if size is None:
        size = encoded_size(payload)
    if size > MAX_PAYLOAD_BYTES:
        return Plan(skip=Skip.OVERSIZE), None
    if kind == "generic" and isinstance(payload.get("output"), dict | list):
        return Plan(skip=Skip.PROTECTED), None
    stripped = _strip(kind, payload)
    if isinstance(stripped, str):
        return Plan(skip=stripped), None
    reduced, removed, detail = stripped
    if not removed:
        return Plan(skip=Skip.NO_PAYLOAD), None
    reduced[MARKER_KEY] = _marker(removed_at, removed, detail)
    reduction = size - encoded_size(reduced)
    if reduction <= 0:
        return Plan(skip=Skip.TOO_SMALL), None
    return Plan(removed_fields=tuple(removed), removed_bytes=reduction, detail_bytes=detail), reduced


def plan(kind: str, payload: Any, *, size: int | None = None) -> Plan:
    """What cleanup would remove from this payload now, or why it would skip it.

    `size` is the payload's canonical size when the caller already has it.
    """
    return _reduce(kind, payload, size, _SIZING_TIME)[0]


def apply(kind: str, payload: dict[str, Any], *, removed_at: datetime) -> tuple[dict[str, Any], Plan]:
    """The reduced payload and its plan. Raises ValueError(skip reason) when it must be skipped."""
    result, reduced = _reduce(kind, payload, None, removed_at)
    if result.skip or reduced is None:
        raise ValueError(result.skip)
    return reduced, result


def measure(kind: str, payload: Any, *, encoded: str | None = None) -> tuple[int, int]:
    """(payload_bytes, removable_bytes) for an item about to be written.

    `encoded` is the payload's `encode()` form when the caller already has it. The payload
    must already be the value the database gives back (`normalize`).
    """
    size, removable, _skip = measure_item(kind, payload, encoded=encoded)
    return size, removable


def measure_item(kind: str, payload: Any, *, encoded: str | None = None) -> tuple[int, int, str]:
    """(payload_bytes, removable_bytes, payload_skip) to store with a tool item."""
    size, removable, skip, _plan = item_figures(kind, payload, encoded=encoded)
    return size, removable, skip


def item_figures(kind: str, payload: Any, *, encoded: str | None = None) -> tuple[int, int, str, str | None]:
    """(payload_bytes, removable_bytes, payload_skip, removal_plan) to store with a tool item.

    `removal_plan` is the marker without its time (`plan_text`), or None when nothing would
    be removed: with it, cleanup rewrites the row in SQL without reading the payload.
    """
    if payload is None:
        return 0, 0, Skip.NO_PAYLOAD, None
    size = len((encoded if encoded is not None else encode(payload)).encode())
    result = plan(kind, payload, size=size)
    return size, result.removed_bytes, result.skip or "", plan_text(kind, result)


# Kinds whose removal is top-level fields only: cleanup rewrites them in SQL from the stored
# plan. edit_file also removes fields inside each entry of "changes", so it is reduced in Python.
SQL_KINDS = frozenset(REMOVED_FIELDS) - {"edit_file"}


def plan_text(kind: str, result: Plan) -> str | None:
    """The stored removal plan: the marker's figure and field names (canonical JSON), for a
    kind cleanup rewrites in SQL; None otherwise. Same revision, same payload: the plan is
    written with the payload it describes and cleared when the details are removed."""
    if result.skip or result.removed_bytes <= 0 or kind not in SQL_KINDS:
        return None
    return encode({"removed_bytes": result.detail_bytes, "removed_fields": list(result.removed_fields)})


# A stored plan in canonical form, exactly as plan_text writes it: compact, keys in order, a
# whole number of bytes (at most ten digits: a payload is at most MAX_PAYLOAD_BYTES), ASCII
# field names. Anything else (escapes, spaces, signs, other keys) does not match, and cleanup
# reduces that item from its payload in Python instead.
_PLAN = re.compile(r'\{"removed_bytes":(?:0|[1-9][0-9]{0,9}),"removed_fields":\[((?:"[A-Za-z_][A-Za-z0-9_]*"'
                   r'(?:,"[A-Za-z_][A-Za-z0-9_]*")*)?)\]\}')


def marker_from_plan(stored_plan: str, removed_at: str) -> tuple[str, list[str]]:
    """The marker cleanup writes for a stored plan and the fields it removes; `removed_at` is
    `removed_at_text(...)`. Equal, byte for byte, to the marker `apply` builds for the same
    payload and time. Raises ValueError when the stored text is not a plan in canonical form
    (one pattern, not a JSON parse: a batch checks a thousand plans)."""
    matched = _PLAN.fullmatch(stored_plan) if isinstance(stored_plan, str) else None
    if matched is None:
        raise ValueError("not a removal plan")
    fields = [name[1:-1] for name in matched.group(1).split(",")] if matched.group(1) else []
    # Canonical keys in order: removed_at < removed_bytes < removed_fields < version.
    return f'{{"removed_at":"{removed_at}",{stored_plan[1:-1]},"version":{MARKER_VERSION}}}', fields


def reduce_item_row(item: Any, *, removed_at: datetime) -> dict[str, Any] | None:
    """The column values cleanup writes for one reduced item, or None when it is skipped.

    `removed_at` is truncated to whole seconds, so the marker and `details_removed_at` agree.
    The caller writes these with a compare-and-swap on (id, revision). The item's `updated_at`
    records the change, as every write does (a client that compares it, or the revision, learns
    that the details are gone); the times the transcript shows (`created_at`) and the
    conversation's last activity are not touched (cleanup is not activity).
    """
    if getattr(item, "role", "tool") != "tool":
        return None
    removed_at = removed_at.astimezone(UTC).replace(microsecond=0)
    result, reduced = _reduce(item.tool_kind, item.payload, None, removed_at)
    if result.skip or reduced is None:
        return None
    return {
        "payload": reduced,
        "payload_bytes": encoded_size(reduced),
        "removable_bytes": 0,
        "payload_skip": Skip.ALREADY_REMOVED,
        "removal_plan": None,
        "details_removed_at": removed_at,
        "revision": item.revision + 1,
        "updated_at": removed_at,
        "client_key_digest": "",  # taken over the payload removed now (lifecycle.models.Item)
    }


def keep_details_removed(kind: str, payload: Any, marker: dict[str, Any]) -> dict[str, Any]:
    """An update's payload for an item whose details were removed: the fields cleanup removes
    are dropped, the rest applied, and the stored marker kept."""
    if not isinstance(payload, dict):
        payload = {}
    payload = {k: v for k, v in payload.items() if k != MARKER_KEY}
    if kind in REMOVED_FIELDS:
        stripped = _strip(kind, payload)
        if isinstance(stripped, str):  # malformed changes: drop them whole
            stripped = _strip(kind, {k: v for k, v in payload.items() if k != "changes"})
            assert not isinstance(stripped, str)
        payload = stripped[0]
    payload[MARKER_KEY] = marker
    return payload
