from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.models import ApiToken
from lifecycle.models import Conversation, Item
from retention.reducer import MARKER_KEY, apply, encoded_size, plan
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


@pytest.fixture
def runtime(admin_user) -> Client:
    """The agent runtime: a token client with an admin's rights."""
    _token, raw = ApiToken.issue(admin_user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def post(client, conv, body, **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(f"/v1/threads/{conv.public_id}/items", data=data,
                       content_type=extra.pop("content_type", "application/json"), **extra)


def patch(client, conv, item, body):
    return client.patch(f"/v1/threads/{conv.public_id}/items/{item.pk}", data=json.dumps(body),
                        content_type="application/json")


def test_it_appends_an_item_and_marks_the_conversation_active_now(runtime):
    conv = factories.make_conversation(days_idle=200)
    factories.add_message(conv)
    Conversation.objects.filter(pk=conv.pk).update(last_activity_at=timezone.now() - timedelta(days=200))
    payload = {"command": "ls", "cwd": "/w", "exit_code": 0, "stdout": "a.txt\n" * 100}
    response = post(runtime, conv, {"role": "tool", "tool_kind": "shell", "tool_call_id": "call_9",
                                    "status": "running", "title": "List", "payload": payload})
    assert response.status_code == 201, response.content
    item = Item.objects.get(pk=response.json()["id"])
    assert (item.seq, item.tool_kind, item.tool_call_id, item.payload) == (2, "shell", "call_9", payload)
    assert item.payload_bytes == encoded_size(payload)
    reduced, _ = apply("shell", payload, removed_at=timezone.now())
    assert item.removable_bytes == encoded_size(payload) - encoded_size(reduced) == plan("shell", payload).removed_bytes
    assert item.payload_skip == ""
    conv.refresh_from_db()
    assert conv.last_activity_at > timezone.now() - timedelta(minutes=1)


def test_it_pages_items_in_order(member_client):
    conv = factories.make_conversation()
    for n in range(5):
        factories.add_message(conv, content=f"m{n}")
    first = member_client.get(f"/v1/threads/{conv.public_id}/items?limit=3", **HOST).json()
    assert [i["content"] for i in first["results"]] == ["m0", "m1", "m2"]
    assert set(first["results"][0]) >= {"id", "role", "tool_kind", "tool_call_id", "status", "title", "content", "payload"}
    rest = member_client.get(f"/v1/threads/{conv.public_id}/items?limit=3&after={first['next']}", **HOST).json()
    assert [i["content"] for i in rest["results"]] == ["m3", "m4"]
    assert rest["next"] is None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "malformed_json"),
        ([1, 2], 400, "invalid_body"),
        ({"role": "user", "content": "x", "colour": "red"}, 400, "unknown_field"),
        ({"content": "x"}, 400, "missing_field"),
        ({"role": "robot"}, 400, "invalid_choice"),
        ({"role": "user", "content": 5}, 400, "invalid_type"),
        ({"role": "user", "content": True}, 400, "invalid_type"),
        ({"role": "tool", "payload": {"a": 1}}, 400, "missing_field"),
        ({"role": "user", "payload": {"a": 1}}, 400, "invalid_item"),
        ({"role": "user", "title": "t" * 301}, 400, "too_long"),
        # a removal marker, forged (a field of the tool's own by that name is kept: test_reserved_field)
        ({"role": "tool", "tool_kind": "shell", "payload": {MARKER_KEY: {
            "version": 1, "removed_at": "2026-01-01T00:00:00Z", "removed_fields": ["stdout"], "removed_bytes": 9}}},
         400, "invalid_item"),
    ],
)
def test_it_refuses_bad_bodies_and_stores_nothing(runtime, conversation, body, status, code):
    response = post(runtime, conversation, body)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert Item.objects.filter(conversation=conversation).count() == 0


def test_it_refuses_oversized_bodies_and_wrong_media_types(runtime, conversation, settings):
    settings.API_MAX_BODY_BYTES = 1000
    big = post(runtime, conversation, {"role": "user", "content": "x" * 2000})
    assert (big.status_code, big.json()["code"]) == (413, "body_too_large")
    form = post(runtime, conversation, "role=user", content_type="application/x-www-form-urlencoded")
    assert (form.status_code, form.json()["code"]) == (415, "unsupported_media_type")
    assert Item.objects.count() == 0


def test_it_lets_members_read_but_not_write(member_client, conversation):
    response = post(member_client, conversation, {"role": "user", "content": "hi"})
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert Item.objects.count() == 0


def test_it_requires_csrf_for_browser_sessions(admin_user, conversation):
    browser = Client(enforce_csrf_checks=True, **HOST)
    browser.force_login(admin_user)
    response = post(browser, conversation, {"role": "user", "content": "hi"})
    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed"
    assert Item.objects.count() == 0


def test_it_answers_404_for_unknown_threads_and_items_and_stores_nothing(runtime, conversation):
    response = runtime.post("/v1/threads/c_unknown/items", data='{"role":"user"}', content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    other = factories.make_conversation()
    foreign = factories.add_message(other)
    assert patch(runtime, conversation, foreign, {"title": "x"}).status_code == 404
    assert Item.objects.get(pk=foreign.pk).title == ""


def test_it_updates_status_title_and_payload_and_bumps_the_revision(runtime, conversation):
    item = factories.add_tool(conversation, status="running")
    new_payload = {"command": "ls", "cwd": "/w", "exit_code": 1, "stdout": "", "stderr": "boom " * 100}
    response = patch(runtime, conversation, item, {"status": "failed", "title": "Listed", "payload": new_payload,
                                                   "revision": 1})
    assert response.status_code == 200, response.content
    item.refresh_from_db()
    assert (item.status, item.title, item.payload, item.revision) == ("failed", "Listed", new_payload, 2)
    assert item.removable_bytes == plan("shell", new_payload).removed_bytes > 0
    assert item.payload_bytes == encoded_size(new_payload)


def test_it_refuses_a_stale_revision_and_changes_nothing(runtime, conversation):
    item = factories.add_tool(conversation)
    patch(runtime, conversation, item, {"title": "first"})
    response = patch(runtime, conversation, item, {"title": "second", "revision": 1})
    assert (response.status_code, response.json()["code"]) == (409, "stale_revision")
    item.refresh_from_db()
    assert (item.title, item.revision) == ("first", 2)


def test_a_change_sent_again_after_its_answer_was_lost_answers_the_item_as_it_is(runtime, conversation):
    """r122: the same PATCH again (its first answer lost) was 409 stale_revision. A change whose
    every field already holds what it would store answers 200 with the item as it is, whatever
    revision it names: no new revision, no activity. Any field that differs is refused as before."""
    item = factories.add_tool(conversation, status="running")
    first = patch(runtime, conversation, item, {"status": "failed", "revision": 1})
    assert (first.status_code, first.json()["revision"]) == (200, 2)
    stored = Item.objects.get(pk=item.pk)
    activity = Conversation.objects.get(pk=conversation.pk).last_activity_at
    again = patch(runtime, conversation, item, {"status": "failed", "revision": 1})
    assert again.status_code == 200, again.content
    assert again.json() == first.json()
    # A title as it is stored, sent with it, is no change either.
    assert patch(runtime, conversation, item, {"status": "failed", "title": "Run", "revision": 1}).status_code == 200
    after = Item.objects.get(pk=item.pk)
    assert (after.status, after.revision, after.updated_at) == ("failed", 2, stored.updated_at)
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == activity
    # Another value in any field sent is a change, checked against the revision as before.
    stale = patch(runtime, conversation, item, {"status": "failed", "title": "Listed", "revision": 1})
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_revision")
    assert Item.objects.get(pk=item.pk).title == "Run"

    # The payload replaces the whole: only the very payload stored is no change.
    payload = {"command": "ls", "cwd": "/w", "exit_code": 1, "stdout": "", "stderr": "boom"}
    assert patch(runtime, conversation, item, {"payload": payload, "title": "Listed", "revision": 2}).json()[
        "revision"] == 3
    activity = Conversation.objects.get(pk=conversation.pk).last_activity_at
    resent = patch(runtime, conversation, item, {"payload": payload, "title": "Listed", "revision": 2})
    assert (resent.status_code, resent.json()["revision"], resent.json()["payload"]) == (200, 3, payload)
    part = {k: v for k, v in payload.items() if k != "stderr"}
    for other in (part, {**payload, "exit_code": 1.0}, {**payload, "exit_code": True}):
        refused = patch(runtime, conversation, item, {"payload": other, "revision": 2})
        assert (refused.status_code, refused.json()["code"]) == (409, "stale_revision")
    after = Item.objects.get(pk=item.pk)
    assert (after.payload, after.revision, after.title) == (payload, 3, "Listed")
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == activity


def test_it_never_restores_removed_tool_details(runtime, conversation):
    item = factories.add_tool(conversation)
    reduced, _ = apply("shell", item.payload, removed_at=timezone.now())
    Item.objects.filter(pk=item.pk).update(payload=reduced, payload_skip="already_removed", removable_bytes=0)
    late = {"command": "ls", "cwd": "/w", "exit_code": 0, "stdout": "x" * 2000, "stderr": ""}
    response = patch(runtime, conversation, item, {"payload": late, "status": "failed"})
    assert response.status_code == 200, response.content
    item.refresh_from_db()
    assert item.status == "failed"
    assert item.payload == reduced and "stdout" not in item.payload


def test_it_refuses_writes_to_a_conversation_being_deleted(runtime, conversation):
    item = factories.add_message(conversation)
    Conversation.objects.filter(pk=conversation.pk).update(state="pending_delete")
    appended = post(runtime, conversation, {"role": "user", "content": "late"})
    assert (appended.status_code, appended.json()["code"]) == (409, "conversation_deletion_pending")
    patched = patch(runtime, conversation, item, {"title": "late"})
    assert (patched.status_code, patched.json()["code"]) == (409, "conversation_deletion_pending")
    assert Item.objects.filter(conversation=conversation).count() == 1
    assert Item.objects.get(pk=item.pk).title == ""
    # r36: once the erasure took the item rows (Pending or Completed), a runtime's change was
    # told 404 "nothing with that id", as if it had sent a wrong id; it is the fence's refusal
    Item.objects.filter(pk=item.pk).delete()
    for state in ("pending_delete", "deleted"):
        Conversation.objects.filter(pk=conversation.pk).update(state=state)
        for target in (item, type("I", (), {"pk": item.pk + 1000})()):
            patched = patch(runtime, conversation, target, {"status": "completed"})
            assert (patched.status_code, patched.json()["code"]) == (409, "conversation_deletion_pending")


def test_it_refuses_a_non_positive_revision(runtime, conversation):
    item = factories.add_tool(conversation)
    response = patch(runtime, conversation, item, {"title": "x", "revision": 0})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_value")


def test_it_refuses_a_bad_item_cursor(member_client, conversation):
    for after in ("x", "%C2%B2", "-1"):
        response = member_client.get(f"/v1/threads/{conversation.public_id}/items?after={after}", **HOST)
        assert (response.status_code, response.json()["code"]) == (400, "invalid_cursor")


def test_it_answers_404_for_an_item_id_beyond_any_integer(member_client, runtime, conversation):
    huge = "9" * 30
    response = member_client.get(f"/v1/threads/{conversation.public_id}/items/{huge}", **HOST)
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert patch(runtime, conversation, type("I", (), {"pk": huge})(), {"title": "x"}).status_code == 404
    page = member_client.get(f"/conversations/{conversation.public_id}/items/{huge}/output/", **HOST)
    assert page.status_code == 404


@pytest.mark.django_db
def test_the_published_schema_says_an_item_change_without_a_revision_is_not_checked(admin_client):
    """A default of 1 in the schema made clients generated from it believe every change was
    checked against revision 1; leaving it out changes the item whatever its revision."""
    schema = admin_client.get("/v1/openapi.json", HTTP_HOST="127.0.0.1").json()
    revision = schema["components"]["schemas"]["ItemPatchIn"]["properties"]["revision"]
    assert revision.get("default") != 1 and "Leave it out" in revision["description"]
    # r108: no field of a change declares a default: left out it means "as it is", which no value
    # says (a client filling in the declared `status: ""`, `payload: null` erased the output)
    fields = schema["components"]["schemas"]["ItemPatchIn"]["properties"]
    assert set(fields) == {"status", "title", "payload", "revision"}
    assert all("default" not in field and "Leave it out" in field["description"] for field in fields.values())


def test_a_payload_that_is_not_an_object_is_its_own_full_output(runtime, member_client, conversation):
    """A runtime may send plain text or a list as a tool's payload: the output endpoint and the
    screen show it whole (they answered an empty output)."""
    for payload, shown in (("all the output text", "all the output text"), (["a", 1], '"a"')):
        response = post(runtime, conversation, {"role": "tool", "tool_kind": "generic", "payload": payload})
        assert response.status_code == 201, response.content
        item = Item.objects.get(pk=response.json()["id"])
        assert item.payload == payload
        answer = member_client.get(f"/v1/threads/{conversation.public_id}/items/{item.pk}/output", **HOST).json()
        assert shown in answer["output"]
        page = member_client.get(f"/conversations/{conversation.public_id}/items/{item.pk}/output/", **HOST)
        assert page.status_code == 200 and shown in page.content.decode().replace("&quot;", '"')


def test_an_append_retried_with_its_idempotency_key_answers_with_the_same_item(runtime, conversation):
    """A runtime that lost the answer to an append sends it again: with the same key it gets
    the item it made (200, as it is now), and the transcript holds it once."""
    body = {"role": "tool", "tool_kind": "shell", "tool_call_id": "call_retry", "status": "running",
            "payload": {"command": "ls", "cwd": "/", "stdout": "a\n"}}
    first = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="append-call_retry")
    assert first.status_code == 201
    active = Conversation.objects.get(pk=conversation.pk).last_activity_at
    again = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="append-call_retry")
    assert again.status_code == 200 and again.json() == first.json()
    assert Item.objects.filter(conversation=conversation).count() == 1
    assert Conversation.objects.get(pk=conversation.pk).last_activity_at == active  # nothing appended
    # Updated since (its late "finished"): the retry answers with the item as it is now.
    item = Item.objects.get(pk=first.json()["id"])
    assert patch(runtime, conversation, item, {"status": "completed"}).status_code == 200
    later = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="append-call_retry")
    assert later.status_code == 200 and later.json()["status"] == "completed" and later.json()["id"] == item.pk
    # The same key for another item: refused, nothing stored.
    other = post(runtime, conversation, {"role": "user", "content": "Something else"},
                 HTTP_IDEMPOTENCY_KEY="append-call_retry")
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert Item.objects.filter(conversation=conversation).count() == 1
    # Keys are per conversation; without a key every append is a new item (as before).
    elsewhere = factories.make_conversation()
    assert post(runtime, elsewhere, body, HTTP_IDEMPOTENCY_KEY="append-call_retry").status_code == 201
    assert post(runtime, conversation, {"role": "user", "content": "x"}).status_code == 201
    assert post(runtime, conversation, {"role": "user", "content": "x"}).status_code == 201
    assert Item.objects.filter(conversation=conversation).count() == 3
    for bad in ("has space", "k" * 201, "é"):
        response = post(runtime, conversation, {"role": "user", "content": "y"}, HTTP_IDEMPOTENCY_KEY=bad)
        assert (response.status_code, response.json()["code"]) == (400, "idempotency_key_invalid"), bad
    assert Item.objects.filter(conversation=conversation).count() == 3


def test_a_key_sent_again_with_another_request_is_refused_and_stores_nothing(runtime, conversation):
    """A retry is the same request: the key with another payload, status or title (or a body
    refused without a key) is 422 `idempotency_key_reused`, never the first item as if the
    second had been stored (r49: 200 with the first payload, the new one dropped)."""
    body = {"role": "tool", "tool_kind": "shell", "tool_call_id": "call_1", "status": "running", "title": "Run tests",
            "payload": {"command": "ls", "stdout": "a"}}
    first = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="idem-tool-1")
    assert first.status_code == 201
    said = post(runtime, conversation, {"role": "user", "content": "hi"}, HTTP_IDEMPOTENCY_KEY="idem-u")
    assert said.status_code == 201
    stored = list(Item.objects.order_by("id").values())
    for key, other in (
            ("idem-tool-1", {**body, "payload": {"command": "rm -rf /", "stdout": "zzz"}}),
            ("idem-tool-1", {**body, "status": "failed"}),
            ("idem-tool-1", {**body, "title": "Different"}),
            ("idem-tool-1", {k: v for k, v in body.items() if k != "title"}),
            ("idem-u", {"role": "user", "content": "hi", "tool_kind": "shell", "payload": [1]}),
            ("idem-u", {"role": "user", "content": "hi", "title": "A title"})):
        response = post(runtime, conversation, other, HTTP_IDEMPOTENCY_KEY=key)
        assert (response.status_code, response.json()["code"]) == (422, "idempotency_key_reused"), other
    assert list(Item.objects.order_by("id").values()) == stored
    # The same request again is still the retry it always was, and the keys are unchanged.
    assert post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="idem-tool-1").json() == first.json()
    assert post(runtime, conversation, {"role": "user", "content": "hi"}, HTTP_IDEMPOTENCY_KEY="idem-u").status_code == 200
    assert Item.objects.filter(conversation=conversation).count() == 2


def test_a_retry_whose_numbers_are_written_as_the_stored_item_has_them_is_the_same_request(runtime, conversation):
    """r52: the digest was taken over the numbers as parsed; the database keeps 1e16 as
    10000000000000000 and -0.0 as 0.0, so the payload an answer gave back was refused."""
    sent = '{"role": "tool", "tool_kind": "shell", "tool_call_id": "f1", "payload": {"command": "ls", "n": 1e16, "z": -0.0}}'
    first = post(runtime, conversation, sent, HTTP_IDEMPOTENCY_KEY="f1")
    assert first.status_code == 201, first.content
    answered = first.json()["payload"]
    assert answered == {"command": "ls", "n": 10000000000000000, "z": 0.0}
    for again in (sent, {"role": "tool", "tool_kind": "shell", "tool_call_id": "f1", "payload": answered},
                  sent.replace("1e16", "1E+16").replace("-0.0", "0.0")):
        response = post(runtime, conversation, again, HTTP_IDEMPOTENCY_KEY="f1")
        assert (response.status_code, response.json()["id"]) == (200, first.json()["id"]), again
    other = post(runtime, conversation, sent.replace("1e16", "2e16"), HTTP_IDEMPOTENCY_KEY="f1")
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert Item.objects.filter(conversation=conversation).count() == 1


def test_an_item_keyed_before_request_digests_were_kept_is_compared_by_what_it_holds(runtime, conversation):
    body = {"role": "tool", "tool_kind": "shell", "tool_call_id": "call_old", "status": "running",
            "payload": {"command": "ls", "stdout": "a"}}
    first = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="older")
    assert Item.objects.get(pk=first.json()["id"]).client_key_digest  # kept now
    Item.objects.filter(pk=first.json()["id"]).update(client_key_digest="")  # as migration 0026 left older rows
    assert post(runtime, conversation, {**body, "status": "completed"}, HTTP_IDEMPOTENCY_KEY="older").status_code == 200
    other = post(runtime, conversation, {**body, "tool_call_id": "call_new"}, HTTP_IDEMPOTENCY_KEY="older")
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    assert Item.objects.filter(conversation=conversation).count() == 1


def test_a_retried_append_is_refused_as_any_write_once_a_delete_is_under_way(runtime, conversation):
    """The retry's answer does not change with the delete's progress: refused while the delete
    is pending (it answered 200 with the item's content) as after it completed."""
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor

    body = {"role": "user", "content": "Say it once"}
    assert post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="once").status_code == 201
    op = request_deletion(conversation, key="retry-while-deleting", acting_user=None)
    assert op.state == "pending"
    pending = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="once")
    assert (pending.status_code, pending.json()["code"]) == (409, "conversation_deletion_pending")
    assert "Say it once" not in pending.content.decode()
    executor.run_erasure(op.pk)
    done = post(runtime, conversation, body, HTTP_IDEMPOTENCY_KEY="once")
    assert (done.status_code, done.json()["code"]) == (409, "conversation_deletion_pending")
    assert not Item.objects.filter(conversation=conversation).exists()
