"""One conversation: the transcript with its tool rows, and full tool output on demand."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import (
    check_layout,
    conversation_with_long_output,
    log_in,
    open_from_list,
    reduce_tool_item,
)
from lifecycle.models import Role
from lifecycle.transcript import item_rows

pytestmark = pytest.mark.django_db(transaction=True)


@ALL_VIEWPORTS
def test_it_shows_the_transcript_with_tool_rows(seeded, live_server, open_page, viewport):
    conversation, tool_item = conversation_with_long_output()
    items = list(conversation.items.order_by("seq"))
    page = open_page(viewport)
    log_in(page, live_server.url, *MEMBER)

    open_from_list(page, conversation)

    transcript = page.locator("section.transcript")
    for role, css in [(Role.USER, ".msg-user"), (Role.ASSISTANT, ".msg-assistant"), (Role.TOOL, ".msg-tool")]:
        expected = sum(1 for i in items if i.role == role)
        assert expected > 0
        expect(transcript.locator(css)).to_have_count(expected)
    first_user = next(i for i in items if i.role == Role.USER)
    user_row = transcript.locator(f"#item-{first_user.pk}")
    expect(user_row.locator(".role")).to_have_text("User")
    expect(user_row.locator(".msg-text")).to_contain_text(first_user.content[:40])
    first_assistant = next(i for i in items if i.role == Role.ASSISTANT)
    expect(transcript.locator(f"#item-{first_assistant.pk} .role")).to_have_text("Assistant")

    tool_row = transcript.locator(f"#item-{tool_item.pk}")
    expect(tool_row.locator(".tool-kind")).to_have_text(tool_item.get_tool_kind_display())
    expect(tool_row.locator(".tool-title")).to_have_text(tool_item.title)
    expect(tool_row.locator(".status")).to_have_text(tool_item.get_status_display())
    # Every tool row names its kind.
    for pk, label in [(i.pk, i.get_tool_kind_display()) for i in items if i.role == Role.TOOL]:
        expect(transcript.locator(f"#item-{pk} .tool-kind")).to_have_text(label)

    facts = page.locator(".status-card")
    expect(facts).to_contain_text(conversation.thread_id)
    expect(facts).to_contain_text(conversation.owner.name)


@ALL_VIEWPORTS
def test_it_loads_the_full_tool_output_in_place(seeded, live_server, open_page, viewport):
    conversation, tool_item = conversation_with_long_output()
    full = item_rows([tool_item], full=True)[0].output
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_from_list(page, conversation)
    detail_url = page.url

    row = page.locator(f"#item-{tool_item.pk}")
    output = row.locator(".output pre")
    preview = output.inner_text()
    assert preview.endswith("…")
    button = row.get_by_role("link", name=re.compile(r"^Show full output \(.+\)$"))
    expect(button).to_be_visible()

    button.click()

    expect(button).to_have_count(0)
    expect(output).not_to_have_text(preview)
    shown = output.inner_text()
    assert len(shown) > len(preview)
    assert shown.strip() == full.strip()
    assert page.url == detail_url  # loaded in place, no navigation
    check_layout(page)  # a long output still wraps inside the screen


@ALL_VIEWPORTS
def test_a_full_output_removed_since_the_page_was_shown_turns_the_row_into_its_removed_row(
        seeded, live_server, open_page, viewport):
    """The cleanup removed the details after the transcript was shown: "Show full output"
    answers 410 with the row as it now reads ("Tool details removed on <date>", the kept
    summary), swapped in place of the stale preview, and the focus goes to that row; the row
    in the database is the reduced one, and nothing else on the page moves."""
    page, conversation, tool_item, row, button = shown_with_output_button(open_page, live_server, viewport)
    reduced = reduce_tool_item(tool_item)  # the cleanup, after the page was shown
    assert reduced.details_removed_at is not None and reduced.removable_bytes == 0
    with page.expect_response(lambda r: f"/items/{tool_item.pk}/output/" in r.url) as answered:
        button.focus()
        page.keyboard.press("Enter")
    assert answered.value.status == 410
    expect(row.get_by_test_id("details-removed")).to_contain_text("Tool details removed on")
    expect(row.locator(".output")).to_have_count(0)
    expect(button).to_have_count(0)
    expect(page.locator(f"#item-{tool_item.pk}")).to_have_count(1)  # replaced, not nested
    expect(page.locator(f"#item-{tool_item.pk}")).to_be_focused()
    check_layout(page)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_a_full_output_asked_for_after_the_delete_began_gives_the_focus_to_the_notice(
        seeded, live_server, open_page, viewport):
    """The transcript was shown, then a delete was requested: "Show full output" answers 410 and
    a notice that the content is being erased takes the row's place; the focus went to <body>
    (a keyboard or screen-reader user lost their place), it goes to the notice now."""
    from lifecycle.actions.request_deletion import request_deletion

    page, conversation, tool_item, _row, button = shown_with_output_button(open_page, live_server, viewport,
                                                                            deletable=True)
    assert request_deletion(conversation, key="output-after-delete", acting_user=None).state == "pending"
    with page.expect_response(lambda r: f"/items/{tool_item.pk}/output/" in r.url) as answered:
        button.focus()
        page.keyboard.press("Enter")
    assert answered.value.status == 410
    notice = page.locator(f"#item-{tool_item.pk}")
    expect(notice).to_contain_text("This conversation is being deleted")
    expect(notice).to_be_focused()
    check_layout(page)


def shown_with_output_button(open_page, live_server, viewport, *, deletable: bool = False):
    """An admin's page showing a conversation with a cut-short tool output (`deletable`: one a
    delete would admit), opened from the list: (page, conversation, item, its row, its "Show
    full output" link, visible)."""
    conversation, tool_item = conversation_with_long_output(deletable=deletable)
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_from_list(page, conversation)
    row = page.locator(f"#item-{tool_item.pk}")
    button = row.get_by_role("link", name=re.compile(r"^Show full output \(.+\)$"))
    expect(button).to_be_visible()
    return page, conversation, tool_item, row, button
