"""The back button: htmx keeps no copy of pages (historyCacheSize 0), so Back asks the server for
the whole page as it is now (not the list fragment on its own, not a copy from before an
archive or a delete)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from e2e.conftest import MEMBER
from e2e.helpers import check_layout, log_in, settle
from lifecycle.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)
SEARCHES = ["review", "refactor", "draft", "payment", "index", "deploy", "flaky", "plan", "cache", "login",
            "schema", "adapter"]


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_going_back_after_many_searches_restores_whole_pages(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *MEMBER)
    misses = []
    page.on("request", lambda r: misses.append(r.url) if r.headers.get("hx-history-restore-request") else None)
    assert page.evaluate("htmx.config.historyCacheSize") == 0
    search = page.get_by_label("Search")
    for word in SEARCHES:  # more searches than the cache holds
        search.fill(word)
        search.press("Enter")
        expect(page).to_have_url(re.compile(rf"q={word}$"))
        expect(page.locator("#results .count")).to_have_text(re.compile(r"^\d+ conversations?$"))

    for word in [*reversed(SEARCHES[:-1]), ""]:
        page.go_back()
        expect(page).to_have_url(re.compile(rf"/conversations/(\?.*q={word})?$" if word else r"/conversations/$"))
        expected = Conversation.objects.recent().search(word).count()
        noun = "conversation" if expected == 1 else "conversations"
        # A whole page: one heading, the navigation, the filters and one list.
        expect(page.get_by_role("heading", level=1)).to_have_text("Conversations")
        expect(page.locator("h1")).to_have_count(1)
        expect(page.locator("form.filters")).to_have_count(1)
        expect(page.locator("#results")).to_have_count(1)
        expect(page.locator("#results .count")).to_have_text(f"{expected} {noun}")
        expect(page.get_by_label("Search")).to_have_value(word)  # the box says which list this is
        expect(page.locator(".topbar")).to_have_count(1)

    # No page was cached, so the server was asked for each one.
    assert len(misses) == len(SEARCHES), misses
    assert page.evaluate("window.localStorage.getItem('htmx-history-cache')") is None
    check_layout(page)
    # And the restored page still works in place.
    page.locator("label.tab", has_text="Archived").click()
    expect(page.locator("#results .count")).to_have_text(f"{Conversation.objects.archived().count()} conversations")


@pytest.mark.parametrize("viewport", ["phone"], ids=["390"])
def test_back_after_an_archive_shows_the_list_as_it_is_now(seeded, live_server, open_page, viewport):
    from e2e.conftest import ADMIN

    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    count = page.locator("#results .count")
    before = Conversation.objects.recent().count()
    expect(count).to_have_text(f"{before} conversations")
    page.locator("label.tab", has_text="Closed").click()
    expect(page).to_have_url(re.compile(r"view=closed"))
    page.locator("label.tab", has_text="Recent").click()
    expect(page).to_have_url(re.compile(r"view=recent"))
    first = page.locator("#results li.conv").first
    thread = first.locator("code.tid").inner_text()
    first.get_by_role("button", name=re.compile(r"^Archive")).click()
    expect(count).to_have_text(f"{before - 1} conversations")
    for _ in range(3):
        page.go_back()
    expect(page).to_have_url(re.compile(r"/conversations/$"))
    expect(count).to_have_text(f"{before - 1} conversations")  # not the list from before the archive
    assert Conversation.objects.recent().count() == before - 1
    expect(page.locator("#results code.tid", has_text=thread)).to_have_count(0)
    check_layout(page)


def test_two_quick_backs_end_on_the_page_the_address_names(seeded, live_server, open_page):
    """Each Back asks the server for its page; the answer for an earlier Back that comes last
    is dropped, not swapped in over the page the address names (the CI run of 2026-12-07)."""
    page = open_page("desktop")
    log_in(page, live_server.url, *MEMBER)
    count = page.locator("#results .count")
    recent = Conversation.objects.recent().count()
    closed = Conversation.objects.closed().count()
    assert recent != closed
    page.locator("label.tab", has_text="Closed").click()
    expect(page).to_have_url(re.compile(r"view=closed"))
    page.locator("label.tab", has_text="Archived").click()
    expect(page).to_have_url(re.compile(r"view=archived"))

    held, failed = [], []
    page.route(re.compile(r"view=closed"),
               lambda route: held.append(route) if route.request.headers.get("hx-history-restore-request")
               else route.continue_())
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.go_back()  # to the closed tab: its answer is held back
    expect(page).to_have_url(re.compile(r"view=closed"))
    settle(page, lambda: held)
    assert len(held) == 1
    page.go_back()  # to the first page, whose answer comes at once
    expect(page).to_have_url(re.compile(r"/conversations/$"))
    expect(count).to_have_text(f"{recent} conversations")
    # The closed tab's request was given up when the second Back started.
    settle(page, lambda: [url for url in failed if "view=closed" in url])
    assert [url for url in failed if "view=closed" in url], failed
    held[0].continue_()  # were it still wanted, its answer would land now
    page.unroute(re.compile(r"view=closed"))
    page.locator("label.tab", has_text="Archived").click()  # a later request answers after any earlier one
    expect(count).to_have_text(f"{Conversation.objects.archived().count()} conversations")
    page.go_back()
    expect(page).to_have_url(re.compile(r"/conversations/$"))
    expect(count).to_have_text(f"{recent} conversations")
    expect(page.locator("label.tab", has_text="Recent").locator("input")).to_be_checked()
