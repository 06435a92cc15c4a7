"""Switching the interface to Spanish and back: the sidebar on desktop, the page footer on phones."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS
from e2e.helpers import check_layout, log_in
from lifecycle.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


def language_select(page: Page, viewport: str):
    sidebar = page.locator(".sidenav select[name=language]")
    footer = page.locator(".page-foot select[name=language]")
    if viewport == "desktop":
        expect(footer).to_be_hidden()
        return sidebar
    expect(sidebar).to_be_hidden()  # no sidebar on phones: the switch lives in the footer
    return footer


@ALL_VIEWPORTS
def test_it_switches_the_language_to_spanish_and_back(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    html = page.locator("html")
    expect(html).to_have_attribute("lang", "en")

    select = language_select(page, viewport)
    expect(select).to_be_visible()
    expect(select).to_have_value("en")
    select.select_option("es")

    expect(html).to_have_attribute("lang", "es")
    expect(page).to_have_url(f"{live_server.url}/conversations/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Conversaciones")
    expect(page.locator(".conv")).to_have_count(20)  # same list, other words
    expect(language_select(page, viewport)).to_have_value("es")
    check_layout(page)  # Spanish copy is longer; it must still fit

    # The choice sticks for the next page.
    page.locator(".conv-link").first.click()
    expect(page).to_have_url(re.compile(r"/conversations/c_[0-9a-f]+/$"))
    page.wait_for_load_state("load")  # the select submits through the page's script (deferred)
    expect(html).to_have_attribute("lang", "es")

    language_select(page, viewport).select_option("en")

    expect(html).to_have_attribute("lang", "en")
    expect(page.get_by_role("heading", level=2, name="Transcript")).to_be_visible()
    page.goto(f"{live_server.url}/conversations/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Conversations")


def test_a_keyboard_user_keeps_the_focus_on_the_switch_after_the_page_reloads(seeded, live_server, open_page):
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    select = language_select(page, "desktop")
    select.focus()
    page.keyboard.press("ArrowDown")  # by keyboard the choice waits for Enter
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.keyboard.press("Enter")
    expect(page.locator("html")).to_have_attribute("lang", "es")
    expect(language_select(page, "desktop")).to_be_focused()
    page.reload()  # only once: a later load starts at the top as usual
    expect(language_select(page, "desktop")).not_to_be_focused()


@pytest.mark.parametrize("switch", ["language", "timezone"])
@pytest.mark.parametrize("after", ["search", "tab"])
@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_the_switches_keep_the_list_the_address_names(seeded, live_server, open_page, viewport, after, switch):
    """The list's search and tabs change the address in place (htmx); switching the language
    or the time zone afterwards comes back to that list, not to the page as first served."""
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    if after == "search":
        query = "draft"
        page.get_by_label("Search").press_sequentially(query)
        expect(page).to_have_url(re.compile(r"[?&]q=draft(&|$)"))
        named = Conversation.objects.recent().search(query)
    else:
        page.locator("label.tab", has_text="Archived").click()
        expect(page).to_have_url(re.compile(r"[?&]view=archived(&|$)"))
        named = Conversation.objects.archived()
    assert 0 < named.count() < Conversation.objects.count()
    titles = [c.title for c in named.order_by("-last_activity_at", "-pk")]
    expect(page.locator("#results .conv-title")).to_have_text(titles)
    address = page.url

    where = ".sidenav" if viewport == "desktop" else ".page-foot"
    # The switch loads the page again: the checks below read the new one (the select's own value
    # and the load state held on the old page, so they could pass before it came, r61).
    with page.expect_navigation(wait_until="load"):
        if switch == "language":
            page.locator(f"{where} select[name=language]").select_option("es")
        else:
            page.locator(f"{where} select[name=timezone]").select_option("Europe/Madrid")
    if switch == "language":
        expect(page.locator("html")).to_have_attribute("lang", "es")
    else:
        expect(page.locator(f"{where} select[name=timezone]")).to_have_value("Europe/Madrid")

    expect(page).to_have_url(address)
    expect(page.locator("#results .conv-title")).to_have_text(titles)
    if after == "search":
        expect(page.locator("#q")).to_have_value("draft")
    else:
        expect(page.locator("label.tab.is-current input")).to_have_value("archived")
