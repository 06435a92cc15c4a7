"""Removed tool details stay removed: late updates, replayed calls, the full output, the transcript."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.test import Client

from console.models import ApiToken
from console.viewer import BROWSER_COOKIE
from lifecycle.actions.append_item import append_item
from lifecycle.actions.update_item import update_item
from lifecycle.errors import ActionRefused
from lifecycle.models import Conversation, Item
from retention.reducer import MARKER_KEY, Skip, encoded_size, reduce_item_row
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
REMOVED_AT = datetime(2026, 1, 15, 23, 30, 5, tzinfo=UTC)
SECRET = "SECRET-OUTPUT-" + "x" * 1500


@pytest.fixture
def runtime(admin_user) -> Client:
    _token, raw = ApiToken.issue(admin_user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def reduced_item(conversation, **kw) -> Item:
    """A tool item as cleanup leaves it: the contract's reduce_item_row values, written directly."""
    item = factories.add_tool(conversation, payload={"command": "make test", "cwd": "/w", "exit_code": 2,
                                                     "stdout": SECRET, "stderr": ""}, status="running", **kw)
    row = reduce_item_row(item, removed_at=REMOVED_AT)
    assert Item.objects.filter(pk=item.pk, revision=item.revision).update(**row) == 1
    return Item.objects.get(pk=item.pk)


def late_payload() -> dict:
    return {"command": "make test", "cwd": "/w", "exit_code": 0, "stdout": SECRET, "stderr": "late"}


def assert_still_removed(item: Item, before: Item) -> None:
    stored = Item.objects.get(pk=item.pk)
    assert stored.payload[MARKER_KEY] == before.payload[MARKER_KEY]
    assert "stdout" not in stored.payload and "stderr" not in stored.payload
    assert SECRET not in json.dumps(stored.payload)
    assert (stored.payload_skip, stored.removable_bytes) == (Skip.ALREADY_REMOVED, 0)
    assert stored.payload_bytes == encoded_size(stored.payload)
    assert stored.details_removed_at == REMOVED_AT


def test_a_late_update_through_the_api_lands_but_the_details_stay_removed(runtime, conversation):
    item = reduced_item(conversation)
    response = runtime.patch(f"/v1/threads/{conversation.public_id}/items/{item.pk}", content_type="application/json",
                             data=json.dumps({"status": "completed", "title": "Tests ran", "payload": late_payload()}))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["title"], body["revision"]) == ("completed", "Tests ran", item.revision + 1)
    assert "stdout" not in body["payload"] and body["payload"][MARKER_KEY] == item.payload[MARKER_KEY]
    stored = Item.objects.get(pk=item.pk)
    assert (stored.status, stored.title, stored.payload["exit_code"]) == ("completed", "Tests ran", 0)
    assert_still_removed(item, item)


def test_a_late_update_through_the_orm_action_lands_but_the_details_stay_removed(conversation):
    item = reduced_item(conversation)
    updated = update_item(item, status="failed", payload=late_payload())
    assert updated.status == "failed"
    assert_still_removed(item, item)
    # A payload that is not an object leaves the reduced payload as it is.
    update_item(item, title="again", payload="raw text")
    stored = Item.objects.get(pk=item.pk)
    assert stored.title == "again" and stored.payload["exit_code"] == 0
    assert_still_removed(item, item)


def test_a_late_update_with_the_revision_before_the_removal_lands_but_not_after_another_write(conversation):
    item = reduced_item(conversation)  # the runtime knew revision 1; cleanup made it 2
    known = item.revision - 1
    updated = update_item(item, status="completed", revision=known, payload=late_payload())
    assert (updated.status, updated.revision) == ("completed", item.revision + 1)
    assert_still_removed(item, item)
    # Now a real write happened since revision 1: that revision is stale as usual
    with pytest.raises(ActionRefused) as stale:
        update_item(item, title="late again", revision=known)
    assert stale.value.code == "stale_revision"
    assert Item.objects.get(pk=item.pk).title != "late again"
    # and a revision older than the one before the removal is stale too
    other = reduced_item(conversation, tool_call_id="call_other")
    with pytest.raises(ActionRefused):
        update_item(other, status="failed", revision=other.revision - 2)


def test_a_late_update_sent_again_after_its_answer_was_lost_changes_nothing(runtime, conversation):
    """r122: the late update of a reduced item, sent again with the revision its runtime knew
    (the first answer lost), was refused as stale. What it would store is stored already (its
    status, and a payload whose removed details stay out): the item as it is, no new revision;
    a resend that differs is still stale, and the details never come back."""
    item = reduced_item(conversation)
    url = f"/v1/threads/{conversation.public_id}/items/{item.pk}"
    body = json.dumps({"status": "completed", "payload": late_payload(), "revision": item.revision - 1})
    first = runtime.patch(url, content_type="application/json", data=body)
    assert (first.status_code, first.json()["revision"]) == (200, item.revision + 1)
    landed = Item.objects.get(pk=item.pk)
    again = runtime.patch(url, content_type="application/json", data=body)
    assert again.status_code == 200, again.content
    assert again.json() == first.json() and "stdout" not in again.json()["payload"]
    stored = Item.objects.get(pk=item.pk)
    assert (stored.status, stored.revision, stored.updated_at) == ("completed", landed.revision, landed.updated_at)
    assert_still_removed(item, item)
    other = json.dumps({"status": "completed", "payload": {**late_payload(), "exit_code": 3},
                        "revision": item.revision - 1})
    stale = runtime.patch(url, content_type="application/json", data=other)
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_revision")
    assert Item.objects.get(pk=item.pk).payload == stored.payload
    assert_still_removed(item, item)


def test_an_update_cannot_smuggle_a_marker_or_restore_by_status_only(conversation):
    item = reduced_item(conversation)
    update_item(item, payload={**late_payload(), MARKER_KEY: {"version": 1, "removed_fields": []}})
    assert_still_removed(item, item)


def test_a_new_item_reusing_a_removed_call_id_is_refused_everywhere(runtime, conversation):
    item = reduced_item(conversation, tool_call_id="call_77")
    count = Item.objects.count()
    body = {"role": "tool", "tool_kind": "shell", "tool_call_id": "call_77", "status": "completed",
            "payload": late_payload()}
    response = runtime.post(f"/v1/threads/{conversation.public_id}/items", data=json.dumps(body),
                            content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (409, "tool_details_removed")
    with pytest.raises(ActionRefused) as refused:
        append_item(conversation, **body)
    assert (refused.value.code, refused.value.status) == ("tool_details_removed", 409)
    assert Item.objects.count() == count
    # Nor can the call come back as a message carrying its output, and the refusal leaves
    # the conversation's activity as it was (it would protect the conversation from cleanup).
    active = Conversation.objects.get(pk=conversation.pk).last_activity_at
    as_message = {"role": "assistant", "tool_call_id": "call_77", "content": f"the output was {SECRET}"}
    response = runtime.post(f"/v1/threads/{conversation.public_id}/items", data=json.dumps(as_message),
                            content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (409, "tool_details_removed")
    assert Item.objects.count() == count
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == active
    assert_still_removed(item, item)
    # Another call id, or the same one in another conversation, is a new call.
    assert append_item(conversation, **{**body, "tool_call_id": "call_78"}).payload["stdout"] == SECRET
    other = factories.make_conversation(title="Other")
    assert append_item(other, **body).payload_skip == ""


def test_the_full_output_is_gone_with_410(runtime, member_client, conversation):
    kept = factories.add_tool(conversation, tool_call_id="call_kept")
    item = reduced_item(conversation)
    ok = member_client.get(f"/v1/threads/{conversation.public_id}/items/{kept.pk}/output", **HOST)
    assert ok.status_code == 200 and ok.json() == {"id": kept.pk, "output": "x" * 2000}
    gone = member_client.get(f"/v1/threads/{conversation.public_id}/items/{item.pk}/output", **HOST)
    assert gone.status_code == 410
    assert gone.json() == {
        "code": "tool_details_removed",
        "message": "The details of this tool call were removed by the retention policy and cannot be restored.",
        "removed_at": "2026-01-15T23:30:05Z",
        "summary": {"command": "make test", "cwd": "/w", "exit_code": 2},
    }
    page = member_client.get(f"/conversations/{conversation.public_id}/items/{item.pk}/output/", **HOST)
    assert page.status_code == 410
    html = page.content.decode()
    assert "Tool details removed on Jan. 15, 2026" in html and "make test" in html and SECRET not in html
    assert member_client.get(f"/conversations/{conversation.public_id}/items/{kept.pk}/output/", **HOST).status_code == 200


def test_the_openapi_document_declares_the_refusals(member_client):
    doc = member_client.get("/v1/openapi.json", **HOST).json()
    assert "410" in doc["paths"]["/v1/threads/{public_id}/items/{item_id}/output"]["get"]["responses"]
    assert "409" in doc["paths"]["/v1/threads/{public_id}/items"]["post"]["responses"]


def test_the_transcript_shows_the_removal_date_in_the_viewers_zone_and_the_kept_summary(member_client, conversation):
    factories.add_message(conversation, content="Run the tests")
    item = reduced_item(conversation)
    Conversation.objects.filter(pk=conversation.pk).update(last_activity_at=REMOVED_AT)
    url = f"/conversations/{conversation.public_id}/"
    html = member_client.get(url, **HOST).content.decode()
    row = html[html.index(f'id="item-{item.pk}"'):]
    row = row[:row.index("</article>")]
    assert "Tool details removed on Jan. 15, 2026" in row
    assert "make test" in row and ">2<" in row  # command and exit code kept
    assert "Show full output" not in row and "item-output" not in row and SECRET not in html
    member_client.cookies[BROWSER_COOKIE] = "Asia/Tokyo"  # 08:30 the next day there
    assert "Tool details removed on Jan. 16, 2026" in member_client.get(url, **HOST).content.decode()
    spanish = member_client.get(url, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Los detalles de la herramienta se eliminaron el 16 de enero de 2026" in spanish
    assert "Se conservó el resumen de arriba" in spanish
