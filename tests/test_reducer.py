"""The tool payload reducer, per kind, with sizes checked against what the database stores."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from lifecycle.actions.append_item import append_item
from lifecycle.models import Item
from retention.reducer import (
    MARKER_KEY,
    MAX_PAYLOAD_BYTES,
    SQL_KINDS,
    Skip,
    apply,
    encode,
    encoded_size,
    marker_from_plan,
    measure,
    normalize,
    plan,
    plan_text,
    reduce_item_row,
    removed_at_text,
)
from tests import factories

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BIG = "x" * 400
CJK = "漢字かな交じり文" * 125  # 1,000 characters, 3 bytes each in UTF-8

# kind -> (payload, fields kept, fields removed)
CASES = {
    "shell": ({"command": "make", "cwd": "/w", "exit_code": 2, "truncated": False, "stdout": BIG, "stderr": ""},
              {"command", "cwd", "exit_code", "truncated"}, ["stderr", "stdout"]),  # in key order
    "read_file": ({"path": "p", "range": [1, 2], "line_count": 2, "content": BIG},
                  {"path", "range", "line_count"}, ["content"]),
    "edit_file": ({"changes": [{"path": "a.py", "change_type": "modify", "start_line": 3, "end_line": 9,
                                "old_content": BIG, "new_content": "", "diff": "-old\n+new"}]},
                  {"changes"}, ["changes[0].diff", "changes[0].new_content", "changes[0].old_content"]),
    "search": ({"query": "q", "scope": "s", "file_count": 1, "matches": [BIG]},
               {"query", "scope", "file_count"}, ["matches"]),
    "http": ({"url": "https://x.test/a", "method": "GET", "status": 200, "response": BIG},
             {"url", "method", "status"}, ["response"]),
    "generic": ({"tool_name": "t", "input": {"a": 1}, "output": BIG}, {"tool_name"}, ["input", "output"]),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_keeps_its_summary_and_lists_every_removed_field(kind):
    payload, kept, removed = CASES[kind]
    reduced, result = apply(kind, payload, removed_at=NOW)
    assert set(reduced) - {MARKER_KEY} == kept
    assert reduced[MARKER_KEY] == {
        "version": 1, "removed_at": "2026-11-30T12:00:00Z", "removed_fields": removed,
        "removed_bytes": sum(len(encode(v).encode()) for v in _removed_values(kind, payload)),
    }
    assert result.removed_fields == tuple(removed)
    assert result.removed_bytes == encoded_size(payload) - encoded_size(reduced) > 0
    assert BIG not in json.dumps(reduced)
    # Idempotent: a reduced payload is never reduced again.
    assert plan(kind, reduced).skip == Skip.ALREADY_REMOVED


def _removed_values(kind, payload):
    if kind == "edit_file":
        return [c[f] for c in payload["changes"] for f in ("old_content", "new_content", "diff") if f in c]
    fields = {"shell": ("stdout", "stderr"), "read_file": ("content",), "search": ("matches",),
              "http": ("response",), "generic": ("input", "output")}[kind]
    return [payload[f] for f in fields if f in payload]


def test_edit_changes_keep_paths_and_lines():
    payload, _, _ = CASES["edit_file"]
    reduced, _ = apply("edit_file", payload, removed_at=NOW)
    assert reduced["changes"] == [{"path": "a.py", "change_type": "modify", "start_line": 3, "end_line": 9}]


def test_unknown_fields_and_large_integers_are_kept_exactly():
    big = 123456789012345678901234567890
    payload = {"command": "x", "stdout": BIG, "runner": {"id": big, "tags": ["a"]}, "pid": 2**63 + 1}
    reduced, _ = apply("shell", payload, removed_at=NOW)
    assert reduced["runner"] == {"id": big, "tags": ["a"]} and reduced["pid"] == 2**63 + 1
    assert str(big) in encode(reduced)


def test_the_marker_has_a_fixed_width_whatever_the_time():
    payload = CASES["shell"][0]
    sizes = {encoded_size(apply("shell", payload, removed_at=at)[0])
             for at in (NOW, NOW.replace(month=1, day=1, hour=0), datetime(2031, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                        NOW.astimezone(__import__("zoneinfo").ZoneInfo("America/Bogota")))}
    assert len(sizes) == 1
    assert apply("shell", payload, removed_at=NOW + timedelta(microseconds=5))[0][MARKER_KEY]["removed_at"] == \
        "2026-11-30T12:00:00Z"


def test_a_payload_the_marker_would_outgrow_is_skipped_as_too_small():
    tiny = {"command": "true", "stdout": "y", "stderr": ""}
    assert plan("shell", tiny).skip == Skip.TOO_SMALL
    assert measure("shell", tiny) == (encoded_size(tiny), 0)
    with pytest.raises(ValueError, match="too_small"):
        apply("shell", tiny, removed_at=NOW)


def test_it_skips_what_it_must_not_reduce():
    assert plan("plan", {"steps": []}).skip == Skip.PROTECTED
    assert plan("monitor", {"x": 1}).skip == Skip.PROTECTED
    assert plan("generic", {"tool_name": "t", "output": {"rows": 3}}).skip == Skip.PROTECTED
    assert plan("shell", None).skip == Skip.NO_PAYLOAD
    assert plan("shell", {"command": "x"}).skip == Skip.NO_PAYLOAD
    assert plan("shell", "not an object").skip == Skip.MALFORMED
    assert plan("shell", [1, 2]).skip == Skip.MALFORMED
    marker = {"version": 1, "removed_at": "2026-01-01T00:00:00Z", "removed_fields": ["stdout"], "removed_bytes": 9}
    assert plan("shell", {MARKER_KEY: marker, "command": "x"}).skip == Skip.ALREADY_REMOVED
    # The tool's own field of that name: kept whole (a marker would replace it), never "removed"
    for own in ({}, "30 days", {"days": 30}, {**marker, "extra": 1}, {**marker, "version": "1"}):
        assert plan("shell", {MARKER_KEY: own, "command": "x", "stdout": BIG}).skip == Skip.RESERVED_FIELD, own
    assert plan("teleport", {"x": 1}).skip == Skip.UNSUPPORTED
    assert plan("edit_file", {"changes": "nope"}).skip == Skip.MALFORMED
    assert plan("edit_file", {"changes": ["nope"], "content": BIG}).skip == Skip.MALFORMED
    assert plan("shell", {"command": "x", "stdout": "a" * 100}, size=MAX_PAYLOAD_BYTES + 1).skip == Skip.OVERSIZE
    for skip in (Skip.PROTECTED, Skip.NO_PAYLOAD, Skip.MALFORMED, Skip.TOO_SMALL):
        assert skip in Skip.ALL


def test_normalize_gives_what_postgresql_jsonb_gives_back_on_every_engine():
    value = {"a": 1e16, "b": 1.5e-07, "c": 1.0, "d": -0.0, "e": 10**30, "f": [0.1, True, None, "1e16"]}
    for vendor in ("sqlite", "postgresql"):  # the same payload is stored alike on both
        assert encode(normalize(value, vendor=vendor)) == encode({
            "a": 10**16, "b": 1.5e-07, "c": 1.0, "d": 0.0, "e": 10**30, "f": [0.1, True, None, "1e16"]})
        assert isinstance(normalize(1e16, vendor=vendor), int)
        assert encode(normalize(-0.0, vendor=vendor)) == "0.0"


# ---- Stored sizes: what the database holds and gives back ----------------------------------


def _stored_text_bytes(item_id: int) -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT payload::text FROM lifecycle_item WHERE id = %s", [item_id])
            return len(json.dumps(json.loads(cursor.fetchone()[0]), separators=(",", ":"),
                                  ensure_ascii=False, sort_keys=True).encode())
        cursor.execute("SELECT LENGTH(CAST(payload AS BLOB)) FROM lifecycle_item WHERE id = %s", [item_id])
        return cursor.fetchone()[0]


def _write_reduced(item: Item) -> dict:
    """What cleanup writes (the contract's reduce_item_row values), with the revision check."""
    row = reduce_item_row(item, removed_at=NOW)
    assert row is not None
    assert Item.objects.filter(pk=item.pk, revision=item.revision).update(**row) == 1
    return row


STORED_CASES = {
    **{kind: payload for kind, (payload, _, _) in CASES.items()},
    "cjk": {"command": "cat", "stdout": CJK, "stderr": "エラー", "note": "日本語のメモ"},
    "numbers": {"command": "bench", "exit_code": 0, "stdout": BIG, "took": 1e16, "ratio": 1.5e-07, "one": 1.0,
                "neg": -0.0, "big": 123456789012345678901234567890, "tiny": 5e-324},
    "unknown": {"command": "x", "stdout": BIG, "extra": {"nested": [1, {"deep": "ü"}]}},
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(STORED_CASES))
def test_stored_bytes_and_the_reduction_are_exact_on_the_database(conversation, name):
    payload = STORED_CASES[name]
    kind = name if name in CASES else "shell"
    item = append_item(conversation, role="tool", tool_kind=kind, tool_call_id="call_" + name, payload=payload)
    stored = Item.objects.get(pk=item.pk)
    # The database stores exactly the canonical form, and the figures are measured on it.
    assert stored.payload == item.payload
    assert stored.payload_bytes == encoded_size(stored.payload) == _stored_text_bytes(item.pk)
    assert stored.payload_skip == ""
    reduced_preview, result = apply(kind, stored.payload, removed_at=NOW)
    assert stored.removable_bytes == result.removed_bytes == encoded_size(stored.payload) - encoded_size(reduced_preview)

    row = _write_reduced(stored)
    after = Item.objects.get(pk=item.pk)
    assert after.payload == row["payload"] == reduced_preview
    assert after.payload_bytes == _stored_text_bytes(item.pk) == stored.payload_bytes - stored.removable_bytes
    assert (after.removable_bytes, after.payload_skip, after.revision) == (0, Skip.ALREADY_REMOVED, stored.revision + 1)
    assert after.details_removed_at == NOW
    # Idempotent on the stored row: nothing more to remove.
    assert reduce_item_row(after, removed_at=NOW + timedelta(days=1)) is None
    assert plan(kind, after.payload).skip == Skip.ALREADY_REMOVED


@pytest.mark.django_db
def test_cjk_text_is_stored_without_escapes(conversation):
    payload = {"command": "cat", "stdout": CJK}
    item = append_item(conversation, role="tool", tool_kind="shell", payload=payload)
    assert encoded_size(CJK) == 3002
    assert Item.objects.get(pk=item.pk).payload_bytes == _stored_text_bytes(item.pk) == encoded_size(payload)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT payload FROM lifecycle_item WHERE id = %s", [item.pk])
            assert cursor.fetchone()[0] == encode(payload)


@pytest.mark.django_db
def test_1e16_is_measured_as_the_database_gives_it_back_and_stored_alike_on_both_engines(conversation):
    item = append_item(conversation, role="tool", tool_kind="shell", payload={"stdout": BIG, "n": 1e16, "z": -0.0})
    stored = Item.objects.get(pk=item.pk)
    assert stored.payload["n"] == 10**16 and type(stored.payload["n"]) is int  # what jsonb gives back
    assert encode(stored.payload["z"]) == "0.0"
    assert stored.payload_bytes == encoded_size(stored.payload) == _stored_text_bytes(item.pk)


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "payload", "skip"), [
    ("shell", {"command": "true", "stdout": "y"}, Skip.TOO_SMALL),
    ("shell", "just text", Skip.MALFORMED),
    ("edit_file", {"changes": [1, 2]}, Skip.MALFORMED),
    ("plan", {"steps": [BIG]}, Skip.PROTECTED),
    ("shell", {"command": "ls"}, Skip.NO_PAYLOAD),
    ("shell", None, Skip.NO_PAYLOAD),
])
def test_skipped_items_store_their_reason_and_nothing_removable(conversation, kind, payload, skip):
    item = append_item(conversation, role="tool", tool_kind=kind, payload=payload)
    stored = Item.objects.get(pk=item.pk)
    assert (stored.payload_skip, stored.removable_bytes) == (skip, 0)
    assert reduce_item_row(stored, removed_at=NOW) is None


@pytest.mark.django_db
def test_oversize_payloads_are_skipped(conversation, settings):
    payload = {"command": "cat", "stdout": "z" * (MAX_PAYLOAD_BYTES + 10)}
    item = append_item(conversation, role="tool", tool_kind="shell", payload=payload)
    stored = Item.objects.only("payload_skip", "removable_bytes", "payload_bytes").get(pk=item.pk)
    assert (stored.payload_skip, stored.removable_bytes) == (Skip.OVERSIZE, 0)
    assert stored.payload_bytes == encoded_size(payload)


@pytest.mark.django_db
def test_messages_that_are_not_tool_items_have_no_skip_reason(conversation):
    item = factories.add_message(conversation)
    stored = Item.objects.get(pk=item.pk)
    assert (stored.payload_skip, stored.payload_bytes, stored.removable_bytes) == ("", 0, 0)
    assert reduce_item_row(stored, removed_at=NOW) is None


@pytest.mark.django_db
def test_seeded_items_store_exact_figures_and_skip_reasons(tmp_path):
    from lifecycle.enginefs import EngineHome
    from lifecycle.seeding import Seeder
    from retention.reducer import measure_item

    home = tmp_path / "seed-engine"
    home.mkdir()
    Seeder(seed=3, anchor=NOW, messages=30, home=EngineHome(home)).run(8)
    tools = list(Item.objects.filter(role="tool"))
    assert tools
    for item in tools:
        assert (item.payload_bytes, item.removable_bytes, item.payload_skip) == \
            measure_item(item.tool_kind, item.payload), item.pk
        assert item.payload_bytes == _stored_text_bytes(item.pk)
    assert {i.payload_skip for i in tools} >= {"", Skip.PROTECTED}
    assert set(Item.objects.exclude(role="tool").values_list("payload_skip", flat=True)) == {""}


@pytest.mark.django_db
def test_an_update_recomputes_the_stored_figures(conversation):
    from lifecycle.actions.update_item import update_item

    item = append_item(conversation, role="tool", tool_kind="shell", payload={"command": "x", "stdout": BIG})
    assert Item.objects.get(pk=item.pk).payload_skip == ""
    update_item(item, payload={"command": "x", "stdout": "1"})
    stored = Item.objects.get(pk=item.pk)
    assert (stored.payload_skip, stored.removable_bytes, stored.payload_bytes) == (
        Skip.TOO_SMALL, 0, encoded_size({"command": "x", "stdout": "1"}))
    update_item(item, payload={"command": "x", "stdout": CJK})
    stored = Item.objects.get(pk=item.pk)
    assert stored.payload_skip == "" and stored.payload_bytes == _stored_text_bytes(item.pk)
    assert stored.removable_bytes == plan("shell", stored.payload).removed_bytes > 2800


@pytest.mark.parametrize("kind", sorted(SQL_KINDS))
def test_the_marker_built_from_a_stored_plan_is_the_reducers_byte_for_byte(kind):
    payload = CASES[kind][0]
    reduced, result = apply(kind, payload, removed_at=NOW)
    stored = plan_text(kind, result)
    marker, fields = marker_from_plan(stored, removed_at_text(NOW))
    assert marker == encode(reduced[MARKER_KEY])
    assert fields == list(result.removed_fields)


def test_edit_file_stores_no_plan_it_is_reduced_in_python():
    payload = CASES["edit_file"][0]
    assert plan_text("edit_file", plan("edit_file", payload)) is None


@pytest.mark.parametrize("stored", [
    "", "null", "[]", '{"removed_bytes": 5, "removed_fields": ["stdout"]}',  # not canonical
    '{"removed_bytes":"5","removed_fields":["stdout"]}', '{"removed_bytes":5,"removed_fields":"stdout"}',
    '{"removed_bytes":5,"removed_fields":["a.b"]}', '{"removed_bytes":5,"removed_fields":["x"],"more":1}',
    '{"removed_fields":["stdout"],"removed_bytes":5}', '{"removed_bytes":true,"removed_fields":["stdout"]}',
    '{"removed_bytes":-5,"removed_fields":["stdout"]}', '{"removed_bytes":05,"removed_fields":["stdout"]}',
    '{"removed_bytes":5.0,"removed_fields":["stdout"]}', '{"removed_bytes":5,"removed_fields":["\\u0073tdout"]}',
    '{"removed_bytes":5,"removed_fields":["stdout"]}\n', '{"removed_bytes":5,"removed_fields":[""]}',
    '{"removed_bytes":5,"removed_fields":["stdöut"]}', '{"removed_bytes":5,"removed_fields":["stdout",]}',
    '{"removed_bytes":5,"removed_bytes":6,"removed_fields":["stdout"]}', None,
    '{"removed_bytes":5,"removed_fields":["std\x00out"]}', '{"removed_bytes":5,"removed_fields":["\ud800"]}',
    '{"removed_bytes":5,"removed_fields":["stdout"]}\x00', '{"removed_bytes":' + "9" * 5000 + ',"removed_fields":["stdout"]}',
])
def test_a_stored_plan_that_is_not_one_is_refused(stored):
    with pytest.raises(ValueError):
        marker_from_plan(stored, removed_at_text(NOW))
