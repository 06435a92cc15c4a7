"""Reads of a conversation's content once its delete is requested.

The intent commits before anything is erased, and a delete can stay Pending for long (no
worker, the engine offline, residue found, a job killed mid-erasure) with its rows still in
the database. From the intent on, no read serves them: the API's item reads answer 410
`conversation_deletion_pending`, the output page 410 with no content, and the title is no
longer shown or searched; the thread document (state, the operation) stays readable. The
same after the delete completed. Real rows, a real delete through the API, no job run
(the erasure job is queued on commit, and nothing runs it here: the Pending of a dead worker).
"""

from __future__ import annotations

import pytest

from lifecycle.deletion import executor
from lifecycle.models import ConversationState, DeleteOperation, Item
from tests import factories
from tests.conftest import token_client

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
ERASED_CODE = "conversation_deletion_pending"


@pytest.fixture
def story():
    """A conversation whose title, message, tool title and tool output each carry a marker."""
    markers = {k: factories.marker(k) for k in ("title", "message", "tooltitle", "output")}
    conv = factories.make_conversation(title=f"Quarterly plan {markers['title']}")
    message = factories.add_message(conv, content=f"Please look at {markers['message']}")
    # Long enough that the transcript shows it cut, with a link to the full output.
    stdout = markers["output"] + "\n" + "line of output\n" * 2000
    tool = factories.add_tool(conv, title=f"Build {markers['tooltitle']}", payload={
        "command": "make", "cwd": "/w", "exit_code": 0, "stdout": stdout, "stderr": ""})
    return conv, message, tool, markers


def _api_reads(conv, message, tool) -> dict[str, str]:
    base = f"/v1/threads/{conv.public_id}"
    return {
        "items": f"{base}/items",
        "message": f"{base}/items/{message.pk}",
        "tool": f"{base}/items/{tool.pk}",
        "output": f"{base}/items/{tool.pk}/output",
        "message_output": f"{base}/items/{message.pk}/output",
    }


def _lists(conv) -> list[str]:
    return ["/v1/threads", "/v1/threads?view=all", "/v1/threads?view=pending_delete",
            "/v1/threads?view=deleted", f"/v1/threads/{conv.public_id}"]


def _pages(conv) -> dict[str, str]:
    return {
        "detail": f"/conversations/{conv.public_id}/",
        "list_pending": "/conversations/?view=pending_delete",
        "list_deleted": "/conversations/?view=deleted",
        "delete_page": f"/conversations/{conv.public_id}/delete/",
        "operations": "/operations/",
    }


def _no_marker(response, markers: dict[str, str], what: str) -> None:
    body = response.content.decode()
    for name, value in markers.items():
        assert value not in body, f"{what} serves the {name}"


def _delete(conv, admin_user) -> DeleteOperation:
    response = token_client(admin_user).delete(f"/v1/threads/{conv.public_id}", HTTP_IDEMPOTENCY_KEY="del-reads")
    assert response.status_code == 202, response.content
    op = DeleteOperation.objects.get(public_id=response.json()["id"])
    assert op.state == "pending"
    return op


def test_the_same_reads_serve_the_content_before_a_delete(story, admin_user, member_user, member_client):
    conv, message, tool, markers = story
    for client in (token_client(member_user), token_client(admin_user)):
        reads = _api_reads(conv, message, tool)
        items = client.get(reads["items"])
        assert items.status_code == 200
        assert markers["message"] in items.content.decode() and markers["output"] in items.content.decode()
        assert markers["message"] in client.get(reads["message"]).json()["content"]
        assert client.get(reads["tool"]).json()["title"] == f"Build {markers['tooltitle']}"
        output = client.get(reads["output"])
        assert output.status_code == 200 and output.json()["output"].startswith(markers["output"])
        assert client.get(f"/v1/threads/{conv.public_id}").json()["title"] == f"Quarterly plan {markers['title']}"
        found = client.get("/v1/threads", {"q": markers["title"][-20:]}).json()["results"]
        assert [t["id"] for t in found] == [conv.public_id]
    page = member_client.get(f"/conversations/{conv.public_id}/items/{tool.pk}/output/", **HOST)
    assert page.status_code == 200 and markers["output"] in page.content.decode()
    detail = member_client.get(f"/conversations/{conv.public_id}/", **HOST).content.decode()
    assert markers["message"] in detail and markers["title"] in detail


@pytest.mark.parametrize("finished", [False, True], ids=["pending", "completed"])
def test_no_read_serves_the_content_once_the_delete_is_requested(
        story, admin_user, member_user, admin_client, member_client, finished):
    conv, message, tool, markers = story
    op = _delete(conv, admin_user)
    if finished:
        executor.run_erasure(op.pk)
        op.refresh_from_db()
        assert op.state == "completed"
    else:
        # Pending, the rows all there: what the reads must not serve.
        assert Item.objects.filter(conversation=conv).count() == 2
    conv.refresh_from_db()
    state = ConversationState.DELETED if finished else ConversationState.PENDING_DELETE
    assert conv.state == state
    words = "was deleted" if finished else "is being deleted"

    for who, client in (("member", token_client(member_user)), ("admin", token_client(admin_user))):
        for name, url in _api_reads(conv, message, tool).items():
            response = client.get(url)
            assert response.status_code == 410, (who, name, response.content)
            assert response.json()["code"] == ERASED_CODE, (who, name)
            assert words in response.json()["message"]
            _no_marker(response, markers, f"{who} {name}")
        # The thread document and the lists stay readable: state and operation, no title.
        for url in _lists(conv):
            response = client.get(url)
            assert response.status_code == 200, (who, url)
            _no_marker(response, markers, f"{who} {url}")
        document = client.get(f"/v1/threads/{conv.public_id}").json()
        assert (document["state"], document["title"]) == (state, "")
        assert client.get(f"/v1/operations/{op.public_id}").json()["state"] == op.state
        # The title is not searched any more; the thread id still finds it.
        assert client.get("/v1/threads", {"q": markers["title"][-20:], "view": "all"}).json()["results"] == []
        found = client.get("/v1/threads", {"q": conv.thread_id, "view": "all"}).json()["results"]
        assert [t["id"] for t in found] == [conv.public_id]

    spanish = token_client(member_user).get(_api_reads(conv, message, tool)["items"], HTTP_ACCEPT_LANGUAGE="es")
    assert spanish.json()["code"] == ERASED_CODE and "conversación" in spanish.json()["message"]

    for who, client in (("member", member_client), ("admin", admin_client)):
        output = client.get(f"/conversations/{conv.public_id}/items/{tool.pk}/output/", **HOST)
        assert output.status_code == 410, who
        assert ("was deleted" if finished else "is being erased") in output.content.decode()
        _no_marker(output, markers, f"{who} output page")
        # From a transcript left open: the answer takes the row's place, with no content.
        swapped = client.get(f"/conversations/{conv.public_id}/items/{tool.pk}/output/", HTTP_HX_REQUEST="true",
                             **HOST)
        assert swapped.status_code == 410 and swapped["HX-Retarget"] == f"#item-{tool.pk}"
        _no_marker(swapped, markers, f"{who} output row")
        # Any item of it, even one that is not a tool call or not there: the same answer.
        assert client.get(f"/conversations/{conv.public_id}/items/{message.pk}/output/", **HOST).status_code == 410
        for name, url in _pages(conv).items():
            response = client.get(url, **HOST)
            assert response.status_code == 200, (who, name)
            _no_marker(response, markers, f"{who} {name}")
        assert conv.thread_id in client.get(f"/conversations/?view={'deleted' if finished else 'pending_delete'}",
                                            **HOST).content.decode()
        assert conv.thread_id not in client.get("/conversations/?view=pending_delete&q="
                                                + markers["title"][-20:], **HOST).content.decode()


def test_a_web_page_of_another_live_conversation_still_serves_its_output(story, admin_user, member_client):
    conv, _message, tool, markers = story
    other = factories.make_conversation(title="Other")
    kept = factories.add_tool(other, payload={"command": "ls", "cwd": "/", "exit_code": 0,
                                              "stdout": markers["output"] + "-other", "stderr": ""})
    _delete(conv, admin_user)
    response = member_client.get(f"/conversations/{other.public_id}/items/{kept.pk}/output/", **HOST)
    assert response.status_code == 200 and markers["output"] + "-other" in response.content.decode()
    assert token_client(admin_user).get(f"/v1/threads/{other.public_id}/items").status_code == 200


def test_the_api_document_lists_the_refusal_of_every_content_read(client):
    paths = client.get("/v1/openapi.json", **HOST).json()["paths"]
    for path in ("/v1/threads/{public_id}/items", "/v1/threads/{public_id}/items/{item_id}",
                 "/v1/threads/{public_id}/items/{item_id}/output"):
        get = paths[path]["get"]
        assert "410" in get["responses"], path
        assert ERASED_CODE in get["description"], path
    title = client.get("/v1/openapi.json", **HOST).json()["components"]["schemas"]["ThreadOut"]["properties"]["title"]
    assert "delete" in title["description"]
