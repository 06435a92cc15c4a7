from __future__ import annotations

import json
import re

import pytest

from lifecycle.enginefs import EngineHome, UnreadableEngineFile
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}

BROKEN_FLEETS = {
    "truncated": (b'{"version": 1, "agents": [{"agent_id": "sa_1", "orig', "not_json"),
    "not_json": (b"\x00\xff garbage", "not_json"),
    "deeply_nested": (b"[" * 100_000, "not_json"),
    "a_list": (b"[1, 2, 3]", "wrong_shape"),
    "agents_a_dict": (b'{"agents": {"sa_1": {}}}', "wrong_shape"),
    "rows_not_objects": (b'{"agents": ["sa_1", 2]}', "wrong_shape"),
}


def break_file(path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.mark.parametrize("case", sorted(BROKEN_FLEETS))
def test_the_strict_fleet_read_refuses_an_unreadable_file_and_the_tolerant_one_says_so(engine_home, case):
    data, reason = BROKEN_FLEETS[case]
    home = EngineHome()
    assert home.read_fleet() == []  # no file: no rows
    break_file(home.fleet_path, data)
    with pytest.raises(UnreadableEngineFile) as refused:
        home.read_fleet()
    assert refused.value.reason == reason
    read = home.try_read_fleet()
    assert read.rows == [] and read.problem is not None and read.problem.reason == reason
    # An unreadable fleet file is never overwritten as if it were empty.
    with pytest.raises(UnreadableEngineFile):
        home.update_fleet(lambda rows: [*rows, {"agent_id": "sa_new"}])
    assert home.fleet_path.read_bytes() == data


def test_a_fleet_file_that_is_a_folder_is_unreadable_not_empty(engine_home):
    home = EngineHome()
    home.legacy_fleet_path.mkdir(parents=True)
    with pytest.raises(UnreadableEngineFile) as refused:
        home.read_legacy_fleet()
    assert refused.value.reason == "unreadable"
    assert home.try_read_fleet(legacy=True).problem.reason == "unreadable"


@pytest.mark.parametrize("case", sorted(BROKEN_FLEETS))
def test_the_detail_page_shows_what_it_can_when_the_fleet_file_is_broken(member_client, conversation, case):
    factories.add_message(conversation, content="still shown despite the broken file")
    break_file(EngineHome().fleet_path, BROKEN_FLEETS[case][0])
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    page = response.content.decode()
    assert response.status_code == 200
    assert "still shown despite the broken file" in page
    assert 'data-testid="engine-unreadable"' in page and "state/subagents.v1.json" in page
    assert "Unknown: the subagent fleet file could not be read." in page


def test_the_detail_page_skips_fleet_rows_of_odd_shape(member_client, conversation):
    EngineHome().update_fleet(lambda rows: [
        {"agent_id": "sa_odd_origin", "origin": "not-an-object", "status": "running"},
        {"agent_id": ["not", "a", "string"], "origin": {"conversation": conversation.public_id}, "status": 5},
        {"agent_id": "sa_fine", "origin": {"conversation": conversation.public_id}, "status": "running"},
    ])
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    page = response.content.decode()
    assert response.status_code == 200
    assert "sa_fine" in page and "sa_odd_origin" not in page and "Unknown" in page
    assert 'data-testid="engine-unreadable"' not in page


def test_the_detail_page_writes_out_a_childs_id_it_could_not_send_as_it_is(member_client, api, conversation):
    """r123: an id with a lone surrogate (a runtime wrote it) made the conversation's page a 500:
    no page can carry it (UTF-8). It is written out as [U+D800], as are a tab and a direction
    override; the API gives the ids as the file holds them (that answer with escapes)."""
    ids = ["sa_child\ud800", "sa_tab\tx", "sa_\u202eevil"]
    EngineHome().update_fleet(lambda rows: [
        {"agent_id": agent_id, "origin": {"conversation": conversation.public_id}, "status": "completed",
         "delivery": "settled"} for agent_id in ids])
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    assert response.status_code == 200
    page = response.content.decode()
    for shown in ("sa_child[U+D800]", "sa_tab[U+0009]x", "sa_[U+202E]evil"):
        assert f"<code><bdi>{shown}</bdi></code> · Completed" in page, shown
    runtime = api.get(f"/v1/threads/{conversation.public_id}/runtime")
    assert runtime.status_code == 200
    assert [child["agent_id"] for child in runtime.json()["subagents"]] == ids


def test_the_detail_page_names_broken_logs_of_this_conversation(member_client, conversation):
    home = EngineHome()
    key = conversation.storage_key
    home.append_jsonl(home.events_path(key), [{"type": "turn"}])
    with open(home.events_path(key), "ab") as handle:
        handle.write(b'{"type": "tu')
    break_file(home.receipts_path(key), b'{"ok": 1}\nnot json at all\n')
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    page = response.content.decode()
    assert response.status_code == 200
    assert f"threads/{key}/events.jsonl</code> ends with an incomplete record" in page
    assert f"sessions/{key}/approval_receipts.jsonl</code> has lines that are not records" in page
    assert home.events_path(key).read_bytes().endswith(b'{"type": "tu')  # a page view changes nothing


def test_the_detail_page_reports_a_log_that_cannot_be_opened(member_client, conversation):
    home = EngineHome()
    home.receipts_path(conversation.storage_key).mkdir(parents=True)  # a folder where a file belongs
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    assert response.status_code == 200
    assert "approval_receipts.jsonl</code> cannot be read" in response.content.decode()


def test_the_detail_page_does_not_follow_a_symlinked_conversation_folder(member_client, conversation, tmp_path):
    factories.folder_behind_a_link(conversation, tmp_path)
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    page = response.content.decode()
    assert response.status_code == 200
    assert "symbolic link" in page
    # The figure says it leaves out what it could not read, not a plain "0 files, 0 bytes".
    assert "At least 0 files, 0\xa0bytes: some could not be read (below)" in page


def test_a_clean_engine_folder_shows_no_notice(member_client, conversation):
    home = EngineHome()
    home.append_jsonl(home.events_path(conversation.storage_key), [{"type": "turn"}])
    home.update_fleet(lambda rows: [{"agent_id": "sa_1", "origin": {"conversation": conversation.public_id},
                                     "status": "completed"}])
    page = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert 'data-testid="engine-unreadable"' not in page and "sa_1" in page
    assert re.search(r'data-testid="engine-files">\d+ files?, ', page)


def test_the_data_storage_page_reports_engine_folder_health(member_client):
    home = EngineHome()
    page = member_client.get("/settings/system/data-storage/", **HOST).content.decode()
    assert "The fleet files read correctly." in page
    break_file(home.fleet_path, b'{"agents": [')
    break_file(home.legacy_fleet_path, json.dumps(["a list"]).encode())
    response = member_client.get("/settings/system/data-storage/", **HOST)
    page = response.content.decode()
    assert response.status_code == 200
    assert "state/subagents.v1.json</code> is not valid JSON" in page
    assert "legacy-state/subagents.v1.json</code> is not in the expected format" in page
    spanish = member_client.get("/settings/system/data-storage/", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert spanish.status_code == 200 and "is not valid JSON" not in spanish.content.decode()
