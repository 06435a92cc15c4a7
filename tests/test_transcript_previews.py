"""A tool row shows previews of everything it shows of a call (summary values, text, output),
cut between whole characters, marked as shortened, with the whole call one link away: a
transcript page stays small whatever a runtime sends."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from lifecycle.models import Item
from lifecycle.transcript import PREVIEW_CHARS, SUMMARY_CHARS, item_rows, preview
from retention.reducer import reduce_item_row
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}
HUGE = "echo " + "x" * 2_000_000
# Three rows of previews, the page around them, and room to spare: far below one input.
PAGE_BOUND = 60_000


def append_shell(api, conversation, n: int, **fields) -> Item:
    body = {"role": "tool", "tool_kind": "shell", "tool_call_id": f"call_{n}", "status": "completed",
            "payload": {"command": HUGE, "cwd": "/w", "exit_code": 0, "stdout": "ok"}, **fields}
    response = api.post(f"/v1/threads/{conversation.public_id}/items", data=json.dumps(body),
                        content_type="application/json")
    assert response.status_code == 201, response.content[:300]
    return Item.objects.get(pk=response.json()["id"])


def test_it_shows_huge_tool_inputs_as_marked_previews_with_the_whole_call_one_link_away(
        api, member_client, conversation):
    items = [append_shell(api, conversation, n) for n in range(3)]
    assert Item.objects.get(pk=items[0].pk).payload["command"] == HUGE  # stored whole
    url = f"/conversations/{conversation.public_id}/"
    response = member_client.get(url, **HOST)
    assert response.status_code == 200
    assert len(response.content) < PAGE_BOUND, len(response.content)
    html = response.content.decode()
    for item in items:
        row = html[html.index(f'id="item-{item.pk}"'):]
        row = row[:row.index("</article>")]
        shown = "echo " + "x" * (SUMMARY_CHARS - 5)
        assert f"<code><bdi>{shown}</bdi>…</code>" in row
        assert '<span class="cut-note">(shortened)</span>' in row
        whole = f"/conversations/{conversation.public_id}/items/{item.pk}/output/"
        assert f'href="{whole}">Show the whole tool call</a>' in row
        page = member_client.get(whole, **HOST)
        assert page.status_code == 200 and f"<bdi>{HUGE}</bdi>" in page.content.decode()
    spanish = member_client.get(url, HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert len(spanish.content) < PAGE_BOUND


def test_every_kinds_summary_values_and_the_calls_text_are_previews(member_client, conversation):
    big = "y" * 500_000
    payloads = {
        "read_file": {"path": "/" + big, "line_count": 3, "content": "z"},
        "edit_file": {"changes": [{"path": f"src/{n}-{big[:1000]}.py", "diff": "-a\n+b"} for n in range(400)]},
        "search": {"query": big, "scope": big, "file_count": 1, "matches": ["a.py"]},
        "http": {"url": "https://example.test/" + big, "method": "GET", "status": 200, "response": "fine"},
        "generic": {"tool_name": big, "output": "clean"},
    }
    items = [factories.add_tool(conversation, kind, payload, title=f"{kind} call", tool_call_id=f"call_{kind}")
             for kind, payload in payloads.items()]
    texted = factories.add_tool(conversation, "shell", {"command": "ls", "stdout": ""}, tool_call_id="call_text",
                                content="w" * 200_000)
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    assert len(response.content) < PAGE_BOUND, len(response.content)
    html = response.content.decode()
    assert html.count("(shortened)") == 7  # path, files, query, scope, URL, tool name, the text
    assert html.count(">Show the whole tool call</a>") == 6
    assert "w" * PREVIEW_CHARS + '</bdi>… <span class="cut-note">(shortened)</span>' in html
    assert "w" * (PREVIEW_CHARS + 1) not in html
    for item in (*items, texted):
        row = item_rows([item], full=True)[0]
        page = member_client.get(f"/conversations/{conversation.public_id}/items/{item.pk}/output/", **HOST)
        whole = page.content.decode()
        assert all(f"<bdi>{value}</bdi>" in whole for _label, value, _cut in row.summary)
    assert "w" * 200_000 in whole


def test_a_removed_rows_kept_summary_is_a_preview_and_whole_on_its_410_page(api, member_client, conversation):
    item = append_shell(api, conversation, 1, payload={"command": HUGE, "cwd": "/w", "exit_code": 0,
                                                       "stdout": "removable output " * 200})
    removed = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
    assert Item.objects.filter(pk=item.pk).update(**reduce_item_row(item, removed_at=removed)) == 1
    assert Item.objects.get(pk=item.pk).payload["command"] == HUGE  # the summary is kept
    response = member_client.get(f"/conversations/{conversation.public_id}/", **HOST)
    assert len(response.content) < PAGE_BOUND, len(response.content)
    html = response.content.decode()
    assert "Tool details removed on Jan. 15, 2026" in html and "(shortened)" in html
    whole = f"/conversations/{conversation.public_id}/items/{item.pk}/output/"
    assert f'href="{whole}">Show the whole tool call</a>' in html
    page = member_client.get(whole, **HOST)
    assert page.status_code == 410
    assert f"<bdi>{HUGE}</bdi>" in page.content.decode() and "Tool details removed on" in page.content.decode()
    # A transcript opened before the removal asks for the output: the row it gets in place is a transcript row.
    swapped = member_client.get(whole, **HX)
    assert swapped.status_code == 410 and len(swapped.content) < 10_000
    assert "(shortened)" in swapped.content.decode() and "Show the whole tool call" in swapped.content.decode()


@pytest.mark.parametrize("cluster", [
    "e\u0301",  # é written e + combining acute
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",  # family: man, woman, girl, boy
    "\U0001F44D\U0001F3FD",  # thumbs up, medium skin tone
    "\u2764\uFE0F",  # heart, emoji presentation
    "\U0001F1EA\U0001F1F8",  # the flag of Spain: two regional indicators
], ids=["e-acute", "family", "skin-tone", "variation-selector", "flag"])
def test_a_preview_keeps_a_cluster_cut_at_the_limit_whole(cluster):
    for offset in range(1, len(cluster)):  # the limit falls inside the cluster, at each place
        text = "a" * (20 - offset) + cluster + "b" * 50
        shown, cut = preview(text, 20)
        assert cut and shown == "a" * (20 - offset), (offset, shown)
    shown, cut = preview("a" * 20 + cluster + "b", 20 + len(cluster))
    assert cut and shown == "a" * 20 + cluster  # whole when it fits
    assert preview("\U0001F1EA\U0001F1F8" * 10 + "b", 5) == ("\U0001F1EA\U0001F1F8" * 2, True)


def test_a_preview_of_text_within_the_limit_is_the_text():
    assert preview("", 5) == ("", False)
    assert preview("e\u0301" * 3, 6) == ("e\u0301" * 3, False)
    assert preview("x" * 6, 5) == ("x" * 5, True)
    # Nothing whole fits (a letter with more marks than the preview): cut where the limit falls.
    assert preview("e" + "\u0301" * 10, 5) == ("e" + "\u0301" * 4, True)


def test_the_output_preview_keeps_a_cluster_whole(member_client, conversation):
    family = "\U0001F468\u200D\U0001F469\u200D\U0001F467"
    item = factories.add_tool(conversation, "generic", {"tool_name": "t", "output": "o" * (PREVIEW_CHARS - 2) + family * 5})
    row = item_rows([item])[0]
    assert row.truncated and row.output == "o" * (PREVIEW_CHARS - 2)
    html = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert "o" * (PREVIEW_CHARS - 2) + "</bdi>…</pre>" in html


def test_direction_overrides_in_a_calls_text_and_output_are_written_out_and_isolated(member_client, conversation):
    """A right-to-left override in a tool call's text or output reordered what followed it on
    the page ("(shortened)" read "(denetrohs)"), on the call's page too (r97): written out as
    [U+202E] like a title's, each value isolated, the sign outside it."""
    text = "\u202eContent that is reversed " + "c" * 700
    item = factories.add_tool(conversation, "shell", {"command": "ls", "cwd": "/w", "exit_code": 0,
                                                      "stdout": "\u202eoutput reversed", "stderr": "",
                                                      "truncated": False}, content=text)
    factories.add_message(conversation, "user", "\u202ehello")
    page = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    whole = member_client.get(f"/conversations/{conversation.public_id}/items/{item.pk}/output/",
                              **HOST).content.decode()
    for shown in (page, whole):
        assert "\u202e" not in shown
        assert "<bdi>[U+202E]Content that is reversed" in shown and "<bdi>[U+202E]output reversed</bdi>" in shown
    assert "</bdi>… <span class=\"cut-note\">(shortened)</span>" in page
    assert "<bdi>[U+202E]hello</bdi>" in page  # a message's text the same way
