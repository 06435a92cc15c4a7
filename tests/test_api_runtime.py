"""`GET /v1/threads/{id}/runtime`: what a conversation's page says of its runtime, for clients."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from lifecycle import runtime_status
from lifecycle.enginefs import EngineHome
from lifecycle.models import RuntimeClaim
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def runtime(client, conversation, language: str = "en"):
    response = client.get(f"/v1/threads/{conversation.public_id}/runtime", HTTP_ACCEPT_LANGUAGE=language, **HOST)
    assert response.status_code == 200, response.content
    return response.json()


def test_it_gives_the_counts_claims_subagents_and_engine_files_the_page_shows(member_client, conversation):
    for n in range(3):
        factories.add_message(conversation, content=f"message {n}")
    factories.start_turn(conversation, "running")
    factories.start_turn(conversation, "queued")
    factories.start_turn(conversation, "completed")
    now = timezone.now()
    RuntimeClaim.objects.create(conversation=conversation, kind="shell_job", label="make build", opened_at=now)
    RuntimeClaim.objects.create(conversation=conversation, kind="approval", opened_at=now - timedelta(minutes=1))
    RuntimeClaim.objects.create(conversation=conversation, kind="task", resolved_at=now)  # resolved: not listed
    home = EngineHome()
    home.append_jsonl(home.events_path(conversation.storage_key), [{"type": "turn"}])
    home.update_fleet(lambda rows: [
        {"agent_id": "sa_1", "origin": {"conversation": conversation.public_id}, "status": "running"},
        {"agent_id": "sa_2", "origin": {"conversation": conversation.public_id}, "status": "gone fishing"},
        {"agent_id": "sa_other", "origin": {"conversation": "c_someone_else"}, "status": "running"},
    ])
    files, size = home.conversation_usage(conversation.storage_key)
    assert files >= 1 and size > 0
    assert runtime(member_client, conversation) == {
        "messages": 3, "messages_over": False, "turns": 2,
        "claims": [{"kind": "approval", "label": "", "opened_at": runtime_status_iso(now - timedelta(minutes=1))},
                   {"kind": "shell_job", "label": "make build", "opened_at": runtime_status_iso(now)}],
        "subagents": [{"agent_id": "sa_1", "status": "running"}, {"agent_id": "sa_2", "status": "unknown"}],
        "engine_files": files, "engine_bytes": size, "engine_complete": True, "engine_problems": [],
    }
    page = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert "<dt>Running or queued turns</dt><dd>2</dd>" in page and "sa_2</bdi></code> · Unknown" in page


def runtime_status_iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_an_unreadable_fleet_file_makes_the_subagents_unknown_not_none(member_client, conversation):
    home = EngineHome()
    home.fleet_path.parent.mkdir(parents=True, exist_ok=True)
    home.fleet_path.write_bytes(b'{"version": 1, "agents": [{"agent_id": "sa_1", "orig')
    shown = runtime(member_client, conversation)
    assert shown["subagents"] is None and shown["engine_complete"] is True  # the figures count the files
    assert shown["engine_problems"] == [{"path": "state/subagents.v1.json", "code": "not_json",
                                         "message": "is not valid JSON"}]
    spanish = runtime(member_client, conversation, "es")["engine_problems"][0]
    assert spanish["code"] == "not_json" and spanish["message"] != "is not valid JSON"


def test_a_folder_behind_a_link_is_left_out_and_said(member_client, conversation, tmp_path):
    factories.folder_behind_a_link(conversation, tmp_path)
    shown = runtime(member_client, conversation)
    assert (shown["engine_files"], shown["engine_bytes"], shown["engine_complete"]) == (0, 0, False)
    assert [p["code"] for p in shown["engine_problems"]] == ["unsafe"]
    assert shown["engine_problems"][0]["path"] == f"threads/{conversation.storage_key}"


def test_a_long_transcript_is_counted_up_to_the_cap(member_client, conversation, monkeypatch):
    monkeypatch.setattr(runtime_status, "COUNT_CAP", 3)
    for n in range(5):
        factories.add_message(conversation, content=f"m{n}")
    shown = runtime(member_client, conversation)
    assert (shown["messages"], shown["messages_over"]) == (3, True)


def test_unknown_ids_and_anonymous_readers_are_refused(member_client, client, conversation):
    missing = member_client.get("/v1/threads/c_doesnotexist000000000/runtime", **HOST)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert client.get(f"/v1/threads/{conversation.public_id}/runtime", **HOST).status_code == 401
