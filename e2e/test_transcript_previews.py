"""A tool call with huge inputs reads as a short row on a 320 px phone: its values shortened and
said to be, the page not scrolling sideways, and the whole call one tap away."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from e2e.conftest import MEMBER
from e2e.helpers import check_layout, log_in
from lifecycle.transcript import PREVIEW_CHARS, SUMMARY_CHARS
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_row_with_huge_inputs_shows_them_shortened_at_320_px(seeded, live_server, open_page):
    conversation = factories.make_conversation(title="Huge inputs")
    factories.add_message(conversation, content="Print a long line")
    command = "echo " + "x" * 20_000  # one unbroken word, far longer than the phone is wide
    item = factories.add_tool(conversation, "shell", {"command": command, "cwd": "/w", "exit_code": 0, "stdout": "ok"},
                              title="Echo", content="n" * 5_000)
    page = open_page("small-phone")
    log_in(page, live_server.url, *MEMBER)
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/")

    row = page.locator(f"#item-{item.pk}")
    expect(row).to_be_visible()
    shown = row.locator(".summary dd").first
    expect(shown.locator("code")).to_have_text(command[:SUMMARY_CHARS] + "…")
    expect(shown.locator(".cut-note")).to_have_text("(shortened)")
    expect(row.locator(".msg-text")).to_have_text("n" * PREVIEW_CHARS + "… (shortened)")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 320
    assert row.evaluate("el => el.getBoundingClientRect().right") <= 320
    check_layout(page, "huge tool inputs at 320")

    row.get_by_role("link", name="Show the whole tool call").click()
    expect(page).to_have_url(f"{live_server.url}/conversations/{conversation.public_id}/items/{item.pk}/output/")
    expect(page.locator(".summary code").first).to_have_text(command)
    expect(page.locator(".msg-text")).to_have_text("n" * 5_000)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 320
    check_layout(page, "the whole tool call at 320")
