"""Every page at every screen size: fits the width, one scroller, touch-sized controls on
phones, nothing hidden under the save bar; and a screenshot of each into e2e/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS
from e2e.helpers import (
    assert_save_bar_covers_nothing,
    check_layout,
    conversation_with_long_output,
    log_in,
    open_from_list,
    open_nav,
    screenshot,
)

pytestmark = pytest.mark.django_db(transaction=True)


@ALL_VIEWPORTS
def test_it_fits_every_page_on_the_screen(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    base = live_server.url

    page.goto(f"{base}/accounts/login/")
    expect(page.get_by_role("heading", name="Sign in to Lethe")).to_be_visible()
    check_layout(page, "login")
    screenshot(page, "login")

    log_in(page, base, *ADMIN)
    expect(page.locator("#results .conv")).to_have_count(20)
    check_layout(page, "conversation list")
    screenshot(page, "conversations")

    conversation, tool_item = conversation_with_long_output()
    open_from_list(page, conversation)
    expect(page.locator("section.transcript .msg").first).to_be_visible()
    check_layout(page, "conversation")
    screenshot(page, "conversation")
    row = page.locator(f"#item-{tool_item.pk}")
    row.get_by_role("link", name="Show full output").click()
    expect(row.get_by_role("link", name="Show full output")).to_have_count(0)
    check_layout(page, "conversation with a full tool output")

    open_nav(page, "Data & storage")
    expect(page.get_by_role("heading", name="Retained facts")).to_be_visible()
    check_layout(page, "data & storage")
    screenshot(page, "data-storage")

    page.get_by_label("Billing facts, days").fill("3000")
    expect(page.locator("#save-bar")).to_be_visible()
    check_layout(page, "data & storage with unsaved changes")
    assert_save_bar_covers_nothing(page)
    screenshot(page, "data-storage-unsaved", full_page=False)  # the bottom of the page, bar and all
