"""The lifecycle API: PATCH and DELETE /v1/threads/{id}, operations, the ambiguity way out."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from django.test import Client

from console.models import ApiToken
from lifecycle import fleet
from lifecycle import models as m
from lifecycle.deletion import executor
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def patch(client, conversation, body):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.patch(f"/v1/threads/{conversation.public_id}", data=data, content_type="application/json")


def delete(client, public_id, key="key-1"):
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.delete(f"/v1/threads/{public_id}", **headers)


def test_patch_archives_closes_resumes_and_unarchives(api, admin_user):
    conversation = factories.make_conversation()
    response = patch(api, conversation, {"archived": True, "closed": True})
    assert response.status_code == 200, response.content
    assert (response.json()["archived"], response.json()["closed"]) == (True, True)
    conversation.refresh_from_db()
    assert conversation.archived_at and conversation.closed_at
    assert patch(api, conversation, {"closed": False}).json()["closed"] is False
    assert patch(api, conversation, {"archived": False}).json()["archived"] is False
    actions = list(m.AuditFact.objects.order_by("pk").values_list("action", flat=True))
    assert actions == ["conversation.archived", "conversation.closed", "conversation.resumed",
                       "conversation.unarchived"]
    assert patch(api, conversation, {}).status_code == 200  # nothing to change
    assert m.AuditFact.objects.count() == 4


@pytest.mark.parametrize(("body", "code"), [
    ({"archived": "yes"}, "invalid_type"), ({"archived": 1}, "invalid_type"), ({"deleted": True}, "unknown_field"),
    ("[true]", "invalid_body"), ('{"archived": true, "archived": false}', "duplicate_key"),
])
def test_patch_refuses_bad_bodies_and_changes_nothing(api, body, code):
    conversation = factories.make_conversation()
    response = patch(api, conversation, body)
    assert (response.status_code, response.json()["code"]) == (400, code)
    conversation.refresh_from_db()
    assert conversation.archived_at is None and not m.AuditFact.objects.exists()


def test_members_may_read_but_not_change(member_api):
    conversation = factories.make_conversation()
    assert patch(member_api, conversation, {"archived": True}).status_code == 403
    assert delete(member_api, conversation.public_id).status_code == 403
    assert member_api.get(f"/v1/threads/{conversation.public_id}/deletion-preview").status_code == 200
    conversation.refresh_from_db()
    assert conversation.state == "live" and conversation.archived_at is None
    assert not m.DeleteOperation.objects.exists() and not m.OperationKey.objects.exists()


def test_delete_answers_202_pending_then_the_same_operation_completed_ever_after(api):
    conversation = factories.make_conversation()
    factories.fill_every_store(conversation)
    first = delete(api, conversation.public_id)
    assert first.status_code == 202, first.content
    op = first.json()
    assert (op["state"], op["outcome"], op["target"], op["step"]) == ("pending", "pending", conversation.public_id,
                                                                      "fingerprints")
    assert op["receipt"] is None and len(op["steps"]) == m.DeleteStep.objects.count()
    replay = delete(api, conversation.public_id)
    assert (replay.status_code, replay.json()["id"]) == (202, op["id"])
    executor.run_erasure(m.DeleteOperation.objects.get(public_id=op["id"]).pk)
    done = delete(api, conversation.public_id)
    assert done.status_code == 202
    assert (done.json()["id"], done.json()["state"]) == (op["id"], "completed")
    stores = {e["store"]: e for e in done.json()["receipt"]["stores"]}
    assert stores["lifecycle.Item"]["records"] == 2 and stores["lifecycle.Item"]["class"] == "erase"
    read = api.get(f"/v1/operations/{op['id']}").json()
    assert read["state"] == "completed" and read["receipt"]["physical"]["state"] in ("pending", "erased")
    # A new key for the deleted conversation answers with the same operation too.
    assert delete(api, conversation.public_id, key="key-2").json()["id"] == op["id"]
    assert m.DeleteOperation.objects.count() == 1
    # Its preview now: nothing left to erase in the conversation record (the tombstone row that
    # stays is not one), none of its items.
    preview = api.get(f"/v1/threads/{conversation.public_id}/deletion-preview").json()
    counts = {e["store"]: e.get("records") for e in preview["stores"]}
    assert preview["state"] == "deleted" and counts["lifecycle.Conversation"] == 0 and counts["lifecycle.Item"] == 0


def test_a_conversation_names_its_delete_and_when_it_completed_as_the_list_links_its_receipt(api):
    """r72: the Deleted tab says when each was deleted and links its Erasure receipt; the API's
    conversation gave neither (a client had to page through every operation to find it)."""
    conversation, other = factories.make_conversation(), factories.make_conversation(thread_id="t-live")
    live = api.get(f"/v1/threads/{other.public_id}").json()
    assert (live["state"], live["delete"], live["deleted_at"]) == ("live", None, None)
    op_id = delete(api, conversation.public_id).json()["id"]
    pending = api.get(f"/v1/threads/{conversation.public_id}").json()
    assert (pending["state"], pending["delete"], pending["deleted_at"]) == ("pending_delete", op_id, None)
    executor.run_erasure(m.DeleteOperation.objects.get(public_id=op_id).pk)
    completed = m.DeleteOperation.objects.get(public_id=op_id).completed_at
    shown = completed.isoformat().replace("+00:00", "Z")
    listed = api.get("/v1/threads?view=deleted").json()["results"]
    assert [(t["id"], t["delete"], t["deleted_at"]) for t in listed] == [(conversation.public_id, op_id, shown)]
    detail = api.get(f"/v1/threads/{conversation.public_id}").json()
    assert (detail["state"], detail["delete"], detail["deleted_at"]) == ("deleted", op_id, shown)
    assert api.get(f"/v1/operations/{detail['delete']}").json()["receipt"] is not None


def test_delete_refusals_are_409_with_code_and_outcome_and_remembered(api):
    conversation = factories.make_conversation()
    factories.start_turn(conversation)
    refused = delete(api, conversation.public_id, key="r-1")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["code"], body["outcome"]) == ("conversation_turn_active", "refused")
    assert body["operation"].startswith("op_") and body["message"]
    conversation.refresh_from_db()
    assert conversation.state == "live" and not m.DeletionFence.objects.exists()
    # Stale replay of the old key: the recorded answer, though the turn has ended since.
    m.Turn.objects.update(state="done")
    assert delete(api, conversation.public_id, key="r-1").json() == body
    assert delete(api, conversation.public_id, key="r-2").status_code == 202
    read = api.get(f"/v1/operations/{body['operation']}").json()
    assert (read["state"], read["code"], read["steps"]) == ("refused", "conversation_turn_active", [])


def test_delete_unavailable_shows_the_way_out_and_the_resolve_endpoint_takes_it(api):
    conversation = factories.make_conversation(days_idle=1)
    legacy = {"agent_id": "sa_old", "origin": None, "status": "completed", "delivery": "settled",
              "started_at": conversation.created_at.isoformat(), "finished_at": None, "prompt": "secret"}
    fleet.write_snapshot([legacy])
    answer = delete(api, conversation.public_id, key="u-1")
    assert (answer.status_code, answer.json()["outcome"]) == (409, "unavailable")
    assert answer.json()["code"] == "conversation_child_ownership_ambiguous"
    op = api.get(f"/v1/operations/{answer.json()['operation']}").json()
    assert op["way_out"] == {"ambiguous": [{"agent_id": "sa_old", "status": "completed",
                                            "started_at": legacy["started_at"].replace("+00:00", "Z"), "finished_at": None}]}
    assert "secret" not in json.dumps(op)
    resolve = api.post("/v1/subagents/sa_old/resolve", data=json.dumps({"action": "attribute",
                                                                        "conversation": conversation.public_id}),
                       content_type="application/json")
    assert resolve.status_code == 200, resolve.content
    assert fleet.origin_of(fleet.read_rows(fleet.EngineHome().fleet_path)[0]) == conversation.public_id
    # a client retrying after a lost answer gets the same answer
    again = api.post("/v1/subagents/sa_old/resolve", data=json.dumps({"action": "attribute",
                                                                      "conversation": conversation.public_id}),
                     content_type="application/json")
    assert (again.status_code, again.json()) == (200, resolve.json())
    assert m.AuditFact.objects.filter(action="subagent.attributed").count() == 1
    assert delete(api, conversation.public_id, key="u-2").status_code == 202



def test_a_fleet_rows_values_that_are_not_text_never_leave_as_invalid_json(api):
    """A runtime wrote the fleet file: a NaN status or a number as a start went out in way_out as
    is, NaN included (not JSON), and a console of this engine refused its whole Operations list (r46)."""
    conversation = factories.make_conversation(days_idle=1)
    fleet.write_snapshot([{"agent_id": "sa_odd", "origin": None, "status": float("nan"), "delivery": "settled",
                           "started_at": 10**400, "finished_at": {"at": 1}}])
    answer = delete(api, conversation.public_id, key="nan-1")
    assert answer.json()["code"] == "conversation_child_ownership_ambiguous"
    for path in (f"/v1/operations/{answer.json()['operation']}", "/v1/operations?limit=50",
                 f"/v1/threads/{conversation.public_id}/deletion-preview"):
        raw = api.get(path).content.decode()
        json.loads(raw, parse_constant=lambda name, at=path: pytest.fail(f"{name} in {at}"))
        assert "sa_odd" in raw and "10000000000" not in raw, path
    op = api.get(f"/v1/operations/{answer.json()['operation']}").json()
    assert op["way_out"] == {"ambiguous": [{"agent_id": "sa_odd", "status": None, "started_at": None,
                                            "finished_at": None}]}


def test_a_fleet_rows_lone_surrogate_is_answered_escaped_not_failed(api):
    """Answers are UTF-8 text, which a lone surrogate cannot be (a runtime wrote it into the
    fleet file): that answer is written with escapes, and other answers stay UTF-8 (r97: 500)."""
    conversation = factories.make_conversation(title="Ñandú", days_idle=1)
    fleet.write_snapshot([{"agent_id": "sa_bad\ud800x", "origin": {"conversation": conversation.public_id},
                           "status": "running", "delivery": "settled"},
                          {"agent_id": "sa_free", "origin": None, "status": "running\ud800", "delivery": "settled"}])
    answer = delete(api, conversation.public_id, key="surrogate-1")
    assert answer.status_code in (202, 409)
    for path in (f"/v1/threads/{conversation.public_id}/runtime", "/v1/operations?limit=50"):
        response = api.get(path)
        assert response.status_code == 200, path
        raw = response.content.decode("utf-8")  # valid UTF-8 throughout
        assert "\\ud800" in raw, path
    assert "Ñandú".encode() in api.get(f"/v1/threads/{conversation.public_id}").content


def test_the_resolve_endpoint_takes_an_id_with_a_slash(api):
    conversation = factories.make_conversation(days_idle=1)
    fleet.write_snapshot([{"agent_id": "team/sa 1", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    for address in ("/v1/subagents/team%2Fsa%201/resolve", "/v1/subagents/team/sa%201/resolve"):
        answer = api.post(address, data=json.dumps({"action": "attribute", "conversation": conversation.public_id}),
                          content_type="application/json")
        assert (answer.status_code, answer.json()["agent_id"]) == (200, "team/sa 1"), address
    assert fleet.origin_of(fleet.read_rows(fleet.EngineHome().fleet_path)[0]) == conversation.public_id


@pytest.mark.parametrize("agent_id", ["sa\nx", "sa\r\nx", "sa\tx", "sa_\u202eevil2"])
def test_the_preview_lists_a_row_whose_id_holds_a_control_character_and_its_address_names_it(api, agent_id):
    """r123: a legacy row whose id held a tab or a direction override was no row to the
    preview, only a state file "that cannot be read"; and an id with a line break had no address
    (Django's `path` takes none), while the command resolved it. One rule names rows now."""
    from urllib.parse import quote

    conversation = factories.make_conversation(days_idle=1)
    home = fleet.EngineHome()
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [{
        "agent_id": agent_id, "status": "completed", "delivery": "settled",
        "started_at": conversation.created_at.isoformat()}])
    admission = api.get(f"/v1/threads/{conversation.public_id}/deletion-preview").json()["admission"]
    assert [reason["code"] for reason in admission["reasons"]] == ["conversation_child_ownership_ambiguous"]
    assert [row["agent_id"] for row in admission["ambiguous"]] == [agent_id]
    answer = api.post(f"/v1/subagents/{quote(agent_id, safe='')}/resolve", data=json.dumps({"action": "clear"}),
                      content_type="application/json")
    assert (answer.status_code, answer.json()["agent_id"]) == (200, agent_id)
    assert fleet.read_rows(home.legacy_fleet_path) == []
    assert api.get(f"/v1/threads/{conversation.public_id}/deletion-preview").json()["admission"]["reasons"] == []


def test_an_operations_way_out_names_no_row_whose_id_cannot_be_named(api):
    """r123: the way out listed a row whose id holds a lone surrogate (escaped in the answer, and
    no address, form or command can carry it); the delete says the file needs repair instead."""
    conversation = factories.make_conversation(days_idle=1)
    row = {"origin": None, "status": "completed", "delivery": "settled", "started_at": None, "finished_at": None}
    fleet.write_snapshot([{**row, "agent_id": "sa_ok"}, {**row, "agent_id": "sa_sur\ud800x"}])
    answer = delete(api, conversation.public_id, key="sur-way-out")
    assert answer.status_code == 409
    op = api.get(f"/v1/operations/{answer.json()['operation']}")
    assert "\\ud800" not in op.content.decode()
    assert op.json()["reasons"] == ["conversation_child_ownership_ambiguous", "conversation_child_state_unreadable"]
    assert op.json()["way_out"] == {"ambiguous": [{"agent_id": "sa_ok", "status": "completed", "started_at": None,
                                                   "finished_at": None}]}

@pytest.mark.parametrize(("body", "status", "code"), [
    ({"action": "attribute"}, 400, "missing_field"),
    ({"action": "burn"}, 400, "invalid_choice"),
    ({"action": "clear", "extra": 1}, 400, "unknown_field"),
    ({"action": "clear", "conversation": "c_" + "a" * 20}, 400, "unknown_field"),  # not silently ignored
])
def test_resolve_refuses_bad_bodies(api, body, status, code):
    fleet.write_snapshot([{"agent_id": "sa_x", "origin": None}])
    response = api.post("/v1/subagents/sa_x/resolve", data=json.dumps(body), content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert fleet.read_rows(fleet.EngineHome().fleet_path) == [{"agent_id": "sa_x", "origin": None}]


def test_delete_key_rules(api):
    first, second = factories.make_conversation(), factories.make_conversation()
    missing = delete(api, first.public_id, key=None)
    assert (missing.status_code, missing.json()["code"]) == (400, "idempotency_key_missing")
    spaced = delete(api, first.public_id, key="two words")
    assert (spaced.status_code, spaced.json()["code"]) == (400, "idempotency_key_invalid")
    # Sent but too long, or with a character that is not printable: invalid, not missing.
    for key in ("k" * 201, "tab\there"):
        bad = delete(api, first.public_id, key=key)
        assert (bad.status_code, bad.json()["code"]) == (400, "idempotency_key_invalid"), key
        # the same words as for a key of the wrong characters: what a valid key is
        assert bad.json()["message"] == spaced.json()["message"] == (
            "The Idempotency-Key must be 1 to 200 printable ASCII characters without spaces."), key
    assert not m.DeleteOperation.objects.exists() and not m.OperationKey.objects.exists()
    assert delete(api, first.public_id, key="shared").status_code == 202
    reused = delete(api, second.public_id, key="shared")
    assert (reused.status_code, reused.json()["code"]) == (422, "idempotency_key_reused")
    second.refresh_from_db()
    assert second.state == "live"
    assert delete(api, factories.make_conversation().public_id, key="k" * 200).status_code == 202  # the longest


def test_unknown_ids_are_404_and_leave_no_marker(api):
    for public_id in ("c_0000000000000000000f", "nothing", "c_" + "a" * 200):
        response = delete(api, public_id, key=f"k-{len(public_id)}")
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert not m.DeleteOperation.objects.exists() and not m.OperationKey.objects.exists()
    for operation_id in ("op_00000000000000000000", "op_nothing", "op_" + "0" * 500):
        assert api.get(f"/v1/operations/{operation_id}").status_code == 404


def test_operation_list_pages_and_filters(api):
    conversations = [factories.make_conversation() for _ in range(3)]
    for n, conversation in enumerate(conversations):
        delete(api, conversation.public_id, key=f"list-{n}")
    factories.start_turn(busy := factories.make_conversation())
    delete(api, busy.public_id, key="list-busy")
    page = api.get("/v1/operations?limit=2").json()
    assert len(page["results"]) == 2 and page["next"] and page["previous"] is None
    rest = api.get(f"/v1/operations?limit=2&cursor={page['next']}").json()
    assert len(rest["results"]) == 2 and rest["next"] is None
    assert [o["state"] for o in api.get("/v1/operations?state=refused").json()["results"]] == ["refused"]
    assert api.get("/v1/operations?state=gone").status_code == 400
    assert api.get("/v1/threads?view=pending_delete").json()["results"][0]["state"] == "pending_delete"


def test_retry_is_for_pending_operations_only(api):
    conversation = factories.make_conversation()
    op = delete(api, conversation.public_id).json()
    m.DeleteOperation.objects.filter(public_id=op["id"]).update(stalled_attempts=5, last_error="stalled")
    retried = api.generic("POST", f"/v1/operations/{op['id']}/retry")  # no body, as this endpoint takes
    assert retried.status_code == 202 and retried.json()["error"] is None
    executor.run_erasure(m.DeleteOperation.objects.get(public_id=op["id"]).pk)
    again = api.post(f"/v1/operations/{op['id']}/retry", data={}, content_type="application/json")  # or {}
    assert again.json()["code"] == "operation_not_pending"
    # A form's body is not this endpoint's (415), as on any endpoint that reads JSON
    assert api.post(f"/v1/operations/{op['id']}/retry", {"x": "1"}).json()["code"] == "unsupported_media_type"


def test_late_item_writes_through_the_api_are_refused(api):
    conversation = factories.make_conversation()
    item = factories.add_message(conversation)
    delete(api, conversation.public_id)
    append = api.post(f"/v1/threads/{conversation.public_id}/items", data=json.dumps({"role": "user", "content": "x"}),
                      content_type="application/json")
    update = api.patch(f"/v1/threads/{conversation.public_id}/items/{item.pk}", data=json.dumps({"title": "x"}),
                       content_type="application/json")
    resume = patch(api, conversation, {"closed": False})
    nothing, nulls = patch(api, conversation, {}), patch(api, conversation, {"archived": None, "closed": None})
    for response in (append, update, resume, nothing, nulls):
        assert (response.status_code, response.json()["code"]) == (409, "conversation_deletion_pending")
    assert m.Item.objects.filter(conversation=conversation).count() == 1
    executor.run_erasure(m.DeleteOperation.objects.get().pk)
    for body in ({}, {"archived": None}):  # the delete completed: a change of nothing is still refused
        response = patch(api, conversation, body)
        assert (response.status_code, response.json()["code"]) == (409, "conversation_deletion_pending")


@pytest.mark.django_db(transaction=True)
def test_a_response_lost_on_the_way_is_answered_by_the_retry_with_the_same_key(live_server, admin_user):
    conversation = factories.make_conversation()
    factories.fill_every_store(conversation)
    _token, raw = ApiToken.issue(admin_user)
    where = urlsplit(live_server.url)
    request = (f"DELETE /v1/threads/{conversation.public_id} HTTP/1.1\r\nHost: {where.hostname}\r\n"
               f"Authorization: Bearer {raw}\r\nIdempotency-Key: lost-once\r\nContent-Length: 0\r\n\r\n").encode()
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_RDWR)  # the client goes away before any answer arrives
    deadline = time.monotonic() + 20
    while not m.DeleteOperation.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    op = m.DeleteOperation.objects.get()
    executor.run_erasure(op.pk)
    retry = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST).delete(
        f"/v1/threads/{conversation.public_id}", HTTP_IDEMPOTENCY_KEY="lost-once")
    assert retry.status_code == 202
    assert (retry.json()["id"], retry.json()["state"]) == (op.public_id, "completed")
    assert m.DeleteOperation.objects.count() == 1 and m.OperationKey.objects.count() == 1
    assert m.AuditFact.objects.filter(action="conversation.deleted").count() == 1
    # Erased once: the receipt counts what was there, not zero from a second pass.
    assert {e["store"]: e["records"] for e in retry.json()["receipt"]["stores"]}["lifecycle.Item"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_delete_asked_between_a_patchs_two_changes_waits_for_both(api, admin_user, monkeypatch):
    """PATCH {archived, closed} made its changes one transaction each: a delete requested in
    between left the conversation archived under the close's 409. Now both are made in one
    transaction, which the delete's request waits for."""
    import threading

    from django.db import connections

    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.engine.inprocess import InProcessEngine

    conversation = factories.make_conversation()
    real = InProcessEngine.set_closed
    outcome: list[str] = []

    def ask_for_the_delete() -> None:
        try:
            outcome.append(request_deletion(m.Conversation.objects.get(pk=conversation.pk), key="between",
                                            acting_user=admin_user).state)
        finally:
            connections.close_all()

    def close_after_a_delete_was_asked(self, public_id, closed, *, actor):
        asker = threading.Thread(target=ask_for_the_delete)
        asker.start()
        asker.join(0.5)
        outcome.append("waiting" if asker.is_alive() else "done before the close")
        answer = real(self, public_id, closed, actor=actor)
        close_after_a_delete_was_asked.asker = asker
        return answer

    monkeypatch.setattr(InProcessEngine, "set_closed", close_after_a_delete_was_asked)
    response = patch(api, conversation, {"archived": True, "closed": True})
    close_after_a_delete_was_asked.asker.join(30)
    assert response.status_code == 200, response.content
    assert (response.json()["archived"], response.json()["closed"]) == (True, True)
    assert outcome == ["waiting", "pending"]  # the delete came after both changes
    conversation.refresh_from_db()
    assert conversation.archived_at is not None and conversation.closed_at is not None
    assert m.AuditFact.objects.filter(conversation=conversation, action="conversation.archived").count() == 1


def test_records_of_the_conversation_outside_the_fleet_rows_keep_the_delete_from_claiming_them(api, capsys):
    """r128: another runtime wrote the fleet file with entries of its own naming a conversation
    (follow-ups, resume targets: the kinds DESIGN 3.3 lists, which Lethe's engine keeps as rows
    of `agents`). A delete compacted the rows only, left those entries with their text, and the
    check said clean. The delete is Unavailable while they are there; once removed it goes
    through; such an entry written after the delete is a finding of the check."""
    from django.core.management import call_command

    from lifecycle.enginefs import EngineHome

    home = EngineHome()
    conversation, other, bystander = (factories.make_conversation(days_idle=1) for _ in range(3))
    pid = conversation.public_id
    fleet.write_snapshot([{"agent_id": "sa_done", "origin": {"conversation": pid}, "status": "completed",
                           "delivery": "settled", "prompt": "ZQX row"}])

    def runtime_adds(extra: dict) -> None:  # as a runtime writes the file: its own entries beside the rows
        document = json.loads(home.fleet_path.read_bytes())
        home.write_atomic(home.fleet_path, json.dumps({**document, **extra}, indent=1).encode())

    runtime_adds({"follow_ups": [{"origin": {"conversation": pid}, "prompt": "ZQXFOLLOW continue"}],
                  "resume_targets": {pid: {"prompt": "ZQXRESUME"}, other.public_id: {"prompt": "stays"}}})
    answer = delete(api, pid, key="unknown-1")
    assert (answer.status_code, answer.json()["outcome"], answer.json()["code"]) == (
        409, "unavailable", "conversation_child_records_unknown")
    assert "outside its \"agents\" list" in answer.json()["message"]
    preview = api.get(f"/v1/threads/{pid}/deletion-preview").json()["admission"]
    assert [reason["code"] for reason in preview["reasons"]] == ["conversation_child_records_unknown"]
    assert b"ZQXFOLLOW" in home.fleet_path.read_bytes() and b"ZQX row" in home.fleet_path.read_bytes()
    assert m.Conversation.objects.get(pk=conversation.pk).state == "live"
    # the other conversation named in such an entry is held back by its own; one not named is not
    assert api.get(f"/v1/threads/{other.public_id}/deletion-preview").json()["admission"]["outcome"] == "unavailable"
    assert api.get(f"/v1/threads/{bystander.public_id}/deletion-preview").json()["admission"]["outcome"] == "admitted"
    # The operator removes them: the delete goes through, and the other conversation's entry stays.
    document = json.loads(home.fleet_path.read_bytes())
    document["follow_ups"], document["resume_targets"] = [], {other.public_id: {"prompt": "stays"}}
    home.write_atomic(home.fleet_path, json.dumps(document).encode())
    done = delete(api, pid, key="unknown-2")
    assert done.status_code == 202
    executor.run_erasure(m.DeleteOperation.objects.get(public_id=done.json()["id"]).pk)
    assert pid.encode() not in home.fleet_path.read_bytes() and b"stays" in home.fleet_path.read_bytes()
    call_command("verify_erasure", pid)
    assert "logical: clean" in capsys.readouterr().out
    # Written again after the delete: the check names it, and says it is not clean.
    runtime_adds({"follow_ups": [{"origin": {"conversation": pid}, "prompt": "ZQXLATE"}]})
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", pid)
    assert caught.value.code == 1
    assert "subagents (fleet_records: 1; follow_ups)" in capsys.readouterr().out  # the entry named


@pytest.mark.parametrize(("entry", "held"), [
    # the id written with \\u escapes is the same id (r130: the bytes were searched, and missed it)
    ("escaped", True),
    # another conversation's record that quotes the id in its text is that one's (r130: it held this delete)
    ("quoted-by-another", False),
    # a record that names the id and says nothing of its owner cannot be attributed: it holds the delete
    ("no-owner", True),
    ("keyed-by-another", False),
    # r131: keyed by the id at the top of the file; an origin without a conversation; another's
    # record one level deeper, under a grouping key
    ("top-level-key", True),
    ("null-owner", True),
    ("nested-another", False),
    # r132: an origin that names no conversation ("", "unknown", "legacy:<id>"); a record of this
    # conversation nested in another's; the id in capitals
    ("empty-owner", True),
    ("legacy-owner", True),
    ("nested-in-another", True),
    ("capitals", True),
])
def test_whose_records_outside_the_fleet_rows_are_read_from_the_json_not_guessed(api, entry, held):
    from lifecycle.enginefs import EngineHome

    home = EngineHome()
    conversation, other = factories.make_conversation(days_idle=1), factories.make_conversation(days_idle=1)
    pid = conversation.public_id
    fleet.write_snapshot([])
    records = {
        "escaped": json.dumps({"follow_ups": [{"origin": {"conversation": pid}, "prompt": "ZQX"}]}),
        "quoted-by-another": json.dumps({"follow_ups": [{"origin": {"conversation": other.public_id},
                                                         "prompt": f"summarise what {pid} decided"}]}),
        "no-owner": json.dumps({"coordination": [{"note": f"wait for {pid}"}]}),
        "keyed-by-another": json.dumps({"resume_targets": {other.public_id: {"prompt": f"as in {pid}"}}}),
        "top-level-key": json.dumps({pid: {"resume_prompt": "ZQX resume here"}}),
        "null-owner": json.dumps({"follow_ups": [{"origin": {"conversation": None}, "prompt": f"continue {pid}"}]}),
        "nested-another": json.dumps({"queues": {"follow_ups": [{"origin": {"conversation": other.public_id},
                                                                 "prompt": f"summarise what {pid} decided"}]}}),
        "empty-owner": json.dumps({"follow_ups": [{"origin": {"conversation": ""}, "prompt": f"continue {pid}"}]}),
        "legacy-owner": json.dumps({"follow_ups": [{"origin": {"conversation": f"legacy:{pid}"}, "prompt": "ZQX"}]}),
        "nested-in-another": json.dumps({"handoffs": [{"origin": {"conversation": other.public_id}, "children": [
            {"origin": {"conversation": pid}, "prompt": "ZQX child"}]}]}),
        "capitals": json.dumps({"notes": [f"continue {pid.upper()}"]}),
    }[entry]
    document = {**json.loads(home.fleet_path.read_bytes()), **json.loads(records)}
    text = json.dumps(document)
    if entry == "escaped":  # as another runtime may write it: every character of the id escaped
        text = text.replace(json.dumps(pid), '"' + "".join(f"\\u{ord(c):04x}" for c in pid) + '"')
        assert pid not in text
    home.write_atomic(home.fleet_path, text.encode())
    answer = delete(api, pid, key=f"owner-{entry}")
    if held:
        assert (answer.status_code, answer.json()["code"]) == (409, "conversation_child_records_unknown")
        assert m.Conversation.objects.get(pk=conversation.pk).state == "live"
    else:
        assert answer.status_code == 202
        executor.run_erasure(m.DeleteOperation.objects.get(public_id=answer.json()["id"]).pk)
        assert m.DeleteOperation.objects.get(public_id=answer.json()["id"]).state == "completed"
        assert json.loads(home.fleet_path.read_bytes())[next(iter(json.loads(records)))]  # the other's stays
