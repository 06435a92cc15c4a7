"""A tool payload with a field of its own named like the removal marker (`retention`): written
and kept whole, skipped by cleanup as `reserved_field`, never shown as removed. Only a value
shaped as a marker is refused (a runtime cannot claim a removal that did not happen)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from console.models import ApiToken
from lifecycle.models import Item
from retention import service
from retention.models import OperationState, ToolPayloadPolicy
from retention.reducer import MARKER_KEY, Skip, encode
from tests import factories
from tests.test_tool_payload_jobs import age, enable, run

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
OWN = {"url": "https://example.test/policy", "method": "GET", "status": 200, MARKER_KEY: "30 days",
       "response": "ok " * 2000}


@pytest.fixture
def runtime(admin_user) -> Client:
    _token, raw = ApiToken.issue(admin_user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def items_url(conversation) -> str:
    return f"/v1/threads/{conversation.public_id}/items"


def test_a_payload_with_its_own_retention_field_is_written_and_kept_whole(runtime, conversation, admin_client):
    answer = runtime.post(items_url(conversation), content_type="application/json", data=json.dumps(
        {"role": "tool", "tool_kind": "http", "tool_call_id": "call_own", "status": "completed", "payload": OWN}))
    assert answer.status_code == 201, answer.content
    item = Item.objects.get(conversation=conversation, tool_call_id="call_own")
    assert item.payload == OWN
    assert (item.payload_skip, item.removable_bytes, item.removal_plan) == (Skip.RESERVED_FIELD, 0, None)
    assert item.payload_bytes == len(encode(OWN))
    # An update with such a field lands too, and an object there is kept as sent.
    own = {**OWN, MARKER_KEY: {"days": 30}, "status": 201}
    patched = runtime.patch(f"{items_url(conversation)}/{item.pk}", content_type="application/json",
                            data=json.dumps({"payload": own, "revision": item.revision}))
    assert patched.status_code == 200, patched.content
    assert Item.objects.get(pk=item.pk).payload == own
    # Shown as it is: not "Tool details removed", the full output still answers.
    output = runtime.get(f"{items_url(conversation)}/{item.pk}/output")
    assert output.status_code == 200 and "ok ok" in output.json()["output"]
    page = admin_client.get(f"/conversations/{conversation.public_id}/", HTTP_HOST="127.0.0.1")  # a screen: the session
    assert page.status_code == 200 and "Tool details removed" not in page.content.decode()


def test_only_a_value_shaped_as_a_marker_is_refused(runtime, conversation):
    forged = {"version": 1, "removed_at": "2026-01-01T00:00:00Z", "removed_fields": ["response"], "removed_bytes": 5}
    item = factories.add_tool(conversation, "http", {"url": "https://example.test", "response": "x" * 500})
    for write in (
        lambda: runtime.post(items_url(conversation), content_type="application/json", data=json.dumps(
            {"role": "tool", "tool_kind": "http", "payload": {"url": "u", MARKER_KEY: forged}})),
        lambda: runtime.patch(f"{items_url(conversation)}/{item.pk}", content_type="application/json",
                              data=json.dumps({"payload": {"url": "u", MARKER_KEY: forged}})),
    ):
        answer = write()
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_item")
    assert Item.objects.filter(conversation=conversation).count() == 1
    assert MARKER_KEY not in Item.objects.get(pk=item.pk).payload


def test_cleanup_leaves_such_an_item_whole_and_counts_it_as_reserved_field(admin_user):
    conversation = factories.make_conversation(title="own field")
    own = factories.add_tool(conversation, "http", OWN, tool_call_id="own")
    # (a null there is the tool's own field too)
    plain = factories.add_tool(conversation, "http", {**OWN, MARKER_KEY: None, "url": "u2"}, tool_call_id="plain")
    ordinary = factories.add_tool(conversation, "http", {k: v for k, v in OWN.items() if k != MARKER_KEY},
                                  tool_call_id="ordinary")
    age(conversation, 200)
    before = Item.objects.get(pk=own.pk)
    enable(admin_user)
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert json.loads(analysis.skipped_json).get("reserved_field") == 2
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert op.state == OperationState.SUCCEEDED and op.removed_messages == 1
    assert json.loads(op.skipped_json).get("reserved_field") == 2
    after = Item.objects.get(pk=own.pk)
    assert (after.payload, after.revision, after.details_removed_at) == (before.payload, before.revision, None)
    assert Item.objects.get(pk=plain.pk).payload[MARKER_KEY] is None
    reduced = Item.objects.get(pk=ordinary.pk)
    assert "response" not in reduced.payload and reduced.payload[MARKER_KEY]["removed_fields"] == ["response"]
